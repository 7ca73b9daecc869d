"""`make demo`: a PyTorch DDP gang survives a killed worker, on a real kubelet on this machine.

Builds what is missing (Kubernetes binaries, the trainer image), starts the `node` profile as
cluster `demo` with KEP-4671 gang scheduling on, installs the CRD, RBAC and admission policy,
runs the controller (recorded with the cluster, so `localcluster down --name demo` stops it
too), submits
manifests/samples/pytorch-ddp.yaml, kills one worker's training process from the host, then
stops (SIGSTOP) one, as a wedged device leaves a process, and shows what a user would watch: the
GangJob's progress, each restart's Event, duration and what it cost, the trainer resuming from
its checkpoint, the stacks the agents collected from the hung gang, and the job's goodput.
Usage: python -m localcluster.demo [--name demo]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from api.constants import AGENT_CONTAINER
from localcluster.chaos import kill_trainer
from localcluster.cluster import Cluster, Options
from localcluster.node import AGENT_IMAGE, Bridge, ensure_trainer_image
from localcluster.procs import free_port
from localcluster.tools import REPO, controller_kubeconfig, install_crd, kubectl

SAMPLE = REPO / "manifests" / "samples" / "pytorch-ddp.yaml"
NAMESPACE = "default"
KILL_AFTER_STEP = 30
HANG_AFTER_STEP = 90
# What the product supports on a cluster that is set up well: KEP-4671 gang scheduling, so the
# gang is admitted whole and no Event warns of a degraded mode.
DEMO_OPTIONS = Options(profile="node", nodes=1, gang_scheduling=True)
POLL = 0.5  # seconds between looks at the job: a demo prints, it does not need a watch


def say(msg: str = "") -> None:
    print(msg, flush=True)


def banner(msg: str) -> None:
    say(f"\n\033[1m==> {msg}\033[0m")


class Demo:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
        self.name: str = self.job["metadata"]["name"]
        volumes = self.job["spec"]["template"]["spec"]["volumes"]
        self.checkpoints = Path(volumes[0]["hostPath"]["path"]) / self.name
        self.last_row = ""
        self.t0 = time.monotonic()

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.t0:6.1f}s]"

    # ---- looking at the job ---------------------------------------------------------------
    def get_job(self) -> dict[str, Any]:
        path = f"/apis/gangjob.io/v1alpha1/namespaces/{NAMESPACE}/gangjobs/{self.name}"
        try:
            job: dict[str, Any] = self.cluster.api("GET", path)
            return job
        except urllib.error.HTTPError:
            return {}

    def row(self, job: dict[str, Any]) -> str:
        st = job.get("status", {})
        w = st.get("workers", {})
        step = (st.get("progress") or {}).get("step")
        ratio = (st.get("goodput") or {}).get("ratio")
        return (
            f"{self.name:<12} {st.get('phase', ''):<11} {w.get('ready', 0)}/{w.get('total', 0):<4} "
            f"{st.get('epoch', 0):<6} {st.get('barrierEpoch', '-')!s:<8} "
            f"{st.get('restarts', {}).get('total', 0):<9}{'-' if step is None else step!s:<6}"
            f"{'-' if ratio is None else f'{100 * ratio:.0f}%'}"
        )

    def show(self, job: dict[str, Any]) -> None:
        if not job.get("status", {}).get("phase"):
            return  # the controller has not written a status yet: nothing to show
        row = self.row(job)
        if row != self.last_row:
            say(f"{self.elapsed()} {row}")
            self.last_row = row

    def summary(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.checkpoints / "latest.json").read_text())
            return data
        except (OSError, ValueError):
            return {}

    def trainer_log(self, rank: int, tail: int = 200) -> list[str]:
        try:
            out = kubectl(
                self.cluster, "-n", NAMESPACE, "logs", f"{self.name}-{rank}", "-c", "trainer",
                f"--tail={tail}", timeout=10,
            )  # fmt: skip
        except RuntimeError:
            return []
        return [line for line in out.splitlines() if " epoch=" in line]

    # ---- the story ------------------------------------------------------------------------
    def setup(self) -> None:
        banner(
            f"starting the local Kubernetes `{self.cluster.name}` (a real kubelet, gang scheduling)"
        )
        if self.cluster.is_up() and not self.cluster.load().get("options", {}).get(
            "gang_scheduling"
        ):
            # A cluster from before the demo asked for gang scheduling would show the degraded
            # mode (`PodGroupAPINotServed`) instead of what a well-set-up cluster shows.
            say(f"  `{self.cluster.name}` is up without gang scheduling: starting it anew")
            self.cluster.down(sys.stdout)
        self.cluster.up(DEMO_OPTIONS, sys.stdout)
        banner("the trainer image: Python 3.11, CPU PyTorch, manifests/samples/ddp/train.py")
        ensure_trainer_image(self.cluster, sys.stdout)
        banner("installing the GangJob CRD, RBAC, admission policy; starting the controller")
        install_crd(self.cluster)
        kubectl(self.cluster, "apply", "-k", str(REPO / "manifests" / "policy"))
        kubeconfig = controller_kubeconfig(self.cluster)
        if not any(p.name == "gangjob-controller" and p.alive() for p in self.cluster.procs()):
            # The agents in the pods report arrivals to the controller on the pod bridge's
            # gateway (it runs on this host), as they would to its Service in a cluster.
            arrivals = f"{Bridge.for_slot(self.cluster.ports.slot).gateway}:{free_port()}"
            self.cluster.launch(
                "gangjob-controller",
                [
                    sys.executable, "-m", "controller.main", f"--kubeconfig={kubeconfig}",
                    f"--agent-image={AGENT_IMAGE}", "--log-format=text",
                    "--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0",
                    f"--arrival-bind-address={arrivals}", f"--arrival-url=http://{arrivals}",
                ],
            )  # fmt: skip
        say(f"  controller log: {self.cluster.logs / 'gangjob-controller.log'}")

    def submit(self) -> None:
        banner(f"submitting {SAMPLE.relative_to(REPO)} (2 workers, PyTorch DDP over gloo)")
        kubectl(self.cluster, "-n", NAMESPACE, "delete", "gangjob", self.name,
                "--ignore-not-found", "--wait=true", timeout=120)  # fmt: skip
        shutil.rmtree(self.checkpoints, ignore_errors=True)  # a fresh run, from step 0
        say(kubectl(self.cluster, "-n", NAMESPACE, "apply", "-f", str(SAMPLE)).strip())
        say(
            f"\n{'':9}{'NAME':<12} {'PHASE':<11} {'READY':<6} {'EPOCH':<6} {'BARRIER':<8} "
            f"{'RESTARTS':<9}{'STEP':<6}GOODPUT"
        )

    def train_until_checkpoint(self) -> None:
        shown = 0.0
        while self.summary().get("step", 0) < KILL_AFTER_STEP:
            job = self.get_job()
            self.show(job)
            if job.get("status", {}).get("phase") in ("Failed", "Succeeded"):
                raise SystemExit(f"the job ended early: {job['status']}")
            lines = self.trainer_log(1, tail=1)
            if lines and time.monotonic() - shown > 3:
                say(f"{self.elapsed()}   {self.name}-1: {lines[-1]}")
                shown = time.monotonic()
            time.sleep(POLL)
        ck = self.summary()
        say(f"{self.elapsed()}   checkpoint of step {ck['step']} in {self.checkpoints}")

    def kill(self) -> float:
        pod = self.cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{self.name}-1")
        pid = kill_trainer(self.cluster, pod)
        banner(f"kill -9 of rank 1's training process (host pid {pid}), as an OOM kill would")
        return time.time()

    def watch_restart(self, epoch: int, failed_at: float) -> None:
        """Until the trainers resumed at `epoch`: the restart's trigger, its cost, the Events."""
        while True:
            job = self.get_job()
            self.show(job)
            st = job.get("status", {})
            if st.get("phase") in ("Succeeded", "Failed"):
                raise SystemExit(f"the job ended before it resumed at epoch {epoch}: {st}")
            if st.get("barrierEpoch") == epoch:
                resumed = [
                    line
                    for line in self.trainer_log(1, tail=400)
                    if f"epoch={epoch}" in line and ("resumed" in line or "no checkpoint" in line)
                ]
                if resumed:
                    break
            time.sleep(POLL)
        last = st.get("lastRestart", {})
        trigger = last.get("trigger", {})
        say(f"{self.elapsed()}   {self.name}-1: {resumed[-1]}")
        say(
            f"{self.elapsed()}   restart: {trigger.get('class')} of worker {trigger.get('worker')}"
            f" ({trigger.get('detail')}), durationSeconds {last.get('durationSeconds')} (failure "
            f"seen -> barrier open); failure -> training resumed "
            f"{time.time() - failed_at:.1f}s (at most, as seen here); lost "
            f"{last.get('lostSteps')} steps since the checkpoint of step "
            f"{last.get('checkpointStep')}"
        )
        self.events()

    def train_until_step(self, step: int) -> None:
        while self.summary().get("step", 0) < step:
            job = self.get_job()
            self.show(job)
            if job.get("status", {}).get("phase") in ("Failed", "Succeeded"):
                raise SystemExit(f"the job ended early: {job['status']}")
            time.sleep(POLL)

    def hang(self) -> float:
        pod = self.cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{self.name}-1")
        pid = kill_trainer(self.cluster, pod, sig=signal.SIGSTOP)
        hang_seconds = self.job["spec"]["progress"]["hangSeconds"]
        banner(
            f"SIGSTOP of rank 1's training process (host pid {pid}): alive and silent, as a "
            f"wedged GPU leaves it; rank 0 waits for it in the all-reduce. PyTorch would notice "
            f"when gloo's timeout fired; GangJob, {hang_seconds}s after rank 1's last step"
        )
        return time.time()

    def stacks(self, rank: int) -> None:
        """What the agent of `rank` collected when it found its trainer stalled: the agent
        that came back after the whole-pod restart logs it again."""
        command = ["-n", NAMESPACE, "logs", f"{self.name}-{rank}", "-c", AGENT_CONTAINER]
        try:
            lines = kubectl(self.cluster, *command, timeout=10).splitlines()
        except RuntimeError as e:
            say(f"{self.elapsed()}   (rank {rank}'s agent log: {e})")
            return
        start = next((i for i, ln in enumerate(lines) if "stacks collected at" in ln), None)
        if start is None:
            say(f"{self.elapsed()}   rank {rank}'s agent found no stall before the restart")
            return
        say(f"{self.elapsed()}   the stacks rank {rank}'s agent collected (its log):")
        for line in lines[start : start + 14]:
            say(f"{'':13}{line[:110]}")

    def watch_end(self) -> None:
        while True:
            job = self.get_job()
            self.show(job)
            st = job.get("status", {})
            if st.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(POLL)
        banner(f"the job {st['phase']}")
        say(kubectl(self.cluster, "-n", NAMESPACE, "get", "gj", self.name, "-o", "wide").rstrip())
        say("")
        say(gangjob_status(self.cluster, self.name).rstrip())
        say(f"\nlast checkpoint: {self.summary()}")
        self.events()

    def events(self) -> None:
        # By UID: a job of the same name from an earlier `make demo` has Events of its own.
        uid = self.get_job().get("metadata", {}).get("uid", "")
        out = kubectl(
            self.cluster, "-n", NAMESPACE, "get", "events",
            f"--field-selector=involvedObject.uid={uid}", "--sort-by=.lastTimestamp",
        )  # fmt: skip
        say("\n" + out.rstrip() + "\n")

    def picture(self) -> None:
        banner(f"the job's timeline: gangjob report {self.name}")
        path = self.cluster.dir / f"{self.name}-timeline.png"
        say("  " + gangjob(self.cluster, "report", self.name, "-o", str(path)).strip())

    def closing(self) -> None:
        kc = self.cluster.kubeconfig
        banner("look around")
        say(f"""  export KUBECONFIG={kc}
  .venv/bin/localcluster kubectl --name {self.cluster.name} -- get gj,pods -o wide
  .venv/bin/localcluster kubectl --name {self.cluster.name} -- get gj {self.name} -o yaml   # status.lastRestart, history
  .venv/bin/localcluster kubectl --name {self.cluster.name} -- logs {self.name}-1 -c trainer
  .venv/bin/gangjob logs {self.name} --rank 1                  # the same, across its restarts
  .venv/bin/gangjob list -A                                    # or: kubectl gangjob list -A
  .venv/bin/localcluster kubectl --name {self.cluster.name} -- get events
  cat {self.cluster.logs / "gangjob-controller.log"}
  ls {self.checkpoints}

Run it again: make demo (reuses the cluster). Clean up (stops the cluster and the controller, removes
the pod bridge): .venv/bin/localcluster down --name {self.cluster.name}""")  # noqa: E501


def gangjob(cluster: Cluster, *args: str) -> str:
    """`gangjob COMMAND ARGS...`, as the user would run it."""
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", args[0], f"--kubeconfig={cluster.kubeconfig}",
         "-n", NAMESPACE, *args[1:]],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    return res.stdout if res.returncode == 0 else f"gangjob {args[0]} failed: {res.stderr}"


def gangjob_status(cluster: Cluster, name: str) -> str:
    return gangjob(cluster, "status", name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localcluster.demo", description=__doc__)
    p.add_argument("--name", default="demo", help="the local cluster's name")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        say("the demo runs a real kubelet and containerd: run it as root")
        return 1
    t0 = time.monotonic()
    demo = Demo(Cluster(args.name))
    demo.setup()
    demo.submit()
    demo.t0 = time.monotonic()
    demo.train_until_checkpoint()
    killed_at = demo.kill()
    demo.watch_restart(1, killed_at)
    demo.train_until_step(HANG_AFTER_STEP)
    stopped_at = demo.hang()
    demo.watch_restart(2, stopped_at)
    demo.stacks(0)
    demo.watch_end()
    demo.closing()
    say(f"\ndemo took {time.monotonic() - t0:.0f}s")
    demo.picture()
    return 0


if __name__ == "__main__":
    sys.exit(main())
