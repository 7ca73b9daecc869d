"""Tracing: exporters only on request, a span per reconcile, one per restart."""

from __future__ import annotations

import datetime as dt

import pytest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from controller.runtime.tracing import (
    exporters_from_env,
    get_tracer,
    reconcile_span,
    record_restart_span,
    setup_tracing,
)


def test_no_exporter_unless_asked() -> None:
    assert exporters_from_env({}) == []
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporters_from_env({"OTEL_TRACES_EXPORTER": "no-such-exporter"}) == []
    (console,) = exporters_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(console, ConsoleSpanExporter)


def test_reconcile_and_restart_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(env={}, exporters=[exporter], set_global=False)
    tracer = get_tracer(provider)
    with reconcile_span(tracer, "ns", "job"):
        pass
    with pytest.raises(RuntimeError), reconcile_span(tracer, "ns", "job"):
        raise RuntimeError("boom")
    detected = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    record_restart_span(
        tracer,
        "ns",
        "job",
        epoch=3,
        trigger_class="NodeLost",
        mode="Pod",
        detected_at=detected,
        barrier_open_at=detected + dt.timedelta(seconds=3.5),
        recreated=[2],
    )
    provider.force_flush()
    ok, failed, restart = exporter.get_finished_spans()
    assert ok.name == "reconcile"
    assert ok.attributes is not None
    assert ok.attributes["gangjob.name"] == "job"
    assert failed.status.status_code is StatusCode.ERROR
    assert restart.name == "gang_restart"
    assert restart.end_time is not None
    assert restart.start_time is not None
    assert (restart.end_time - restart.start_time) / 1e9 == pytest.approx(3.5)
    assert restart.attributes is not None
    assert restart.attributes["gangjob.epoch"] == 3
    provider.shutdown()


def test_sdk_disabled_exports_nothing() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(
        env={"OTEL_SDK_DISABLED": "true"}, exporters=[exporter], set_global=False
    )
    with reconcile_span(get_tracer(provider), "ns", "job"):
        pass
    provider.force_flush()
    assert exporter.get_finished_spans() == ()
