"""Gang restart durations on a REAL node (kubelet + containerd), the three modes side by side.

    python -m benchmarks.node_restart [--restarts 5] [--workers 3] [--keep]

For each mode (Pod, Process, Recreate) a gang of busybox/python trainers runs on the local
`node` profile; rank 1's trainer exits 1 two seconds into every epoch below --restarts, so the
gang restarts that many times. Each restart's duration is the controller's own measure, from
detecting the failure to the barrier opening (`status.history[].durationSeconds`), plus the
time from the trainer's exit (its container's finishedAt, whole seconds) to the barrier.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import datetime
from typing import Any

import yaml

from api import builders
from benchmarks.common import Progress, markdown_table, write_json
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster, Options
from localcluster.node import AGENT_IMAGE
from localcluster.tools import REPO, ControllerProcess, controller_kubeconfig, install_crd, kubectl

MODES = ("Pod", "Process", "Recreate")
TRAINER = r"""
trap 'exit 0' TERM
e=$(cat "$GANGJOB_DIR/epoch")
echo "rank $RANK training at epoch $e"
if [ "$RANK" = 1 ] && [ "$e" -lt "$RESTARTS" ]; then sleep 2; echo "rank 1 fails"; exit 1; fi
while :; do sleep 1 & wait $!; done
"""


def gangjob(mode: str, workers: int, restarts: int) -> JsonDict:
    return builders.gangjob(
        f"bench-{mode.lower()}", workers,
        # Process mode runs the agent in the trainer's image: it needs python3.
        image=AGENT_IMAGE if mode == "Process" else "localhost/busybox:dev",
        command=["sh", "-c", TRAINER],
        container={
            "imagePullPolicy": "Never",
            "env": [{"name": "RESTARTS", "value": str(restarts)}],
        },
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode=mode, max_restarts=restarts + 1,
    )  # fmt: skip


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def run_mode(
    kube: Kube, cluster: Cluster, mode: str, workers: int, restarts: int
) -> dict[str, Any]:
    ns = f"bench-{mode.lower()}-{int(time.time())}"
    kubectl(cluster, "create", "namespace", ns)
    body = gangjob(mode, workers, restarts)
    name = body["metadata"]["name"]
    t0 = time.monotonic()
    kubectl(cluster, "-n", ns, "apply", "-f", "-", stdin=yaml.safe_dump(body))
    progress = Progress(f"{mode} mode")
    job = await kube.get(GANGJOBS, name, ns)
    async with asyncio.timeout(120 + 60 * restarts):
        while True:
            st = job.get("status", {})
            if st.get("epoch") == restarts and st.get("barrierEpoch") == restarts:
                break
            if st.get("phase") == "Failed":
                raise RuntimeError(f"{mode}: job failed: {st.get('conditions')}")
            progress.tick(f"epoch {st.get('epoch', 0)}/{restarts}")
            async for ev in kube.watch(
                GANGJOBS, ns, field_selector=f"metadata.name={name}",
                resource_version=job["metadata"]["resourceVersion"],
            ):  # fmt: skip
                if ev.type == "MODIFIED":
                    job = ev.object
                    break
    wall = time.monotonic() - t0
    history = job["status"]["history"]
    durations = [h["durationSeconds"] for h in history if h.get("durationSeconds") is not None]
    kubectl(cluster, "delete", "namespace", ns, "--wait=false")
    return {
        "mode": mode,
        "restarts": len(durations),
        "durations_s": durations,
        "median_s": round(statistics.median(durations), 2),
        "p90_s": round(sorted(durations)[max(0, int(0.9 * len(durations)) - 1)], 2),
        "max_s": round(max(durations), 2),
        "wall_s": round(wall, 1),
        "triggers": sorted({h["trigger"]["class"] for h in history}),
    }


async def run(args: argparse.Namespace) -> int:
    cluster = Cluster(args.cluster)
    started = not cluster.is_up()
    cluster.up(Options(profile="node"), sys.stderr)
    install_crd(cluster)
    kubectl(cluster, "apply", "-k", str(REPO / "manifests" / "policy"))
    ctl = ControllerProcess(
        controller_kubeconfig(cluster),
        ["--log-level=info", f"--agent-image={AGENT_IMAGE}"],
        cluster.logs / "bench-controller.log",
    )
    ctl.start()
    ctl.wait_ready()
    results = []
    try:
        async with await Kube.from_kubeconfig(cluster.kubeconfig) as kube:
            for mode in args.modes.split(","):
                res = await run_mode(kube, cluster, mode, args.workers, args.restarts)
                print(f"{mode}: {res}", file=sys.stderr)
                results.append(res)
    finally:
        ctl.stop()
        if started and not args.keep:
            cluster.down(sys.stderr)
    table = markdown_table(
        ["mode", "restarts", "median (s)", "p90 (s)", "max (s)", "each (s)"],
        [[r["mode"], r["restarts"], r["median_s"], r["p90_s"], r["max_s"],
          ", ".join(f"{d:.2f}" for d in r["durations_s"])] for r in results],
    )  # fmt: skip
    path = write_json("node_restart", {"workers": args.workers, "results": results})
    print(
        f"\nGang restart, failure detected -> barrier open, real kubelet, {args.workers} workers:"
    )
    print(f"\n{table}\n\nresults: {path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.node_restart", description=__doc__)
    p.add_argument("--restarts", type=int, default=5)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cluster", default="node", help="local cluster (node profile)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
