"""Elastic gangs (docs/design.md section 3.12): `status.worldSize`, the `WORLD_SIZE` of
`status.epoch`, and the resize of a gang whose `spec.replicas` changed within `spec.elastic`.

A resize is one more reason for an epoch: one bump (class `Resized`, not counted), the surplus
workers (the highest numbers) deleted, the new ones created at the next free numbers by
`lifecycle.create`, every kept worker restarted in place at the new epoch, where its agent
gives the trainer the new world. Ranks stay dense because a resize only ever removes or adds
the highest numbers: the ranks of an epoch are `0..worldSize-1`, one worker each."""

from __future__ import annotations

from api.constants import REASON_WORKER_REMOVED
from api.failures import FailureClass
from api.v1alpha1 import FailureAction, RestartTrigger
from controller.policy import restart
from controller.policy.gang import surplus
from controller.policy.passstate import Pass


def resize_text(old: int, new: int, why: str) -> str:
    """How a restart record and its Events name a resize: `resized 8 -> 6 (why)`."""
    return f"resized {old} -> {new} ({why})"


def resize(p: Pass) -> bool:
    """Sets `status.worldSize` on a job's first pass; afterwards, when an elastic job's size
    differs from its epoch's, restarts the gang in place at its new size. A bump of this pass
    (a failure's, a manual restart's) takes the new size with it: one bump per pass."""
    size = p.job.spec.world_size
    old = p.status.world_size
    if old is None:
        p.status.world_size = size
        return False
    if old == size or p.job.spec.elastic is None:
        return False
    for pod in surplus(p.job, old, p.gang.strays):
        p.delete(pod, REASON_WORKER_REMOVED)
    detail = resize_text(old, size, "replicas changed")
    p.status.world_size = size
    started = p.restart_started
    if started is not None:
        # This pass already raised the epoch: the resize rides on that bump.
        trigger = started.trigger
        record = started.model_copy(
            update={"trigger": trigger.model_copy(update={"detail": f"{trigger.detail}; {detail}"})}
        )
        p.restart_started = record
        p.status.last_restart = record
        return False
    trigger = RestartTrigger(
        worker=None,
        failure_class=FailureClass.RESIZED,
        detail=detail,
        action=FailureAction.RESTART_GANG,
    )
    restart.bump(p, trigger, [], counted=False)
    return False
