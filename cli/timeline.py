"""A job's history as what `gangjob report` draws: the gang's step (or, for a job whose trainers
report no progress, its epoch) over time, and each restart with its class, its duration and the
work it lost. Pure: a GangJob dict in; the drawing is cli.report's.

The status keeps no series of steps, only the points a restart records (the step at the failure
and the checkpoint the gang resumed from) and the latest progress: the line joins them. Between
two points the gang trained at a steady rate, as far as the status can tell."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.v1alpha1 import parse_gangjob


class ReportError(Exception):
    """The picture cannot be drawn (no matplotlib, an unknown file type); the message says why."""


@dataclass(frozen=True)
class Restart:
    """One restart as drawn."""

    epoch: int
    failure_class: str
    onset: datetime
    """When the failure began (a hang: the stalled worker's last step)."""
    detected: datetime
    resumed: datetime | None
    """The barrier opened: every worker back; None while it is in progress."""
    duration_seconds: float | None
    step: int | None
    """The gang's step when it failed."""
    checkpoint_step: int | None
    """The step it resumed from; the steps between were lost."""
    lost_seconds: float | None
    """The time to compute the lost steps again, after resuming."""

    @property
    def label(self) -> str:
        took = "in progress" if self.duration_seconds is None else f"{self.duration_seconds:.1f}s"
        lost = ""
        if self.step is not None and self.checkpoint_step is not None:
            steps = self.step - self.checkpoint_step
            lost = f", lost {steps} step{'' if steps == 1 else 's'}"
        return f"{self.failure_class} ({took}{lost})"


@dataclass(frozen=True)
class Timeline:
    name: str
    phase: str
    start: datetime
    end: datetime
    quantity: str
    """`step` or `epoch`: what `points` count."""
    points: list[tuple[datetime, float]]
    restarts: list[Restart]
    goodput: float | None


def timeline(obj: Mapping[str, Any], now: datetime) -> Timeline:
    """The job's timeline until its completion, else `now`."""
    job = parse_gangjob(obj)
    st = job.status
    records = list(st.history)
    if st.last_restart is not None and not any(r.epoch == st.last_restart.epoch for r in records):
        records.append(st.last_restart)
    restarts = [
        Restart(
            epoch=r.epoch,
            failure_class=r.trigger.failure_class,
            onset=r.onset_at or r.detected_at,
            detected=r.detected_at,
            resumed=r.barrier_open_at,
            duration_seconds=r.duration_seconds,
            step=r.step,
            checkpoint_step=r.checkpoint_step,
            lost_seconds=r.lost_seconds,
        )
        for r in records
    ]
    start = (
        st.start_time
        or job.metadata.creation_timestamp
        or min((r.onset for r in restarts), default=now)
    )
    end = st.completion_time or now
    progress = st.progress
    if progress is not None and progress.step is not None:
        points: list[tuple[datetime, float]] = [(start, 0.0)]
        for r in restarts:
            if r.step is None:
                continue
            points.append((r.onset, float(r.step)))
            if r.resumed is not None and r.checkpoint_step is not None:
                # Stopped from the failure to the barrier, then back at the checkpoint.
                points.append((r.resumed, float(r.step)))
                points.append((r.resumed, float(r.checkpoint_step)))
        points.append((progress.updated_at or end, float(progress.step)))
        quantity = "step"
    else:
        points = [(start, 0.0)]
        for r in restarts:
            points += [(r.detected, float(r.epoch - 1)), (r.detected, float(r.epoch))]
        points.append((end, float(st.epoch)))
        quantity = "epoch"
    return Timeline(
        name=job.metadata.name,
        phase=str(st.phase or "Pending"),
        start=start,
        end=max(end, points[-1][0]),
        quantity=quantity,
        points=sorted(points, key=lambda p: p[0]),
        restarts=restarts,
        goodput=st.goodput.ratio if st.goodput else None,
    )
