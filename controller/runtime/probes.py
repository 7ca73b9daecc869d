"""The controller's HTTP endpoints for the kubelet and Prometheus: /healthz, /readyz, /metrics.

/readyz answers 200 only once the caches have synced (as controller-runtime's manager does);
/healthz reports whether the process is live (by default always, or a leader-election check).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.runtime import metrics

__all__ = ["HealthServer", "make_app"]

Check = Callable[[], bool]


def make_app(
    ready: Check,
    *,
    healthy: Check | None = None,
    registry: CollectorRegistry = metrics.REGISTRY,
) -> web.Application:
    """The aiohttp application: `ready()` gates /readyz, `healthy()` gates /healthz."""

    async def healthz(_: web.Request) -> web.Response:
        return _check(healthy() if healthy is not None else True)

    async def readyz(_: web.Request) -> web.Response:
        return _check(ready())

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(
            body=metrics.render(registry), headers={"Content-Type": metrics.CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app


def _check(ok: bool) -> web.Response:
    return web.Response(text="ok" if ok else "not ok", status=200 if ok else 503)


class HealthServer:
    """Serves `make_app(...)` on host:port (port 0 picks a free one: see `port`)."""

    def __init__(
        self, app: web.Application, host: str = "0.0.0.0", port: int = 8080, backlog: int = 128
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._host = host
        self._port = port
        self._backlog = backlog
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=self._backlog)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
