"""The arrival endpoint's own cost, without a cluster: the controller's CPU per arrival, per
progress summary and per state line fanned out, and its memory per open stream.

    python -m benchmarks.arrivals [--agents 1000] [--epochs 3] [--tls both|on|off]

The endpoint (`controller.arrivals.server.arrivals_app`, with the real `TokenAuthenticator`
over a review that answers at once, so a restart pays only its cache hit) runs in a child
process on loopback, alone: its CPU (/proc) and RSS are read around each phase. This process
runs N real agent clients (`agent.direct.DirectArrival` over `agent.apiclient.HttpClient`, one
client per agent, as one per pod), all with the same event loop:

- first arrival: N agents report epoch 0 (a connection each, the stream held);
- streams held: the controller's RSS with the N streams open, less before them;
- fan-out: the job's state changes, every stream is sent the line;
- next arrival (Process mode): each agent reports epoch E+1 while holding its epoch-E stream;
  how many new connections (and TLS handshakes) that took, from the server's count;
- progress: one summary per agent (`ProgressChannel`, the connection it keeps).

With `--tls both` the whole run is made with TLS off and on, side by side, and the handshake's
CPU on the controller's side is reported (first arrival, a new connection each).
Results: benchmarks/results/arrivals.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import logging
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent.apiclient import HttpClient, ssl_context
from agent.config import Config
from agent.direct import DirectArrival, ProgressChannel
from agent.progress import Summary
from agent.protocol import JobState
from benchmarks.common import cpu_seconds, markdown_table, rss_mib, write_json
from controller.runtime.servingcert import server_context, small_tls_buffers

NS = "bench"
JOB = "gang"
KEY = f"{NS}/{JOB}"
log = logging.getLogger("benchmarks.arrivals")


# -- the controller's side (the child process) -----------------------------------------------


def serve(
    port: int, cert: str | None, key: str | None, loop: str = "asyncio", fast: bool = True
) -> None:
    """The endpoint over one GangJob held in memory; `/bench/*` changes its status and counts
    connections."""
    from aiohttp import web

    from controller.arrivals.auth import TokenAuthenticator
    from controller.arrivals.book import ArrivalBook
    from controller.arrivals.server import arrivals_app
    from controller.runtime.fastpath import FAST_PATH, Switch

    job: dict[str, Any] = {
        "metadata": {"name": JOB, "namespace": NS, "resourceVersion": "1"},
        "status": {"epoch": 0, "barrierEpoch": None, "phase": "Running"},
    }
    book = ArrivalBook()
    connections = 0

    async def review(body: dict[str, Any]) -> dict[str, Any]:
        pod, uid = body["spec"]["token"].split("/")
        return {
            "status": {
                "authenticated": True,
                "audiences": body["spec"]["audiences"],
                "user": {
                    "username": f"system:serviceaccount:{NS}:gangjob-worker",
                    "extra": {
                        "authentication.kubernetes.io/pod-name": [pod],
                        "authentication.kubernetes.io/pod-uid": [uid],
                    },
                },
            }
        }

    auth = TokenAuthenticator(review)
    app = arrivals_app(
        book,
        auth.authenticate,
        lambda key: job if key == KEY else None,
        pod_job=lambda ns, pod: JOB,
        accepting=lambda: True,
        on_report=lambda key: None,
        lookup=auth.lookup if fast else None,
    )

    async def set_status(request: web.Request) -> web.Response:
        job["status"] = {**job["status"], **(await request.json())}
        job["metadata"]["resourceVersion"] = str(int(job["metadata"]["resourceVersion"]) + 1)
        book.job_changed(KEY)
        return web.json_response({})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"connections": connections, "reviews": auth.reviews})

    control = web.Application()
    control.router.add_post("/status", set_status)
    control.router.add_get("/stats", stats)
    app.add_subapp("/bench", control)

    async def main() -> None:
        nonlocal connections
        tls = None
        if cert:
            tls = server_context()  # the controller's
            tls.load_cert_chain(cert, key)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        loop = asyncio.get_running_loop()
        factory = runner.server
        assert factory is not None

        route = app.get(FAST_PATH)
        switches: set[Switch] = set()

        def counted() -> Any:  # the connections made, to tell kept ones from new
            nonlocal connections
            connections += 1
            return factory() if route is None else Switch(factory, route, switches)

        await loop.create_server(counted, "127.0.0.1", port, ssl=tls, backlog=4096)
        print("ready", flush=True)
        await asyncio.Event().wait()

    if cert and loop != "uvloop":
        small_tls_buffers()  # as the controller serves TLS
    if loop == "uvloop":
        # Not a dependency (docs/bench/arrivals_tls-2026-11-27.md): `pip install uvloop`.
        uvloop = importlib.import_module("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())


# -- the agents' side (this process) ---------------------------------------------------------


class Fleet:
    """N agents' arrival and progress channels to the endpoint at `url`."""

    def __init__(self, url: str, n: int, tokens: Path, tls: ssl.SSLContext | None) -> None:
        self.url = url
        self.states: list[JobState] = [JobState() for _ in range(n)]
        self._changed = asyncio.Event()
        self.clients = [HttpClient(url, ssl_context=tls) for _ in range(n)]
        self.configs = []
        for i in range(n):
            token = tokens / f"w{i}.token"
            token.write_text(f"w{i}/uid-{i}")
            self.configs.append(
                Config(JOB, f"w{i}", NS, pod_uid=f"uid-{i}", arrival_url=url,
                       arrival_token_file=token, probe_port=None)
            )  # fmt: skip
        adapter = logging.LoggerAdapter(log, {})
        self.arrivals = [
            DirectArrival(c, cfg, _NoFallback(), self._on_state(i), lambda: None, adapter)
            for i, (c, cfg) in enumerate(zip(self.clients, self.configs, strict=True))
        ]
        self.progress = [
            ProgressChannel(c, cfg, adapter)
            for c, cfg in zip(self.clients, self.configs, strict=True)
        ]

    def _on_state(self, i: int) -> Callable[[JobState], None]:
        def on_state(state: JobState) -> None:
            self.states[i] = state
            self._changed.set()

        return on_state

    async def arrive(self, epoch: int) -> None:
        await _bounded([functools.partial(a.arrive, epoch) for a in self.arrivals])

    async def send_progress(self, epoch: int) -> None:
        summary = Summary(step=10, checkpoint=None, compute=0.1, steps_per_second=1.0,
                          idle_seconds=0.5, stalled=False, malformed=0)  # fmt: skip
        sent = await asyncio.gather(*(p.send(epoch, summary) for p in self.progress))
        assert all(sent), "a progress summary was not taken"

    async def seen(self, check: Callable[[JobState], bool], timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not all(check(s) for s in self.states):
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        for a in self.arrivals:
            await a.close()
        for c in self.clients:
            await c.close()


class _NoFallback:
    async def arrive(self, epoch: int, exit: tuple[int, int] | None = None) -> None:
        raise AssertionError("the benchmark's endpoint refused a report")

    async def close(self) -> None:
        return None


async def _bounded(calls: list[Callable[[], Awaitable[None]]], width: int = 256) -> None:
    slots = asyncio.Semaphore(width)

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with slots:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


def _get(url: str, path: str, body: Any = None) -> Any:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def measure(
    n: int, epochs: int, tls: bool, workdir: Path, loop: str, path: str = "fast"
) -> dict[str, float]:
    """One run with TLS on or off, the endpoint on `loop`: the controller's figures."""
    port = _free_port()
    cert = key = None
    if tls:
        cert, key = _self_signed(workdir)
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.arrivals", "--serve", str(port), "--loop", loop]
        + ["--path", path]
        + (["--cert", cert, "--key", str(key)] if cert else []),
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"ready":
            raise RuntimeError("the endpoint did not start")
        return asyncio.run(_measure(child.pid, port, n, epochs, cert, workdir))
    finally:
        child.terminate()
        child.wait(10)


async def _measure(
    pid: int, port: int, n: int, epochs: int, cert: str | None, workdir: Path
) -> dict[str, float]:
    client_tls = ssl_context(cert) if cert else None
    tls = cert is not None
    scheme = "https" if tls else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    control_call = _control(url, client_tls)
    fleet = Fleet(url, n, workdir, client_tls)
    out: dict[str, float] = {}
    rss0 = rss_mib(pid)

    def cpu() -> float:
        return cpu_seconds(pid)

    c0, t0 = cpu(), time.monotonic()
    await fleet.arrive(0)
    await fleet.seen(functools.partial(_epoch_at, 0))
    out["first arrival: ctl CPU per arrival (ms)"] = (cpu() - c0) / n * 1e3
    out["first arrival: wall (s)"] = time.monotonic() - t0
    await asyncio.sleep(0.5)
    out["ctl RSS per open stream (KiB)"] = (rss_mib(pid) - rss0) * 1024 / n
    fan = 0.0
    conns = 0.0
    again = 0.0
    for epoch in range(1, epochs + 1):
        c0 = cpu()
        await control_call("/bench/status", {"barrierEpoch": epoch - 1})
        await fleet.seen(functools.partial(_barrier_at, epoch - 1))
        fan += cpu() - c0
        before = (await control_call("/bench/stats", None))["connections"]
        c0 = cpu()
        await control_call("/bench/status", {"epoch": epoch})
        await fleet.seen(functools.partial(_epoch_at, epoch))
        fan += cpu() - c0
        c0 = cpu()
        await fleet.arrive(epoch)
        again += cpu() - c0
        conns += (await control_call("/bench/stats", None))["connections"] - before
    out["fan-out: ctl CPU per stream per change (us)"] = fan / (2 * epochs * n) * 1e6
    out["next arrival: ctl CPU per arrival (ms)"] = again / (epochs * n) * 1e3
    out["next arrival: new connections per arrival"] = conns / (epochs * n)
    c0 = cpu()
    for _ in range(3):
        await fleet.send_progress(epochs)
    out["progress: ctl CPU per summary (ms)"] = (cpu() - c0) / (3 * n) * 1e3
    out["ctl RSS (MiB)"] = rss_mib(pid)
    await fleet.close()
    return out


def _epoch_at(epoch: int, state: JobState) -> bool:
    return state.epoch == epoch


def _barrier_at(epoch: int, state: JobState) -> bool:
    return state.barrier_epoch == epoch


def _control(url: str, tls: ssl.SSLContext | None) -> Callable[[str, Any], Awaitable[Any]]:
    client = HttpClient(url, ssl_context=tls)

    async def call(path: str, body: Any) -> Any:
        if body is None:
            return await client.get(path)
        return await client.post(path, body)

    return call


def _self_signed(workdir: Path) -> tuple[str, str]:
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.arrivals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tls", choices=("off", "on", "both"), default="off")
    parser.add_argument(
        "--loop",
        default="asyncio",
        help="the endpoint's event loop: asyncio, uvloop, or both side by side (asyncio,uvloop)",
    )
    parser.add_argument(
        "--path",
        default="fast",
        help="the endpoint's request path: fast (controller.runtime.fastpath, as deployed), "
        "aiohttp (aiohttp's request handling alone), or both, alternating (fast,aiohttp)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole set this often")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.cert, args.key, args.loop, args.path == "fast")
        return 0
    logging.basicConfig(level=logging.WARNING)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.tls]
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round in range(1, args.rounds + 1):
            for loop in args.loop.split(","):
                for tls in modes:
                    for path in args.path.split(","):
                        name = ("TLS on" if tls else "TLS off") + f", {loop}, {path}"
                        if args.rounds > 1:
                            name += f" #{round}"
                        rows[name] = measure(args.agents, args.epochs, tls, Path(tmp), loop, path)
                        print(name, json.dumps(rows[name], indent=1), flush=True)
    metrics = list(next(iter(rows.values())))
    table = markdown_table(
        ["figure", *rows], [[m, *(f"{rows[r][m]:.3g}" for r in rows)] for m in metrics]
    )
    text = f"# Arrival endpoint, N={args.agents} agents, {args.epochs} epochs\n\n{table}\n"
    print(text)
    write_json("arrivals", {"agents": args.agents, "epochs": args.epochs, "rows": rows})
    with contextlib.suppress(OSError):
        (Path(__file__).parent / "results" / "arrivals.md").write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
