"""The gang's training progress and what its failures cost (docs/design.md section 4.8), pure:
`status.progress` from what the workers' agents report, written at most every
`write_seconds` and at each restart; what a failure lost, stamped on its restart
record; and `status.goodput`, productive time against wall time, with the lost time by cause.

Definitions (docs/api.md "Goodput"): wall time runs from `status.startTime` to now (or the
job's end). Lost time is `scheduling` (start -> the first barrier opened), and for each
restart `detection` (the failure's onset -> the epoch raised), `restart` (epoch raised ->
barrier open) and `recompute` (the steps since the last checkpoint, at the gang's step rate
before the failure). Productive time is the rest; goodput is productive / wall.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from api.v1alpha1 import BadputSeconds, GoodputStatus, ProgressStatus, RestartRecord
from controller.policy import straggler
from controller.policy.passstate import Pass
from controller.policy.podspec import summary_seconds
from controller.policy.views import WorkerProgress

PROGRESS_WRITE_SECONDS: Final = 30.0
"""`status.progress` and `status.goodput` are written at most this often while the gang runs
(and at each restart): every GangJob write is sent to every agent. Large gangs write them once
per summary period instead (`write_seconds`)."""
STRAGGLER_WRITE_SECONDS: Final = 5.0
"""A change of the stragglers found is written at once, but no sooner than this after the
progress was last written: workers that come and go cost a bounded rate of writes."""


def write_seconds(workers: int) -> float:
    """How often a gang of `workers` refreshes its progress while it runs: every
    `PROGRESS_WRITE_SECONDS`, and for gangs whose agents summarise less often than that
    (`summary_seconds`: N/50 s above 1500 workers), once per summary period. A refresh sooner
    would only extrapolate the same summaries, and it costs a pass over every worker and a
    write every agent's stream is woken by."""
    return max(PROGRESS_WRITE_SECONDS, summary_seconds(workers))


def reports(p: Pass) -> list[WorkerProgress]:
    """The progress of the running roles' live workers at the pass's epoch."""
    found = []
    for rank in p.active():
        pod = p.gang.live.get(rank)
        progress = pod.progress if pod is not None else None
        if progress is not None and progress.epoch == p.status.epoch:
            found.append(progress)
    return found


def step_at(worker: WorkerProgress, at: datetime | None) -> int | None:
    """The worker's step at `at`: the one it reported, or, for a worker that was still
    stepping, that step and the steps its rate gives since (summaries come every 30 s; a stall
    and a new checkpoint come at once, so those are exact)."""
    if worker.step is None or at is None or worker.stalled or not worker.steps_per_second:
        return worker.step
    if worker.last_step_at is None or at <= worker.last_step_at:
        return worker.step
    return worker.step + int(worker.steps_per_second * (at - worker.last_step_at).total_seconds())


def gang_progress(
    found: Sequence[WorkerProgress], now: datetime, at: datetime | None = None
) -> ProgressStatus | None:
    """The gang's progress: its lowest step (a synchronous gang is where its slowest worker is),
    the median step rate, and the latest checkpoint a worker reported (a checkpoint is the
    gang's: the step it can resume from, docs/api.md "Progress"; a worker that died just after
    one may not have said so); with `at`, the steps as they were then (`step_at`)."""
    stepped = [(w, s) for w in found if (s := step_at(w, at)) is not None]
    steps = [s for _, s in stepped]
    if at is not None:
        # At a failure, a stalled worker's step is exact, and in a synchronous gang the others
        # cannot have passed it; the step carried on at a rate is an estimate (summaries are up
        # to 30 s old, the step's change seen within a poll), and one without a rate only a
        # lower bound. The best there is tells the step.
        exact = [s for w, s in stepped if w.stalled]
        carried = [s for w, s in stepped if w.steps_per_second]
        steps = exact or carried or steps
    if not steps:
        return None
    rates = [w.steps_per_second for w in found if w.steps_per_second is not None]
    checkpoints = [w.checkpoint for w in found]
    return ProgressStatus(
        step=min(steps),
        steps_per_second=round(statistics.median(rates), 4) if rates else None,
        checkpoint_step=max((c for c in checkpoints if c is not None), default=None),
        reporting=len(steps),
        malformed_lines=sum(w.malformed for w in found),
        updated_at=now,
    )


def lost_work(
    progress: ProgressStatus | None,
) -> tuple[int | None, int | None, int | None, float | None]:
    """(step, checkpoint step, lost steps, lost seconds) of a gang failing at `progress`."""
    if progress is None or progress.step is None:
        return None, None, None, None
    checkpoint = progress.checkpoint_step
    lost = progress.step - checkpoint if checkpoint is not None else progress.step
    lost = max(0, lost)
    rate = progress.steps_per_second
    seconds = round(lost / rate, 3) if rate else None
    return progress.step, checkpoint, lost, seconds


def on_restart(p: Pass, record: RestartRecord, onset_at: datetime | None) -> RestartRecord:
    """The restart record of a failure, with what it lost: the gang's step when the failure
    began and its checkpoint, as the workers last reported them (else the status), and when
    the failure began."""
    current = gang_progress(reports(p), p.stamp, at=onset_at or p.now) or p.status.progress
    step, checkpoint, lost_steps, lost_seconds = lost_work(current)
    return record.model_copy(
        update={
            "onset_at": onset_at or record.detected_at,
            "step": step,
            "checkpoint_step": checkpoint,
            "lost_steps": lost_steps,
            "lost_seconds": lost_seconds,
        }
    )


def account(p: Pass) -> None:
    """`status.progress` and `status.goodput`, refreshed at each restart and barrier, when the
    job ends, and while trainers report at most every `write_seconds` (the pass looks again
    then). Runs after every step, the passes that end early included."""
    s = p.status
    period = write_seconds(len(p.job.spec.workers))
    observed = p.observed.job.status
    if s.start_time is None or observed.completion_time is not None:
        return
    first = observed.barrier_epoch is None and s.barrier_epoch is not None
    event = bool(p.restart_started or p.restart_finished or first or p.is_finished())
    if first or p.restart_finished is not None:
        s.goodput = _charged(p, s.goodput or GoodputStatus(), first=first)
    current = gang_progress(reports(p), p.stamp)
    last = s.progress.updated_at if s.progress is not None else None
    elapsed = None if last is None else (p.stamp - last).total_seconds()
    due = current is not None and (elapsed is None or elapsed >= period)
    before = list(s.progress.stragglers or ()) if s.progress is not None else []
    after = _stragglers(p, before)
    if after != before and not (event or due):
        # Found (or gone): written at once, but at most every STRAGGLER_WRITE_SECONDS.
        if elapsed is not None and elapsed < STRAGGLER_WRITE_SECONDS:
            p.requeue(STRAGGLER_WRITE_SECONDS - elapsed)
            after = before
        else:
            due = True
    if current is not None and (event or due):
        s.progress = current.model_copy(update={"stragglers": after or None})
    elif after != before:
        s.progress = (s.progress or ProgressStatus()).model_copy(
            update={"stragglers": after or None}
        )
    if event or due:
        s.goodput = _totals(p, s.goodput or GoodputStatus())
    recorded = list(s.progress.stragglers or ()) if s.progress is not None else []
    straggler.announce(p, before, recorded)
    if current is not None and not p.is_finished():
        since = 0.0 if due or event or elapsed is None else elapsed
        p.requeue(max(1.0, period - since))


def _stragglers(p: Pass, before: list[int]) -> list[int]:
    """The workers `status.progress.stragglers` lists after this pass: as found by it, or as
    before when it did not look (it ended early; the job does not look for stragglers any
    more: none)."""
    if p.stragglers is None:
        return [] if p.job.spec.progress.straggler is None else before
    return straggler.ranks(p.stragglers) or []


def on_superseded(p: Pass, old: RestartRecord) -> None:
    """A restart superseded before its barrier opened never finishes: what it cost until the
    one that supersedes it is charged now (that one counts from its own detection)."""
    goodput = p.status.goodput or GoodputStatus()
    lost = _charge_restart(goodput.lost_seconds, old, until=p.now)
    p.status.goodput = goodput.model_copy(update={"lost_seconds": lost})


def _charged(p: Pass, goodput: GoodputStatus, *, first: bool) -> GoodputStatus:
    """The lost time of what this pass finished: the first barrier's scheduling (a restart
    before it is part of it), or the restart whose barrier opened."""
    lost = goodput.lost_seconds
    s = p.status
    done = p.restart_finished
    if first and s.start_time is not None and s.barrier_opened_at is not None:
        scheduling = _seconds(s.start_time, s.barrier_opened_at)
        lost = lost.model_copy(update={"scheduling": round(scheduling, 3)})
    elif done is not None and done.barrier_open_at is not None:
        lost = _charge_restart(lost, done, until=done.barrier_open_at)
    return goodput.model_copy(update={"lost_seconds": lost})


def _charge_restart(lost: BadputSeconds, record: RestartRecord, until: datetime) -> BadputSeconds:
    """`lost` with what the restart of `record` cost until `until` (its barrier, or the restart
    that superseded it): its detection, its restart and the steps it lost."""
    onset = record.onset_at or record.detected_at
    return lost.model_copy(
        update={
            "detection": round(lost.detection + _seconds(onset, record.detected_at), 3),
            "restart": round(lost.restart + _seconds(record.detected_at, until), 3),
            "recompute": round(lost.recompute + (record.lost_seconds or 0.0), 3),
        }
    )


def _totals(p: Pass, goodput: GoodputStatus) -> GoodputStatus:
    """Wall and productive time up to now (or the end), and their ratio. A restart still in
    progress counts as lost up to now, though its record is charged only when it finishes."""
    s = p.status
    assert s.start_time is not None
    end = s.completion_time or p.stamp
    wall = max(0.0, (end - s.start_time).total_seconds())
    lost = goodput.lost_seconds
    spent = lost.scheduling + lost.detection + lost.restart + lost.recompute
    last = s.last_restart
    if last is not None and last.barrier_open_at is None and s.completion_time is None:
        spent += _seconds(last.onset_at or last.detected_at, p.stamp)
    if s.barrier_epoch is None:
        spent = wall  # nothing has run yet
    productive = max(0.0, wall - spent)
    return goodput.model_copy(
        update={
            "wall_seconds": round(wall, 3),
            "productive_seconds": round(productive, 3),
            "ratio": round(productive / wall, 4) if wall > 0 else None,
        }
    )


def _seconds(since: datetime, until: datetime) -> float:
    return max(0.0, (until - since).total_seconds())
