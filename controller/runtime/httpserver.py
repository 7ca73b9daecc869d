"""`HttpServer`: serves one aiohttp application on host:port (the probes and metrics, the
arrival endpoint), with a clean start and stop."""

from __future__ import annotations

import ssl

from aiohttp import web

__all__ = ["HttpServer"]


class HttpServer:
    """Serves `app` on host:port (port 0 picks a free one: see `port` once started)."""

    def __init__(
        self,
        app: web.Application,
        host: str = "0.0.0.0",
        port: int = 8080,
        backlog: int = 128,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._ssl = ssl_context
        self._host = host
        self._port = port
        self._backlog = backlog
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self._host, self._port, backlog=self._backlog, ssl_context=self._ssl
        )
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
