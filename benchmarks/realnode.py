"""The stage of the benchmarks that run on a REAL node (node_restart, kubelet_timing, goodput):
a local cluster of the `node` profile (started if it is not up, and stopped again afterwards
unless kept), the CRD and the admission policy installed, and the controller running on this
host, its arrival endpoint on the pod bridge's gateway when asked for."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence

from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster, Options
from localcluster.node import AGENT_IMAGE, Bridge
from localcluster.tools import REPO, ControllerProcess, controller_kubeconfig, install_crd, kubectl


@contextlib.contextmanager
def controller_on_node(
    name: str, log: str, *, arrivals: bool, keep: bool, args: Sequence[str] = ()
) -> Iterator[tuple[Cluster, ControllerProcess]]:
    """The cluster `name` and a ready controller (its log `log` in the cluster's logs), until
    the block ends: then the controller stops, and the cluster too if this started it."""
    cluster = Cluster(name)
    started = not cluster.is_up()
    cluster.up(Options(profile="node"), sys.stderr)
    install_crd(cluster)
    kubectl(cluster, "apply", "-k", str(REPO / "manifests" / "policy"))
    ctl = ControllerProcess(
        controller_kubeconfig(cluster),
        [f"--agent-image={AGENT_IMAGE}", *args],
        cluster.logs / log,
        arrivals=arrivals,
        arrival_host=Bridge.for_slot(cluster.ports.slot).gateway,
    )
    ctl.start()
    try:
        ctl.wait_ready()
        yield cluster, ctl
    finally:
        ctl.stop()
        if started and not keep:
            cluster.down(sys.stderr)


def record_restarts(job: JsonDict, finished: dict[int, JsonDict]) -> None:
    """Adds the finished restarts `job`'s status shows (its last restart and its history, which
    keeps only the last few) to `finished`, by epoch."""
    status = job.get("status", {})
    for record in [*status.get("history", []), status.get("lastRestart") or {}]:
        if record.get("durationSeconds") is not None:
            finished[record["epoch"]] = record


async def watch_until(
    kube: Kube, ns: str, name: str, done: Callable[[JsonDict], bool], timeout: float
) -> JsonDict:
    """GangJob `name` as it is when `done` says so, asked of every version seen from now on
    (within `timeout`, else TimeoutError)."""
    job = await kube.get(GANGJOBS, name, ns)
    async with asyncio.timeout(timeout):
        if done(job):
            return job
        events = kube.watch(
            GANGJOBS, ns, field_selector=f"metadata.name={name}",
            resource_version=job["metadata"]["resourceVersion"],
        )  # fmt: skip
        async with contextlib.aclosing(events):
            async for ev in events:
                if ev.type == "MODIFIED" and done(ev.object):
                    return ev.object
    raise RuntimeError(f"the watch of GangJob {ns}/{name} ended")
