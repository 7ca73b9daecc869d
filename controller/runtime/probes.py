"""The controller's probes and metrics, for the kubelet and Prometheus: /healthz, /readyz, /metrics.

/readyz answers 200 only once the caches have synced (as controller-runtime's manager does);
/healthz reports whether the process is live (by default always, or a leader-election check).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.runtime import metrics

__all__ = ["probes_app"]

Check = Callable[[], bool]


def probes_app(
    ready: Check,
    *,
    healthy: Check | None = None,
    registry: CollectorRegistry = metrics.REGISTRY,
) -> web.Application:
    """The probes and metrics application: `ready()` gates /readyz, `healthy()` gates /healthz;
    /metrics renders `registry`. Serve it with `controller.runtime.httpserver.HttpServer`."""

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
