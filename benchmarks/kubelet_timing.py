"""What the simulated kubelet (`localcluster.simkubelet`) charges for the kubelet's own work,
measured on a REAL node (kubelet + containerd, the `node` profile):

    python -m benchmarks.kubelet_timing [--restarts 3] [--workers 3] [--cluster node] [--keep]

A `Pod`-mode gang runs with the controller; rank 1's trainer exits 1 two seconds into every
epoch below --restarts, so every pod restarts whole (KEP-5532) that many times. From the
containers' own log lines (containerd stamps each with the node's clock, to the nanosecond):

- restart: an agent's last line (it exits 86), or for rank 1 its trainer's last line (it exits
  1, and the kubelet stops the agent), to the first line of the pod's next agent
  (`SimKubelet(restart_delay=...)`), and to the pod's restart condition gone from the
  apiserver's copy (`SimKubelet(restart_stop_delay=...)`);
- start: the pod bound to the node (this process's watch, the same clock) to its first agent's
  first line (`SimKubelet(start_delay=...)`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from datetime import datetime
from typing import Any

import yaml

from api import builders
from api.constants import ANNOTATION_EPOCH
from benchmarks.common import Progress, markdown_table, until_terminated, write_json
from benchmarks.realnode import controller_on_node
from controller.k8s import GANGJOBS, PODS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.tools import kubectl

AGENT = "gangjob-agent"
RESTARTING = "AllContainersRestarting"
TRAINER = r"""
trap 'exit 0' TERM
e=$(cat "$GANGJOB_DIR/epoch")
echo "rank $RANK training at epoch $e"
if [ "$RANK" = 1 ] && [ "$e" -lt "$RESTARTS" ]; then sleep 2; echo "rank 1 fails"; exit 1; fi
while :; do sleep 1 & wait $!; done
"""


def gangjob(workers: int, restarts: int) -> JsonDict:
    return builders.gangjob(
        "timing",
        workers,
        image="localhost/busybox:dev",
        command=["sh", "-c", TRAINER],
        container={
            "imagePullPolicy": "Never",
            "env": [{"name": "RESTARTS", "value": str(restarts)}],
        },
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode="Pod",
        max_restarts=restarts + 1,
    )


def log_time(line: str) -> float:
    """The wall-clock time containerd stamped on a `kubectl logs --timestamps` line."""
    stamp = line.split(" ", 1)[0]
    head, _, frac = stamp.partition(".")
    digits = "".join(c for c in frac if c.isdigit())
    zone = frac[len(digits) :]
    parsed = datetime.fromisoformat(f"{head}.{digits[:6]:0<6}{'+00:00' if zone == 'Z' else zone}")
    return parsed.timestamp()


def log_lines(cluster: Cluster, ns: str, pod: JsonDict, container: str, run: int) -> list[str]:
    """The lines a container's run wrote (`run`: its restartCount then), as the kubelet keeps
    them on the node: the API serves no previous run after a whole-pod restart."""
    meta = pod["metadata"]
    logs = cluster.dir / "pod-logs" / f"{ns}_{meta['name']}_{meta['uid']}" / container
    return (logs / f"{run}.log").read_text().splitlines()


class PodWatch:
    """What the apiserver showed of each pod of the namespace, and when (wall clock): bound
    to the node, its restart condition cleared (the kubelet's status write after a restart),
    its arrival annotation at each epoch."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.bound: dict[str, float] = {}
        self.cleared: dict[str, list[float]] = {}
        self.annotated: dict[str, dict[str, float]] = {}
        self._restarting: set[str] = set()

    async def run(self) -> None:
        stream = self.kube.watch(PODS, self.ns)
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type not in ("ADDED", "MODIFIED"):
                    continue
                now, pod = time.time(), ev.object
                name = pod["metadata"]["name"]
                if pod.get("spec", {}).get("nodeName"):
                    self.bound.setdefault(name, now)
                conds = {
                    c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])
                }
                if conds.get(RESTARTING) == "True":
                    self._restarting.add(name)
                elif name in self._restarting:
                    self._restarting.discard(name)
                    self.cleared.setdefault(name, []).append(now)
                epoch = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_EPOCH)
                if epoch is not None:
                    self.annotated.setdefault(name, {}).setdefault(epoch, now)


async def wait_barrier(kube: Kube, ns: str, epoch: int, progress: Progress) -> JsonDict:
    async with asyncio.timeout(180):
        while True:
            job = await kube.get(GANGJOBS, "timing", ns)
            st = job.get("status", {})
            if st.get("barrierEpoch") == epoch and st.get("workers", {}).get("arrived"):
                return job
            if st.get("phase") == "Failed":
                raise RuntimeError(f"job failed: {st.get('conditions')}")
            progress.tick(f"epoch {st.get('epoch', 0)}, barrier {st.get('barrierEpoch')}")
            await asyncio.sleep(0.5)


async def measure(cluster: Cluster, kube: Kube, workers: int, restarts: int) -> dict[str, Any]:
    ns = f"kubelet-timing-{int(time.time())}"
    kubectl(cluster, "create", "namespace", ns)
    pods = PodWatch(kube, ns)
    watch = asyncio.create_task(pods.run())
    names = [f"timing-{r}" for r in range(workers)]
    starts: list[float] = []
    restart_after_agent: list[float] = []
    restart_after_trainer: list[float] = []
    cleared_after_exit: list[float] = []
    status_lag: list[float] = []
    arrival_lag: list[float] = []
    agents: dict[str, list[float]] = {}
    exits: dict[str, list[float]] = {}
    try:
        kubectl(
            cluster, "-n", ns, "apply", "-f", "-", stdin=yaml.safe_dump(gangjob(workers, restarts))
        )
        progress = Progress("kubelet timing")
        await wait_barrier(kube, ns, 0, progress)
        worker = {name: await kube.get(PODS, name, ns) for name in names}
        for name in names:
            first = log_lines(cluster, ns, worker[name], AGENT, 0)[0]
            starts.append(log_time(first) - pods.bound[name])
        # Each epoch restarts every pod once: the runs of epoch E have restartCount E.
        for epoch in range(1, restarts + 1):
            await wait_barrier(kube, ns, epoch, progress)
            for rank, name in enumerate(names):
                pod = worker[name]
                new_agent = log_time(log_lines(cluster, ns, pod, AGENT, epoch)[0])
                agents.setdefault(name, []).append(new_agent)
                container = "trainer" if rank == 1 else AGENT
                ended = log_time(log_lines(cluster, ns, pod, container, epoch - 1)[-1])
                exits.setdefault(name, []).append(ended)
                samples = restart_after_trainer if rank == 1 else restart_after_agent
                samples.append(new_agent - ended)
        await asyncio.sleep(2)  # the last restart's status writes, through the watch
        for name, starts_of in agents.items():
            cleared = pods.cleared.get(name, [])
            if len(cleared) != len(starts_of):  # a restart whose condition the watch never saw
                print(
                    f"  {name}: {len(cleared)} restart conditions cleared for "
                    f"{len(starts_of)} restarts: its status lag is left out",
                    file=sys.stderr,
                )
            for epoch, started in enumerate(starts_of, 1):
                if len(cleared) == len(starts_of):
                    status_lag.append(cleared[epoch - 1] - started)
                    cleared_after_exit.append(cleared[epoch - 1] - exits[name][epoch - 1])
                annotated = pods.annotated.get(name, {}).get(str(epoch))
                if annotated is not None:
                    arrival_lag.append(annotated - started)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        kubectl(cluster, "delete", "namespace", ns, "--wait=false")
    return {
        "start_s": starts,
        "restart_after_agent_exit_s": restart_after_agent,
        "restart_after_trainer_exit_s": restart_after_trainer,
        "cleared_after_exit_s": cleared_after_exit,
        "status_after_agent_s": status_lag,
        "annotation_after_agent_s": arrival_lag,
    }


def summary(samples: list[float]) -> list[Any]:
    if not samples:
        return [0, "-", "-", "-"]
    return [
        len(samples),
        round(statistics.median(samples), 2),
        round(min(samples), 2),
        round(max(samples), 2),
    ]


async def run(args: argparse.Namespace) -> int:
    stage = controller_on_node(
        args.cluster, "kubelet-timing-controller.log", arrivals=args.arrivals == "direct",
        keep=args.keep,
    )  # fmt: skip
    with stage as (cluster, _):
        async with await Kube.from_kubeconfig(cluster.kubeconfig) as kube:
            res = await measure(cluster, kube, args.workers, args.restarts)
    rows = [
        ["start: bound -> agent's first line", *summary(res["start_s"])],
        ["restart: agent exit -> next agent", *summary(res["restart_after_agent_exit_s"])],
        ["restart: trainer exit -> next agent", *summary(res["restart_after_trainer_exit_s"])],
        ["restart: exit -> restart condition cleared", *summary(res["cleared_after_exit_s"])],
        ["next agent -> restart condition cleared", *summary(res["status_after_agent_s"])],
        ["next agent -> its arrival annotation", *summary(res["annotation_after_agent_s"])],
    ]
    table = markdown_table(["what", "samples", "median (s)", "min (s)", "max (s)"], rows)
    path = write_json(
        f"kubelet_timing-{args.arrivals}",
        {"workers": args.workers, "arrivals": args.arrivals, **res},
    )
    print(f"\nThe kubelet's own work on a real node, {args.workers} workers:\n\n{table}\n")
    print(f"results: {path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kubelet_timing", description=__doc__)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--cluster", default="node", help="local cluster (node profile)")
    p.add_argument(
        "--arrivals", choices=["direct", "annotation"], default="direct",
        help="how agents report arrivals: to the controller, or by annotating their pod",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    return asyncio.run(until_terminated(run(p.parse_args())))


if __name__ == "__main__":
    sys.exit(main())
