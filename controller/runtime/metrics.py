"""The controller's Prometheus registry and every metric it exports.

Names follow controller-runtime and client-go (`controller_runtime_*`, `workqueue_*`,
`rest_client_*`, `leader_election_*`) so existing dashboards work; `gangjob_*` are ours.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from api.constants import ConditionType

__all__ = [
    "CONTENT_TYPE_LATEST",
    "REGISTRY",
    "ReconcileRecord",
    "render",
    "track_reconcile",
]

# Our own registry rather than the process-global one, so that /metrics shows exactly what this
# module declares plus the standard process collectors, and tests can read values from it.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# -- controller-runtime: reconciler ------------------------------------------------------------
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Total number of reconciliations per controller",
    ["controller", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total",
    "Total number of reconciliation errors per controller",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    ["controller"],
    # controller-runtime's buckets
    buckets=(
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7,
        0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15,
        20, 25, 30, 40, 50, 60,
    ),
    registry=REGISTRY,
)  # fmt: skip
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    ["controller"],
    registry=REGISTRY,
)
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    ["controller"],
    registry=REGISTRY,
)

# -- controller-runtime: work queue ------------------------------------------------------------
WORKQUEUE_DEPTH = Gauge(
    "workqueue_depth", "Current depth of workqueue", ["name"], registry=REGISTRY
)
WORKQUEUE_ADDS = Counter(
    "workqueue_adds_total", "Total number of adds handled by workqueue", ["name"],
    registry=REGISTRY,
)  # fmt: skip
_QUEUE_BUCKETS = tuple(1e-8 * 10**i for i in range(10))  # 10 ns .. 10 s, as controller-runtime
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    ["name"],
    buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes",
    ["name"],
    buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries_total", "Total number of retries handled by workqueue", ["name"],
    registry=REGISTRY,
)  # fmt: skip

# -- client-go: REST client ----------------------------------------------------------------------
REST_CLIENT_REQUESTS = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests, partitioned by status code, method, and resource",
    ["code", "method", "resource"],
    registry=REGISTRY,
)
REST_CLIENT_DURATION = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds, by method and resource (watches excluded)",
    ["method", "resource"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
    registry=REGISTRY,
)

# -- client-go: leader election ------------------------------------------------------------------
LEADER_STATUS = Gauge(
    "leader_election_master_status",
    "1 if this process holds the named lease, 0 otherwise",
    ["name"],
    registry=REGISTRY,
)

# -- gangjob -------------------------------------------------------------------------------------
RESTARTS = Counter(
    "gangjob_restarts_total",
    "Gang restarts, by failure class and the action taken",
    ["class", "action"],
    registry=REGISTRY,
)
RESTART_DURATION = Histogram(
    "gangjob_restart_duration_seconds",
    "From failure detection to the barrier opening at the new epoch, by restart mode",
    ["mode"],
    buckets=(0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600),
    registry=REGISTRY,
)
ARRIVAL_REPORTS = Counter(
    "gangjob_arrival_reports_total",
    "Arrival reports agents sent to the controller's endpoint, by result: accepted, "
    "unauthorized (bad token), forbidden (token of another pod, or a report for another "
    "pod's GangJob), invalid, unknown (no such "
    "GangJob), unavailable (not the leader, or the token could not be checked), throttled "
    "(over the endpoint's limits: 429)",
    ["result"],
    registry=REGISTRY,
)
PROGRESS_REPORTS = Counter(
    "gangjob_progress_reports_total",
    "Progress summaries agents sent to the controller's endpoint, by result (as "
    "gangjob_arrival_reports_total)",
    ["result"],
    registry=REGISTRY,
)
ARRIVAL_STREAMS = Gauge(
    "gangjob_arrival_streams",
    "Open answers to arrival reports (each a worker waiting at, or running past, its barrier)",
    registry=REGISTRY,
)
RESTART_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
"""A restart step's share and its status write: one scale, so that the two compare."""
RESTART_STEP = Histogram(
    "gangjob_restart_controller_seconds",
    "The controller's own share of a restart: from the watch event that made the key dirty "
    "to the status write returning; step=bump (failure seen -> epoch written) or "
    "step=barrier (last arrival seen -> barrier written)",
    ["step"],
    buckets=RESTART_STEP_BUCKETS,
    registry=REGISTRY,
)
RESTART_STEP_WRITE = Histogram(
    "gangjob_restart_controller_write_seconds",
    "Of gangjob_restart_controller_seconds, the status write's own latency: the request to the "
    "apiserver and back (step=bump or step=barrier); the rest is the controller's pass",
    ["step"],
    buckets=RESTART_STEP_BUCKETS,
    registry=REGISTRY,
)
EPOCH = Gauge(
    "gangjob_epoch",
    "The GangJob's status.epoch",
    ["namespace", "name"],
    registry=REGISTRY,
)
BARRIER_EPOCH = Gauge(
    "gangjob_barrier_epoch",
    "The GangJob's status.barrierEpoch: below gangjob_epoch while the gang restarts",
    ["namespace", "name"],
    registry=REGISTRY,
)
CONDITION = Gauge(
    "gangjob_condition",
    "1 while the GangJob's condition of this type is True, else 0 (Stuck, ArrivalDegraded, "
    "ModeDegraded, GangScheduling, Ready...)",
    ["namespace", "name", "condition"],
    registry=REGISTRY,
)
PROGRESS_STEP = Gauge(
    "gangjob_progress_step",
    "The GangJob's status.progress.step: the lowest training step its workers reported",
    ["namespace", "name"],
    registry=REGISTRY,
)
STEPS_PER_SECOND = Gauge(
    "gangjob_steps_per_second",
    "The GangJob's status.progress.stepsPerSecond",
    ["namespace", "name"],
    registry=REGISTRY,
)
GOODPUT_RATIO = Gauge(
    "gangjob_goodput_ratio",
    "The GangJob's status.goodput.ratio: productive time / wall time since it started",
    ["namespace", "name"],
    registry=REGISTRY,
)
BADPUT_SECONDS = Counter(
    "gangjob_badput_seconds_total",
    "Wall time of all GangJobs that trained nothing, by cause (status.goodput.lostSeconds)",
    ["cause"],
    registry=REGISTRY,
)
STRAGGLERS = Gauge(
    "gangjob_stragglers",
    "Workers of the GangJob found straggling (listed in status.progress.stragglers)",
    ["namespace", "name"],
    registry=REGISTRY,
)
STRAGGLERS_FOUND = Counter(
    "gangjob_stragglers_found_total",
    "Workers found straggling, each once per epoch it is found at (a Straggler Event each)",
    registry=REGISTRY,
)
BADPUT_CAUSES: Final = ("scheduling", "detection", "restart", "recompute")
PER_JOB: Final = (
    EPOCH, BARRIER_EPOCH, PROGRESS_STEP, STEPS_PER_SECOND, GOODPUT_RATIO, STRAGGLERS,
)  # fmt: skip
"""The series labelled by one GangJob, removed with it (`forget_job`)."""


def forget_job(namespace: str, name: str) -> None:
    """Drops a deleted GangJob's series: a cluster that runs thousands of jobs over time must
    not export them all for ever."""
    for gauge in PER_JOB:
        with suppress(KeyError):
            gauge.remove(namespace, name)
    for condition in ConditionType:
        with suppress(KeyError):
            CONDITION.remove(namespace, name, str(condition))


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The registry in the Prometheus text format (serve with `CONTENT_TYPE_LATEST`)."""
    return generate_latest(registry)


@dataclass
class ReconcileRecord:
    """Filled in by the reconciler inside `track_reconcile`: how the pass ended."""

    result: str = "success"  # success | requeue | requeue_after (error is set on exceptions)


@contextmanager
def track_reconcile(controller: str) -> Iterator[ReconcileRecord]:
    """Count one reconcile: active workers, its duration, its result, errors on exceptions."""
    record = ReconcileRecord()
    ACTIVE_WORKERS.labels(controller).inc()
    start = time.perf_counter()
    try:
        yield record
    except Exception:
        record.result = "error"
        RECONCILE_ERRORS.labels(controller).inc()
        raise
    finally:
        ACTIVE_WORKERS.labels(controller).dec()
        RECONCILE_TIME.labels(controller).observe(time.perf_counter() - start)
        RECONCILE_TOTAL.labels(controller, record.result).inc()
