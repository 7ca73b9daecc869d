"""The controller-manager's client rate limit raised for part of a run: that one process of the
cluster restarted with `--kube-api-qps`/`--kube-api-burst` added to its command line, and put
back as it was afterwards.

`localcluster.cluster.Options` sets the scheduler's client QPS and the controller-manager's
endpoint batching, but not the controller-manager's client QPS (default 20, burst 30), so a
cluster cannot be brought up with it raised. Restarting the controller-manager alone keeps
everything else of the run (nodes, namespace, the controller, the simulated kubelet) as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from localcluster.cluster import Cluster
from localcluster.procs import Proc, stop

CONTROLLER_MANAGER = "kube-controller-manager"
"""Its name among the cluster's recorded processes."""
QPS_FLAGS = ("--kube-api-qps=", "--kube-api-burst=")


def _recorded(cluster: Cluster) -> Proc:
    for proc in cluster.procs():
        if proc.name == CONTROLLER_MANAGER:
            return proc
    raise RuntimeError(f"cluster {cluster.name!r} records no {CONTROLLER_MANAGER}")


def command_line(pid: int) -> list[str]:
    """The command line a process runs with."""
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def with_qps(cmd: list[str], qps: int | None) -> list[str]:
    """`cmd` with its client QPS `qps` and burst twice that (`None`: the defaults)."""
    kept = [a for a in cmd if not a.startswith(QPS_FLAGS)]
    return kept if qps is None else [*kept, f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]


def _healthy(cluster: Cluster) -> bool:
    # Its serving certificate is self-signed; /healthz needs no credentials.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{cluster.ports.controller_manager}/healthz"
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bool(resp.status == 200)


def restart_controller_manager(cluster: Cluster, cmd: list[str]) -> None:
    """Stops the cluster's controller-manager (its recorded PID) and starts `cmd` in its place,
    recorded as the cluster's so that `down` stops it; returns once it is healthy."""
    old = _recorded(cluster)
    stop(old)
    state = cluster.load()
    state["processes"] = [p for p in state.get("processes", []) if p.get("pid") != old.pid]
    cluster.save(state)
    cluster.launch(CONTROLLER_MANAGER, cmd)
    cluster.wait_for(
        f"{CONTROLLER_MANAGER} /healthz", lambda: _healthy(cluster), 60, CONTROLLER_MANAGER
    )


@contextlib.asynccontextmanager
async def controller_manager_qps(cluster: Cluster, qps: int) -> AsyncIterator[None]:
    """Within the block, the cluster's controller-manager runs with client QPS `qps` (burst
    twice that); after it, with the command line it had before."""
    before = command_line(_recorded(cluster).pid)
    await asyncio.to_thread(restart_controller_manager, cluster, with_qps(before, qps))
    try:
        yield
    finally:
        await asyncio.to_thread(restart_controller_manager, cluster, before)
