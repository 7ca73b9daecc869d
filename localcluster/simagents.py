"""The `sim` cluster's agents (`localcluster up --profile sim --agents`): a component of the
cluster, started and stopped with it, that plays the kubelet for GangJob pods on KWOK nodes and
runs the REAL agent for every one of them, so that a GangJob applied with `kubectl` runs, fails
and restarts in place as on real nodes, with no test or benchmark process around it.

It is `localcluster.simkubelet.SimKubelet`, one per namespace (every namespace but the
system ones, followed as they come and go), in a process of its own (`sim-agents` in the
cluster's record, its log `logs/sim-agents.log`). Each agent reports arrivals where its pod's
environment says (`GANGJOB_ARRIVAL_URL`, which a controller run with `--arrival-url` gives it),
else by annotating its pod.

Failures are injected through a unix socket in the cluster's state directory
(`sim-agents.sock`, one JSON request per connection): `localcluster kill-worker JOB RANK`
(`kill_worker` here) makes the worker's trainer exit with a code, as a crashed trainer would:
in `Pod` mode a code of the trainer's `RestartAllContainers` rule restarts the pod in place
(same pod, same UID), any other leaves it Failed; in `Process` mode the agent's trainer run
ends with it.

The tests and benchmarks keep their own `SimKubelet` in their process (they drive and observe
it directly); this process is for people and for what runs outside Python.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from agent.apiclient import ClientError, HttpClient, ssl_context
from api.constants import AgentPlacement
from localcluster.cluster import SIM_AGENTS, SIM_AGENTS_SOCKET
from localcluster.handle import ClusterHandle
from localcluster.simkubelet import RESTART_DELAY, START_DELAY, SimKubelet

log = logging.getLogger("localcluster.simagents")

COMPONENT = SIM_AGENTS
"""The process's name in the cluster's record and its log's (`logs/sim-agents.log`)."""
SOCKET_NAME = SIM_AGENTS_SOCKET
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
"""Namespaces that run no GangJob pods: no pod watch is spent on them."""
NAMESPACES = "/api/v1/namespaces"


def socket_path(cluster: ClusterHandle) -> Path:
    """Where the cluster's agents component takes requests."""
    return cluster.dir / SOCKET_NAME


class SimAgents:
    """A `SimKubelet` for each namespace, and the requests of the control socket."""

    def __init__(self, api: HttpClient, *, restart_delay: float, start_delay: float) -> None:
        self.api = api
        self.restart_delay = restart_delay
        self.start_delay = start_delay
        self.kubelets: dict[str, tuple[SimKubelet, asyncio.Task[None]]] = {}
        self.listed = asyncio.Event()
        """Set once the namespaces were listed and each has its kubelet."""

    # -- namespaces ----------------------------------------------------------------------
    async def run(self) -> None:
        """Lists and watches namespaces: a kubelet for each new one, gone with it. A namespace
        being deleted keeps its kubelet until it is gone: its pods' deletion is the kubelet's
        to finish."""
        rv = ""
        while True:
            try:
                if not rv:
                    page = await self.api.get(NAMESPACES)
                    names = {ns["metadata"]["name"] for ns in page.get("items", [])}
                    for gone in set(self.kubelets) - names:
                        await self._drop(gone)
                    for name in sorted(names):
                        self._ensure(name)
                    rv = page.get("metadata", {}).get("resourceVersion", "")
                    self.listed.set()
                query = {"resourceVersion": rv, "allowWatchBookmarks": "true"}
                stream = self.api.watch(NAMESPACES, query, inactivity_timeout=90.0)
                async with contextlib.aclosing(stream):
                    async for ev in stream:
                        kind, obj = ev["type"], ev["object"]
                        if kind == "ERROR":  # the version expired: list again
                            rv = ""
                            break
                        name = obj.get("metadata", {}).get("name", "")
                        if kind == "ADDED":
                            self._ensure(name)
                        elif kind == "DELETED":
                            await self._drop(name)
                        rv = obj.get("metadata", {}).get("resourceVersion") or rv
            except (ClientError, OSError) as e:
                log.warning("namespace watch broke (%s); listing again", e)
                rv = ""
                await asyncio.sleep(1.0)

    def _ensure(self, ns: str) -> None:
        if not ns or ns in SYSTEM_NAMESPACES or ns in self.kubelets:
            return
        sim = SimKubelet(
            self.api, ns, restart_delay=self.restart_delay, start_delay=self.start_delay,
            arrival_from_pods=True,
        )  # fmt: skip
        self.kubelets[ns] = (sim, asyncio.create_task(sim.run()))
        log.info("namespace %s: running the agents of its GangJob pods", ns)

    async def _drop(self, ns: str) -> None:
        entry = self.kubelets.pop(ns, None)
        if entry is None:
            return
        sim, task = entry
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sim.close()
        log.info("namespace %s gone: its agents stopped", ns)

    async def close(self) -> None:
        for ns in list(self.kubelets):
            await self._drop(ns)

    # -- the control socket --------------------------------------------------------------
    async def serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One JSON request, one JSON answer (`{"error": ...}` when it cannot be done)."""
        try:
            try:
                answer = await self.handle(json.loads(await reader.readline()))
            except (LookupError, ValueError, TypeError, RuntimeError) as e:
                answer = {"error": e.args[0] if isinstance(e, KeyError) and e.args else str(e)}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "status":
            return {
                "namespaces": {
                    ns: {"pods": len(sim.pods), "agents": len(sim.workers)}
                    for ns, (sim, _) in sorted(self.kubelets.items())
                }
            }
        if op != "kill":
            raise ValueError(f"unknown request {op!r} (kill, status)")
        ns = str(req.get("namespace") or "default")
        entry = self.kubelets.get(ns)
        if entry is None:
            raise LookupError(f"no namespace {ns!r} here")
        sim = entry[0]
        pod = str(req["pod"]) if req.get("pod") else sim.name_of(str(req["job"]), int(req["rank"]))
        w = sim.workers.get(pod)
        if w is None or w.agent is None:
            raise LookupError(f"{ns}/{pod}: no agent runs for it (not Running yet, or gone)")
        code = int(req.get("code", 1))
        log.info("kill %s/%s: its trainer exits %d", ns, pod, code)
        await sim.crash(pod, code)
        if w.mode is AgentPlacement.WRAPPER:
            what = "its agent saw the trainer run end (Process mode)"
        elif w.failed:
            what = "the pod Failed (the code is outside its trainer's restart rule)"
        else:
            what = "the pod restarted in place (same pod, same UID)"
        return {"namespace": ns, "pod": pod, "code": code, "what": what}


def kill_worker(
    cluster: ClusterHandle,
    namespace: str,
    job: str,
    rank: int | None = None,
    *,
    pod: str | None = None,
    code: int = 1,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Asks the cluster's agents component to end a worker's trainer with `code` (the worker of
    `rank` of `job`, or the pod named `pod`); returns what it did. Raises `RuntimeError` when it
    cannot."""
    return request(
        cluster,
        {"op": "kill", "namespace": namespace, "job": job, "rank": rank, "pod": pod, "code": code},
        timeout,
    )


def request(cluster: ClusterHandle, req: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """One request to the cluster's agents component."""
    path = socket_path(cluster)
    if not path.exists():
        raise RuntimeError(
            f"cluster {cluster.name!r} runs no agents (`localcluster up --profile sim --agents "
            f"--name {cluster.name}` starts them)"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except OSError as e:
            raise RuntimeError(f"the agents of cluster {cluster.name!r} do not answer: {e}") from e
        s.sendall(json.dumps(req).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data or b"{}")
    if "error" in answer:
        raise RuntimeError(str(answer["error"]))
    return answer


async def serve(cluster: ClusterHandle, restart_delay: float, start_delay: float) -> None:
    """Runs until SIGTERM or SIGINT, then stops every agent and removes the socket."""
    pki = cluster.pki
    api = HttpClient(
        cluster.server,
        ssl_context=ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key"),
    )
    agents = SimAgents(api, restart_delay=restart_delay, start_delay=start_delay)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    path = socket_path(cluster)
    path.unlink(missing_ok=True)
    watch = asyncio.create_task(agents.run())
    server: asyncio.Server | None = None
    try:
        ready = asyncio.create_task(agents.listed.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([ready, stopping, watch], return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set() and not watch.done():
            server = await asyncio.start_unix_server(agents.serve_client, path=str(path))
            log.info("serving on %s", path)
            await asyncio.wait([stopping, watch], return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        stopping.cancel()
        if watch.done():
            watch.result()  # its error, if it ended with one
    finally:
        log.info("stopping every agent")
        if server is not None:
            server.close()
        path.unlink(missing_ok=True)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await agents.close()
        await api.close()
        log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localcluster.simagents", description=__doc__)
    p.add_argument("--cluster", required=True, help="the local sim cluster's name")
    p.add_argument(
        "--restart-delay", type=float, default=RESTART_DELAY,
        help="a whole-pod restart, the exit to the new agent running (s)",
    )  # fmt: skip
    p.add_argument(
        "--start-delay", type=float, default=START_DELAY,
        help="a new pod Running to its agent running (s)",
    )  # fmt: skip
    p.add_argument(
        "--agent-log-level", default="WARNING",
        help="the agents' own log level (INFO: a few lines per agent per restart)",
    )  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )  # fmt: skip
    logging.getLogger("agent").setLevel(args.agent_log_level.upper())
    asyncio.run(serve(ClusterHandle(args.cluster), args.restart_delay, args.start_delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
