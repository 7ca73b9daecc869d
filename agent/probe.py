"""`Pod` mode's probe endpoint: `GET /barrier` answers 200 once the barrier of the agent's epoch
is open (or, for a worker outside that epoch's world, once its launcher may start and hold),
else 503 — the kubelet's startup probe, which holds the trainer container back until then;
`GET /healthz` answers 200 while the agent runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from api.constants import BARRIER_PATH, HEALTHZ_PATH

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
# The kubelet sends a handful of headers; anything bigger or slower is not a probe.
_MAX_HEADER_LINES = 64
_READ_TIMEOUT = 5.0


class ProbeServer:
    """Serves the probe paths on `host:port` (port 0 picks a free one, see `port`)."""

    def __init__(self, host: str, port: int, is_open: Callable[[], bool]) -> None:
        self._host = host
        self._requested_port = port
        self._is_open = is_open
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._requested_port, reuse_address=True
        )

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("probe server not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, str]:
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "GET only\n"
        if path == HEALTHZ_PATH:
            return 200, "ok\n"
        if path == BARRIER_PATH:
            return (200, "open\n") if self._is_open() else (503, "waiting\n")
        return 404, "not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                request = await reader.readline()
                for _ in range(_MAX_HEADER_LINES):
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
            parts = request.decode("latin-1").split()
            if len(parts) < 2:
                return
            status, body = self.answer(parts[0], parts[1])
            data = body.encode() if parts[0] == "GET" else b""
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + data
            )
            await writer.drain()
        except (OSError, TimeoutError, ValueError):
            pass  # a probe that went away; the kubelet will ask again
        finally:
            writer.close()
