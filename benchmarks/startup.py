"""Time for a GangJob of N workers to reach Running on the `sim` cluster, and what the
controller spends on it (RSS, CPU, API requests).

    python -m benchmarks.startup [--sizes 100,1000] [--keep]

A gang is submitted with `kubectl apply`, as a user would; "Running" is the controller's own
status (every worker pod Running and Ready), watched on the GangJob. The apiserver, scheduler
and controller-manager run with a default cluster's settings (scheduler client QPS 50) unless
--scheduler-qps says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from typing import Any

import yaml

from api.builders import gangjob
from benchmarks.common import (
    Progress,
    cpu_seconds,
    markdown_table,
    rss_mib,
    until_terminated,
    write_json,
)
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster, Options
from localcluster.tools import ControllerProcess, controller_kubeconfig, install_crd, kubectl

PODS_PER_NODE = 250


def manifest(name: str, replicas: int) -> str:
    return yaml.safe_dump(
        gangjob(name, replicas, image="localhost/busybox:dev", command=["sleep", "infinity"])
    )


async def wait_running(kube: Kube, ns: str, name: str, n: int, timeout: float) -> JsonDict:
    progress = Progress(f"{name} ({n} workers)")
    job = await kube.get(GANGJOBS, name, ns)
    stream = kube.watch(
        GANGJOBS, ns, field_selector=f"metadata.name={name}",
        resource_version=job["metadata"]["resourceVersion"],
    )  # fmt: skip
    async with contextlib.aclosing(stream), asyncio.timeout(timeout):
        while True:
            st = job.get("status", {})
            if st.get("phase") == "Running" and st.get("workers", {}).get("ready") == n:
                return job
            progress.tick(f"{st.get('workers', {}).get('ready', 0)}/{n} ready")
            ev = await anext(stream)
            if ev.type in ("ADDED", "MODIFIED"):
                job = ev.object


async def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    nodes = max(3, math.ceil(max(sizes) / PODS_PER_NODE) + 1)
    cluster = Cluster(args.cluster)
    started = not cluster.is_up()
    cluster.up(
        Options(profile="sim", nodes=nodes, pods_per_node=PODS_PER_NODE,
                scheduler_qps=args.scheduler_qps),
        sys.stderr,
    )  # fmt: skip
    install_crd(cluster)
    ctl = ControllerProcess(
        controller_kubeconfig(cluster), ["--log-level=info"], cluster.logs / "bench-controller.log"
    )
    ctl.start()
    ctl.wait_ready()
    assert ctl.proc is not None
    rows: list[dict[str, Any]] = []
    try:
        async with await Kube.from_kubeconfig(cluster.kubeconfig) as kube:
            for n in sizes:
                ns = f"bench-startup-{n}-{int(time.time())}"
                kubectl(cluster, "create", "namespace", ns)
                cpu0, req0 = cpu_seconds(ctl.proc.pid), ctl.metric("rest_client_requests_total")
                t0 = time.monotonic()
                kubectl(cluster, "-n", ns, "apply", "-f", "-", stdin=manifest("gang", n))
                await wait_running(kube, ns, "gang", n, timeout=600)
                elapsed = time.monotonic() - t0
                row = {
                    "workers": n,
                    "seconds_to_running": round(elapsed, 2),
                    "controller_rss_mib": round(rss_mib(ctl.proc.pid), 1),
                    "controller_cpu_seconds": round(cpu_seconds(ctl.proc.pid) - cpu0, 2),
                    "api_requests": int(ctl.metric("rest_client_requests_total") - req0),
                }
                rows.append(row)
                print(kubectl(cluster, "-n", ns, "get", "gj"), file=sys.stderr)
                print(f"N={n}: {row}", file=sys.stderr)
                kubectl(cluster, "delete", "namespace", ns, "--wait=false")
    finally:
        ctl.stop()
        if started and not args.keep:
            cluster.down(sys.stderr)
    qps = args.scheduler_qps or "default (50)"
    table = markdown_table(
        ["workers", "time to Running (s)", "controller RSS (MiB)", "controller CPU (s)",
         "API requests"],
        [[r["workers"], r["seconds_to_running"], r["controller_rss_mib"],
          r["controller_cpu_seconds"], r["api_requests"]] for r in rows],
    )  # fmt: skip
    path = write_json("startup", {"scheduler_qps": qps, "nodes": nodes, "results": rows})
    print(f"\nGangJob startup on sim ({nodes} KWOK nodes, scheduler QPS {qps}):\n\n{table}\n")
    print(f"results: {path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__)
    p.add_argument("--sizes", default="100,1000", help="gang sizes, comma-separated")
    p.add_argument("--cluster", default="bench", help="local cluster to use (started if down)")
    p.add_argument("--scheduler-qps", type=int, help="raise the scheduler's client QPS")
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    return asyncio.run(until_terminated(run(p.parse_args())))


if __name__ == "__main__":
    sys.exit(main())
