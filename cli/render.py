"""What `gangjob status` prints of a GangJob (its state and its restart history) and `gangjob
list` of many, as text tables. Pure: GangJobs in, lines out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gangjob.model import Job


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned to their widest cell, two spaces apart, as kubectl prints them."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def restart_rows(status: Mapping[str, Any]) -> list[list[str]]:
    """One row per restart, oldest first: the history, then the restart in progress."""
    records: list[Mapping[str, Any]] = list(status.get("history") or [])
    last = status.get("lastRestart")
    if last and not any(r.get("epoch") == last.get("epoch") for r in records):
        records.append(last)
    rows = []
    for r in records:
        trigger = r.get("trigger") or {}
        worker = trigger.get("worker")
        duration = r.get("durationSeconds")
        lost = r.get("lostSteps")
        lost_seconds = r.get("lostSeconds")
        rows.append(
            [
                _text(r.get("epoch")),
                "gang" if worker is None else f"worker {worker}",
                _text(trigger.get("class")),
                _text(trigger.get("action")),
                _text(r.get("detectedAt")),
                "in progress" if duration is None else f"{duration:.2f}s",
                _text(lost) if lost_seconds is None else f"{lost} ({lost_seconds:.0f}s)",
                _text(trigger.get("detail")),
            ]
        )
    return rows


def progress_lines(status: Mapping[str, Any]) -> list[str]:
    """The gang's step, rate and last checkpoint, and its goodput with the lost time by cause;
    nothing for a job whose trainers report no progress."""
    lines = []
    progress = status.get("progress") or {}
    if progress.get("step") is not None:
        rate = progress.get("stepsPerSecond")
        lines.append(
            f"Progress: step {progress['step']}"
            + (f" at {rate:.2f} steps/s" if rate is not None else "")
            + f", last checkpoint {_text(progress.get('checkpointStep'))}"
            + f" ({progress.get('reporting', 0)} workers reporting,"
            + f" as of {_text(progress.get('updatedAt'))})"
        )
    goodput = status.get("goodput") or {}
    if goodput.get("ratio") is not None:
        lost = goodput.get("lostSeconds") or {}
        causes = ", ".join(
            f"{cause} {float(lost.get(cause, 0)):.0f}s"
            for cause in ("scheduling", "detection", "restart", "recompute")
        )
        lines.append(
            f"Goodput: {100 * goodput['ratio']:.1f}% "
            f"({float(goodput.get('productiveSeconds', 0)):.0f}s productive of "
            f"{float(goodput.get('wallSeconds', 0)):.0f}s; lost: {causes})"
        )
    return lines


def status_lines(job: Mapping[str, Any]) -> list[str]:
    """The job's phase, epoch, barrier and workers, then its restarts with trigger, class and
    duration."""
    status: Mapping[str, Any] = job.get("status") or {}
    workers = status.get("workers") or {}
    restarts = status.get("restarts") or {}
    replicas = _get(job, "spec", "replicas")
    lines = table(
        ["NAME", "PHASE", "EPOCH", "BARRIER", "READY", "ARRIVED", "WORKERS", "MODE"],
        [
            [
                _text(_get(job, "metadata", "name")),
                _text(status.get("phase") or "Pending"),
                _text(status.get("epoch", 0)),
                _text(status.get("barrierEpoch")),
                f"{workers.get('ready', 0)}/{replicas}",
                f"{workers.get('arrived', 0)}/{replicas}",
                f"{workers.get('total', 0)}/{replicas}",
                _text(status.get("mode") or _get(job, "spec", "restart", "mode")),
            ]
        ],
    )
    lines.append("")
    lines += progress_lines(status)
    lines.append(
        f"Restarts: {restarts.get('total', 0)} ({restarts.get('inPlace', 0)} in place, "
        f"{restarts.get('counted', 0)} counted, "
        f"{restarts.get('recreatedWorkers', 0)} workers recreated)"
    )
    rows = restart_rows(status)
    if rows:
        header = ["EPOCH", "TRIGGER", "CLASS", "ACTION", "DETECTED", "DURATION", "LOST", "DETAIL"]
        lines += table(header, rows)
    return lines


def age(since: datetime | None, now: datetime) -> str:
    """kubectl's short age: 45s, 12m, 3h4m, 2d5h."""
    if since is None:
        return "<unknown>"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes and hours < 6 else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours and days < 8 else f"{days}d"


def list_lines(
    jobs: Sequence[Job], *, all_namespaces: bool, now: datetime | None = None
) -> list[str]:
    """One row per job: phase, workers ready, epoch, restarts, step, goodput, age."""
    now = now or datetime.now(UTC)
    header = ["NAME", "PHASE", "READY", "EPOCH", "RESTARTS", "STEP", "GOODPUT", "AGE"]
    rows = [
        [
            job.name,
            job.phase,
            f"{job.workers_ready}/{job.workers}",
            str(job.epoch),
            str(job.restarts),
            _text(job.step),
            "-" if job.goodput is None else f"{100 * job.goodput:.1f}%",
            age(job.resource.metadata.creation_timestamp, now),
        ]
        for job in jobs
    ]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
        rows = [[job.namespace, *row] for job, row in zip(jobs, rows, strict=True)]
    return table(header, rows)
