"""The health server: /healthz, /readyz gated on cache sync, /metrics in Prometheus text."""

from __future__ import annotations

import aiohttp

from controller.runtime import metrics
from controller.runtime.httpserver import HttpServer
from controller.runtime.probes import probes_app


async def test_endpoints() -> None:
    synced = False
    live = True
    metrics.WORKQUEUE_DEPTH.labels("health-test").set(3)
    app = probes_app(lambda: synced, healthy=lambda: live)
    async with HttpServer(app, "127.0.0.1", 0) as server, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.port}"
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 503
        synced = True
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        live = False
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 503
        async with http.get(f"{base}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
        assert 'workqueue_depth{name="health-test"} 3.0' in text
        assert "# TYPE controller_runtime_reconcile_total counter" in text


def test_track_reconcile_counts_results_and_errors() -> None:
    def value(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    with metrics.track_reconcile("track-test") as record:
        assert value("controller_runtime_active_workers", controller="track-test") == 1
        record.result = "requeue_after"
    try:
        with metrics.track_reconcile("track-test"):
            raise ValueError("boom")
    except ValueError:
        pass
    assert value("controller_runtime_active_workers", controller="track-test") == 0
    assert (
        value("controller_runtime_reconcile_total", controller="track-test", result="requeue_after")
        == 1
    )
    assert value("controller_runtime_reconcile_total", controller="track-test", result="error") == 1
    assert value("controller_runtime_reconcile_errors_total", controller="track-test") == 1
    assert value("controller_runtime_reconcile_time_seconds_count", controller="track-test") == 2
