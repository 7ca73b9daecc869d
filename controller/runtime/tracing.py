"""OpenTelemetry tracing for the controller: the tracer provider, a span per reconcile, and a
span per gang restart.

Spans are exported only when the standard environment asks (`OTEL_TRACES_EXPORTER=console`,
or any exporter installed under the `opentelemetry_traces_exporter` entry point such as
`otlp`). Unset means no exporter: unlike the SDK's own default (otlp) the controller must not
try to reach a collector nobody configured. `OTEL_SDK_DISABLED=true` turns tracing off.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, Status, StatusCode, Tracer

__all__ = ["SERVICE_NAME", "reconcile_span", "record_restart_span", "setup_tracing"]

log = logging.getLogger(__name__)

SERVICE_NAME = "gangjob-controller"
INSTRUMENTATION = "gangjob.controller"


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters `OTEL_TRACES_EXPORTER` names; unknown names are logged and skipped."""
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
            continue
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            log.warning("OTEL_TRACES_EXPORTER=%s: no such exporter installed; ignoring", name)
            continue
        exporter_class = next(iter(found)).load()
        exporters.append(exporter_class())
    return exporters


def setup_tracing(
    service_name: str = SERVICE_NAME,
    *,
    env: Mapping[str, str] | None = None,
    exporters: Sequence[SpanExporter] | None = None,
    set_global: bool = True,
) -> TracerProvider:
    """A tracer provider exporting to `exporters` (default: those the environment names).

    The resource takes OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES over `service_name`; the
    sampler follows OTEL_TRACES_SAMPLER. Call `provider.shutdown()` at exit to flush."""
    env = os.environ if env is None else env
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if not disabled:
        for exporter in exporters_from_env(env) if exporters is None else exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def get_tracer(provider: trace.TracerProvider | None = None) -> Tracer:
    return trace.get_tracer(INSTRUMENTATION, tracer_provider=provider)


@contextmanager
def reconcile_span(
    tracer: Tracer, namespace: str, name: str, *, controller: str = "gangjob"
) -> Iterator[Span]:
    """A span around one reconcile of `namespace/name`; an exception marks it as an error."""
    with tracer.start_as_current_span(
        "reconcile",
        attributes={
            "controller": controller,
            "k8s.namespace.name": namespace,
            "gangjob.name": name,
        },
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


def record_restart_span(
    tracer: Tracer,
    namespace: str,
    name: str,
    *,
    epoch: int,
    trigger_class: str,
    mode: str,
    detected_at: dt.datetime,
    barrier_open_at: dt.datetime,
    recreated: Sequence[int] = (),
    trigger_worker: int | None = None,
    failed: bool = False,
) -> None:
    """One span for a whole gang restart, from detection to the barrier opening at `epoch`.

    The restart spans many reconciles, so the span is written once it is over, with its
    real start and end times."""
    attributes: dict[str, str | int | Sequence[int]] = {
        "k8s.namespace.name": namespace,
        "gangjob.name": name,
        "gangjob.epoch": epoch,
        "gangjob.restart.class": trigger_class,
        "gangjob.restart.mode": mode,
        "gangjob.restart.recreated": list(recreated),
    }
    if trigger_worker is not None:
        attributes["gangjob.restart.worker"] = trigger_worker
    span = tracer.start_span("gang_restart", attributes=attributes, start_time=_nanos(detected_at))
    if failed:
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=_nanos(barrier_open_at))


def _nanos(at: dt.datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)
