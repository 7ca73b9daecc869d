"""A gang restart asked for by the user: the annotation `gangjob.io/restart: "<E>"` on the
GangJob restarts the gang running at epoch E once, in place, recorded with the trigger class
`ManualRestart` (no worker; it does not count against `spec.restart.maxRestarts`).

Level-triggered: the request names the epoch it restarts, so it is honoured at most once and
is satisfied once the gang is past it, whatever else restarted the gang meanwhile."""

from __future__ import annotations

from api.constants import ANNOTATION_RESTART
from api.failures import FailureClass
from api.v1alpha1 import FailureAction, RestartTrigger
from controller.policy import restart
from controller.policy.failure import restarting_decisions
from controller.policy.passstate import Pass


def requested_epoch(annotations: dict[str, str]) -> int | None:
    """The epoch a restart is asked for at; None without a well-formed request."""
    raw = annotations.get(ANNOTATION_RESTART, "").strip()
    return int(raw) if raw.isdigit() else None


def manual_restart(p: Pass) -> bool:
    """Bumps the epoch for a request at the gang's epoch, unless a failure of this pass
    restarts the gang anyway, or waits out its backoff (which a request must not cut short)."""
    if requested_epoch(p.job.metadata.annotations) != p.status.epoch:
        return False
    if restarting_decisions(p.decisions):
        return False
    trigger = RestartTrigger(
        worker=None,
        failure_class=FailureClass.MANUAL_RESTART,
        detail=f"requested by the annotation {ANNOTATION_RESTART}={p.status.epoch}",
        action=FailureAction.RESTART_GANG,
    )
    restart.bump(p, trigger, [], counted=False)
    return False
