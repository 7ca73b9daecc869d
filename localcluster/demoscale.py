"""`make demo-scale`: a 1000-worker GangJob on the local `sim` cluster with agents, a worker
killed, the gang restarted in place, and what to look at afterwards.

It starts the cluster `demo-scale` (`localcluster up --profile sim --agents --nodes 5`: KWOK
nodes, and the `sim-agents` component running the real agent for every pod), installs the CRD,
runs the controller as a process of the cluster (its arrival endpoint on loopback, where the
agents are), applies manifests/samples/sim-scale.yaml, waits for every worker to arrive at
epoch 0, kills rank 17's trainer (`localcluster kill-worker`), and follows the restart to the
barrier of epoch 1 with `kubectl get gj`'s columns. No root needed; a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from localcluster.cluster import Cluster, Options
from localcluster.procs import free_port
from localcluster.simagents import kill_worker
from localcluster.tools import REPO, controller_kubeconfig, install_crd, kubectl

SAMPLE = REPO / "manifests" / "samples" / "sim-scale.yaml"
JOB = "scale"
NAMESPACE = "default"
VICTIM = 17
OPTIONS = Options(profile="sim", nodes=5, agents=True)
"""5 KWOK nodes of 250 pods: 1000 workers fit."""
CONTROLLER = "gangjob-controller"


def say(msg: str = "") -> None:
    print(msg, flush=True)


def banner(msg: str) -> None:
    say(f"\n== {msg}")


class Demo:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.t0 = time.monotonic()

    # The demo's own looks go straight to the apiserver: a kubectl process per look would
    # take a share of the 2 cores the gang's start and restart need.
    def job(self) -> dict[str, Any]:
        job: dict[str, Any] = self.cluster.api(
            "GET", f"/apis/gangjob.io/v1alpha1/namespaces/{NAMESPACE}/gangjobs/{JOB}"
        )
        return job

    def pods(self) -> dict[str, str]:
        """Pod name -> UID, of the gang's pods."""
        path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=gangjob.io%2Fname%3D{JOB}"
        items = self.cluster.api("GET", path, timeout=120)["items"]
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in items}

    def row(self, job: dict[str, Any]) -> str:
        st = job.get("status", {})
        workers = st.get("workers", {})
        return (
            f"  {time.monotonic() - self.t0:6.1f}s  {st.get('phase', ''):<11} "
            f"epoch {st.get('epoch', '-'):<3} barrier {st.get('barrierEpoch', '-'):<3} "
            f"arrived {workers.get('arrived', 0):>4}/{job['spec']['replicas']}  "
            f"ready {workers.get('ready', 0):>4}  restarts {st.get('restarts', {}).get('total', 0)}"
        )

    def setup(self) -> None:
        banner(f"the local cluster `{self.cluster.name}`: control plane, 5 KWOK nodes, sim-agents")
        if self.cluster.is_up() and not self.cluster.load().get("options", {}).get("agents"):
            say(f"  `{self.cluster.name}` is up without --agents: starting it anew")
            self.cluster.down(sys.stdout)
        self.cluster.up(OPTIONS, sys.stdout)
        banner("installing the GangJob CRD and RBAC; starting the controller")
        install_crd(self.cluster)
        kubeconfig = controller_kubeconfig(self.cluster)
        if not any(p.name == CONTROLLER and p.alive() for p in self.cluster.procs()):
            # The agents run on this host (in sim-agents): the arrival endpoint on loopback.
            arrivals = f"127.0.0.1:{free_port()}"
            self.cluster.launch(
                CONTROLLER,
                [
                    sys.executable, "-m", "controller.main", f"--kubeconfig={kubeconfig}",
                    "--log-format=text", "--metrics-bind-address=127.0.0.1:0",
                    "--health-probe-bind-address=127.0.0.1:0",
                    f"--arrival-bind-address={arrivals}", f"--arrival-url=http://{arrivals}",
                ],
            )  # fmt: skip
        say(f"  controller log: {self.cluster.logs / f'{CONTROLLER}.log'}")
        say(f"  agents' log:    {self.cluster.logs / 'sim-agents.log'}")

    def submit(self) -> None:
        banner(f"kubectl apply -f {SAMPLE.relative_to(REPO)}  (1000 workers)")
        kubectl(self.cluster, "-n", NAMESPACE, "delete", "gj", JOB, "--ignore-not-found",
                "--wait=true", timeout=300)  # fmt: skip
        say("  " + kubectl(self.cluster, "apply", "-f", str(SAMPLE)).strip())
        self.t0 = time.monotonic()

    def until(
        self, epoch: int, timeout: float, every: float = 3.0, running: bool = False
    ) -> dict[str, Any]:
        """Prints the job's row every `every` seconds until every worker arrived at `epoch`
        and its barrier opened (and, with `running`, the job is Running: every pod Ready)."""
        deadline = time.monotonic() + timeout
        shown = 0.0
        while True:
            job = self.job()
            st = job.get("status", {})
            done = (
                st.get("epoch") == epoch
                and st.get("barrierEpoch") == epoch
                and st.get("workers", {}).get("arrived") == job["spec"]["replicas"]
                and (not running or st.get("phase") == "Running")
            )
            if done or time.monotonic() - shown >= every:
                say(self.row(job))
                shown = time.monotonic()
            if done:
                return job
            if time.monotonic() > deadline:
                raise RuntimeError(f"not at epoch {epoch} after {timeout:.0f}s")
            time.sleep(0.25)  # kubectl per look: no watch here to keep it simple

    def kill(self) -> None:
        banner(f"localcluster kill-worker {JOB} {VICTIM} --name {self.cluster.name}")
        done = kill_worker(self.cluster, NAMESPACE, JOB, VICTIM, code=1)
        pod = f"{done['namespace']}/{done['pod']}"
        say(f"  {pod}: its trainer exited {done['code']}: {done['what']}")
        self.t0 = time.monotonic()

    def closing(self, restart: dict[str, Any], same: int, total: int) -> None:
        name = self.cluster.name
        banner("the restart")
        say(f"  trigger: {json.dumps(restart.get('trigger'))}")
        say(f"  durationSeconds: {restart.get('durationSeconds')} (failure seen -> barrier open)")
        say(f"  pods kept: {same}/{total} with the same UID (in place, none recreated)")
        banner("look around")
        say(f"""  export KUBECONFIG={self.cluster.kubeconfig}
  .venv/bin/localcluster kubectl --name {name} -- get gj {JOB} -w       # in one terminal
  .venv/bin/localcluster kill-worker {JOB} 3 --name {name}              # in another: rank 3 fails
  .venv/bin/localcluster kill-worker {JOB} 5 --name {name} --code 3     # a code outside the rule
  .venv/bin/localcluster kubectl --name {name} -- get gj {JOB} -o yaml  # status.lastRestart
  .venv/bin/localcluster kubectl --name {name} -- get events --sort-by=.lastTimestamp | tail
  .venv/bin/localcluster status                                       # sim-agents, its pid
  tail {self.cluster.logs / "sim-agents.log"}
  tail {self.cluster.logs / f"{CONTROLLER}.log"}

Run it again: make demo-scale (reuses the cluster). Clean up (stops the cluster, the agents and
the controller): .venv/bin/localcluster down --name {name}""")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localcluster.demoscale", description=__doc__)
    p.add_argument("--name", default="demo-scale", help="the local cluster's name")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    demo = Demo(Cluster(args.name))
    demo.setup()
    demo.submit()
    banner("1000 workers start; each agent arrives at epoch 0 (kubectl get gj, every 3 s)")
    demo.until(0, 900)
    before = demo.pods()
    demo.kill()
    banner("the gang restarts in place at epoch 1")
    job = demo.until(1, 300, every=0.5)
    banner("every pod Ready again (the kubelets' status writes land after the barrier)")
    demo.until(1, 300, every=1.0, running=True)
    after = demo.pods()
    same = sum(1 for name, uid in after.items() if before.get(name) == uid)
    demo.closing(job["status"].get("lastRestart") or {}, same, len(before))
    say(f"\ndemo took {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
