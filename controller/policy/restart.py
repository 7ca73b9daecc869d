"""The in-place restart of the gang: the one epoch bump per pass (after the backoff), its
`RestartRecord`, the barrier that opens once every worker arrived at the epoch, and the restart
history the backoff reads (docs/design.md sections 3.1, 3.3, 3.6 and 3.8)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from api.constants import (
    REASON_BARRIER_OPEN,
    REASON_GANG_RESTARTED,
    REASON_GANG_RESTARTING,
    REASON_WORKER_RECREATED,
    ConditionType,
)
from api.v1alpha1 import (
    ConditionStatus,
    GangJob,
    Phase,
    RestartCounts,
    RestartRecord,
    RestartTrigger,
)
from controller.policy import classify, hang, progress, recreate
from controller.policy.classify import Decision
from controller.policy.failure import restarting_decisions
from controller.policy.passstate import EventSpec, Pass, worker_text

BACKOFF_CAP_SECONDS: Final = 300.0
"""Restart backoff doubles up to this, as the kubelet's CrashLoopBackOff does."""
BACKOFF_RESET_SECONDS: Final = 600.0
"""A gang that ran this long since its last barrier opened starts its backoff afresh (the
kubelet resets CrashLoopBackOff after 10 minutes of running, too)."""


def restart(p: Pass) -> bool:
    """The failures of this pass restart the gang once: `status.epoch` + 1, with the lowest
    rank's failure as the trigger. A counted restart first waits out its backoff; the failure
    stays observable meanwhile, so nothing has to be remembered."""
    restarting = restarting_decisions(p.decisions)
    if not restarting:
        return False
    counted = any(d.counted for d in restarting)
    wait = backoff_remaining(
        p.job, p.status.last_restart, p.status.history, p.status.start_time, p.now
    )
    if counted and wait > 0:
        p.pending_failure = True
        p.requeue(wait)
        return False
    _bump(p, restarting, counted)
    return False


def _bump(p: Pass, restarting: list[Decision], counted: bool) -> None:
    trigger = classify.lowest(restarting)
    assert trigger is not None
    cause = hang.blame(restarting)
    if cause is None:
        detail = trigger.failure.detail
        if len(restarting) > 1:
            detail += f" ({len(restarting)} workers failed)"
        cause = RestartTrigger(
            worker=trigger.worker,
            failure_class=trigger.failure_class,
            detail=detail,
            action=trigger.action,
        )
    blamed = next((d for d in restarting if d.worker == cause.worker), trigger)
    onsets = [d.failure.onset_at for d in restarting if d.failure.onset_at is not None]
    onset = blamed.failure.onset_at or (min(onsets) if onsets else None)
    bump(p, cause, restarting, counted, onset_at=onset)


def bump(
    p: Pass,
    trigger: RestartTrigger,
    restarting: list[Decision],
    counted: bool,
    *,
    onset_at: datetime | None = None,
) -> None:
    """Raises the epoch by one for `trigger`: the restart record (with what the failure lost,
    from `onset_at`), the workers `restarting` recreates deleted, the counts, the condition and
    the Event."""
    epoch = p.status.epoch + 1
    recreated = recreate.to_recreate(p, restarting)
    for rank in sorted(recreated):
        pod = p.gang.workers.get(rank)
        if pod is not None:
            p.delete(pod, REASON_WORKER_RECREATED)
    recreate.avoid_unhealthy_devices(p, restarting, recreated)
    detail = trigger.detail or ""
    record = RestartRecord(
        epoch=epoch,
        trigger=trigger,
        detected_at=p.now,
        counted=counted or None,
        **recreate.recreated_fields(recreated, len(p.job.spec.workers)),
    )
    record = progress.on_restart(p, record, onset_at)
    if p.status.last_restart is not None and p.status.last_restart.barrier_open_at is None:
        # Superseded before its barrier opened: the history keeps it, unfinished.
        p.status.history.append(p.status.last_restart)
        progress.on_superseded(p, p.status.last_restart)
    p.status.last_restart = record
    p.status.epoch = epoch
    r = p.status.restarts
    p.status.restarts = RestartCounts(
        total=r.total + 1,
        counted=r.counted + counted,
        in_place=r.in_place + (not recreated),
        recreated_workers=r.recreated_workers + len(recreated),
    )
    message = f"Restarting the gang at epoch {epoch}: {worker_text(p, trigger.worker)} " + (
        f"{trigger.failure_class}: {detail}"
    )
    if recreated:
        message += f"; recreating {recreate.ranks_text(recreated, len(p.job.spec.workers))}"
    p.status.phase = Phase.RESTARTING
    p.set_condition(ConditionType.RESTARTING, ConditionStatus.TRUE, trigger.failure_class, message)
    p.events.append(EventSpec("Warning", REASON_GANG_RESTARTING, message))
    p.restart_started = record
    p.acted = restarting


def barrier(p: Pass) -> bool:
    """The barrier of `status.epoch` opens once every worker of the running roles has arrived
    at it (one barrier for all roles): all present, none terminating or being deleted, each
    arrived at exactly the epoch; never over a failure that waits for its restart. Completed
    roles' workers are done and waiting roles' not created: neither is waited for."""
    if not p.barrier_opens():
        return False
    p.status.barrier_epoch = p.status.epoch
    p.status.barrier_opened_at = p.now
    last = p.status.last_restart
    if last is None or last.epoch != p.status.epoch or last.barrier_open_at is not None:
        return False
    duration = max(0.0, (p.now - last.detected_at).total_seconds())
    done = last.model_copy(update={"barrier_open_at": p.now, "duration_seconds": duration})
    p.status.last_restart = done
    p.status.history.append(done)
    message = (
        f"Every worker arrived at epoch {p.status.epoch}: the gang restarted in {duration:.2f}s "
        f"(trigger: {worker_text(p, last.trigger.worker)} {last.trigger.failure_class})"
    )
    p.set_condition(ConditionType.RESTARTING, ConditionStatus.FALSE, REASON_BARRIER_OPEN, message)
    p.events.append(EventSpec("Normal", REASON_GANG_RESTARTED, message))
    p.restart_finished = done
    return False


def restart_records(
    last: RestartRecord | None, history: Sequence[RestartRecord]
) -> list[RestartRecord]:
    """Every restart the status remembers, oldest first: the history, and the last restart if
    it is still in progress (the history takes a restart once its barrier opened)."""
    if last is None or (history and history[-1] == last):
        return list(history)
    return [*history, last]


def consecutive_counted_restarts(records: Sequence[RestartRecord], now: datetime) -> int:
    """Counted restarts in a row before `now` (records oldest first): the run ends at a restart
    that did not count, or where the gang ran undisturbed for `BACKOFF_RESET_SECONDS`."""
    count = 0
    later = now
    for record in reversed(records):
        if not record.counted:
            break
        ran_from = record.barrier_open_at
        if ran_from is not None and (later - ran_from).total_seconds() >= BACKOFF_RESET_SECONDS:
            break
        count += 1
        later = record.detected_at
    return count


def backoff_remaining(
    job: GangJob,
    last: RestartRecord | None,
    history: Sequence[RestartRecord],
    start_time: datetime | None,
    now: datetime,
) -> float:
    """Seconds a counted restart must still wait: `backoffSeconds` doubled per consecutive
    counted restart (capped), from the last barrier opening (or restart, or start)."""
    backoff = job.spec.restart.backoff_seconds
    if backoff <= 0:
        return 0.0
    n = 1 + consecutive_counted_restarts(restart_records(last, history), now)
    delay = min(BACKOFF_CAP_SECONDS, backoff * 2.0 ** min(n - 1, 16))
    anchor = (last.barrier_open_at or last.detected_at) if last is not None else start_time
    if anchor is None:
        return 0.0
    return max(0.0, (anchor + timedelta(seconds=delay) - now).total_seconds())
