"""Hangs (docs/design.md section 4.7): a worker whose agent reports its trainer stalled, past
`spec.progress.hangSeconds`, has failed with class `Hang`, and which worker of a stalled gang
hung is told apart from those that only wait for it. Pure.

In synchronous training one hung rank stalls every rank: the others wait in its collective, and
their agents report them stalled within a step of it. So the pass that sees the first stall
waits `HANG_SETTLE_SECONDS` for the gang's other stalls to arrive, then blames the worker whose
trainer is stopped or wedged (process state `T` or `D`, where the agent shares its process
namespace), else the one that stalled first by more than `HANG_APART_SECONDS`, else nobody: the
trigger then says which workers stalled together, rather than blame a healthy one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from api.failures import FAILURE_CLASSES, FailureClass
from api.v1alpha1 import RestartTrigger
from controller.policy.classify import TRAINER_STATES, Decision
from controller.policy.passstate import Pass

HANG_SETTLE_SECONDS: Final = 1.0
"""How long after the first stall could have been reported the pass waits for the gang's
other workers' stall reports (or their progress), before it decides who hung."""
HANG_APART_SECONDS: Final = 1.0
"""A worker that stalled this much earlier than every other stalled worker stalled first."""
STACKS_HINT: Final = "the stacks its agent collected are in the agent's log"
"""Where a hang's trigger sends the reader: each stalled worker's agent logs the stacks of its
trainer's processes (docs/api.md "Progress")."""
STUCK_STATES: Final = frozenset({"T", "t", "D", "Z"})
"""Process states of a trainer that cannot be merely waiting for its peers: stopped (a signal,
a debugger), in uninterruptible sleep (a wedged driver or mount), or dead but unreaped."""


def settle(p: Pass) -> bool:
    """Holds the pass's `Hang` failures until the gang's stalls can all have been reported: the
    earliest stall's report was due at its last step + `hangSeconds`, the others within a step
    of it. Meanwhile nothing restarts and the barrier stays as it is; a later pass decides."""
    hangs = [d for d in p.decisions if d.failure_class is FailureClass.HANG]
    hang_seconds = p.job.spec.progress.hang_seconds
    if not hangs or hang_seconds is None:
        return False
    onsets = [d.failure.onset_at for d in hangs if d.failure.onset_at is not None]
    if not onsets:
        return False
    due = min(onsets) + timedelta(seconds=hang_seconds + HANG_SETTLE_SECONDS)
    if p.now >= due:
        return False
    p.decisions[:] = [d for d in p.decisions if d.failure_class is not FailureClass.HANG]
    p.pending_failure = True
    p.requeue((due - p.now).total_seconds())
    return False


def blame(restarting: Sequence[Decision]) -> RestartTrigger | None:
    """The trigger of a restart its `Hang` failures explain: None when there is none, or when
    an infrastructure failure of the same pass explains the stall better (a lost node stalls
    its gang too). Else the hung worker, told apart from those that waited for it, or no worker
    when they cannot be told apart."""
    hangs = [d for d in restarting if d.failure_class is FailureClass.HANG]
    if not hangs or any(FAILURE_CLASSES[d.failure_class].infrastructure for d in restarting):
        return None
    others = len(restarting) - 1
    stuck = [d for d in hangs if _state(d) in STUCK_STATES]
    pool = stuck or hangs
    ordered = sorted(pool, key=lambda d: (_onset(d), d.worker))
    first = ordered[0]
    if len(stuck) == 1 or len(ordered) == 1 or _apart(first, ordered[1]):
        detail = first.failure.detail
        if others:
            detail += f" ({others} other workers stalled or failed behind it)"
        detail += f"; {STACKS_HINT}"
        return RestartTrigger(
            worker=first.worker,
            failure_class=first.failure_class,
            detail=detail,
            action=first.action,
        )
    together = sorted(d.worker for d in ordered)
    states = sorted({TRAINER_STATES.get(_state(d) or "", "unknown") for d in ordered})
    shown = ", ".join(str(w) for w in together[:10]) + ("..." if len(together) > 10 else "")
    return RestartTrigger(
        worker=None,
        failure_class=first.failure_class,
        detail=f"workers {shown} stalled within {HANG_APART_SECONDS:.0f}s of each other "
        f"(their trainers: {', '.join(states)}): which one hung first cannot be told; "
        f"{STACKS_HINT}",
        action=first.action,
    )


def _state(d: Decision) -> str | None:
    return d.failure.trainer_state


def _onset(d: Decision) -> datetime:
    onset = d.failure.onset_at
    return onset if onset is not None else datetime.max.replace(tzinfo=UTC)


def _apart(first: Decision, second: Decision) -> bool:
    a, b = first.failure.onset_at, second.failure.onset_at
    if a is None or b is None:
        return False
    return (b - a).total_seconds() > HANG_APART_SECONDS
