"""`HttpServer`: serves one aiohttp application on host:port (the probes and metrics, the
arrival endpoint), with a clean start and stop; an app with a fast path
(`controller.runtime.fastpath`) is served through it."""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from controller.runtime.fastpath import FAST_PATH, Switch

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
        self._app = app
        self._runner = web.AppRunner(app, access_log=None)
        self._ssl = ssl_context
        self._host = host
        self._port = port
        self._backlog = backlog
        self._server: asyncio.Server | None = None
        self._switches: set[Switch] = set()
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        route = self._app.get(FAST_PATH)
        if route is None:
            site = web.TCPSite(
                self._runner, self._host, self._port, backlog=self._backlog, ssl_context=self._ssl
            )
            await site.start()
            addresses = self._runner.addresses
            self.port = int(addresses[0][1]) if addresses else self._port
            return
        factory = self._runner.server
        assert factory is not None
        switches = self._switches
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Switch(factory, route, switches),
            self._host,
            self._port,
            backlog=self._backlog,
            ssl=self._ssl,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections
        await self._runner.cleanup()  # the app's shutdown: its streams end
        for switch in list(self._switches):
            switch.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
