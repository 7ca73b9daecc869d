"""Elastic gangs (docs/design.md section 3.12): `status.worldSize`, the `WORLD_SIZE` of
`status.epoch`, and the resizes of a gang with `spec.elastic`, each one more reason for an
epoch (one bump, class `Resized`, not counted):

- `replicas` changed: the surplus workers (the highest numbers) deleted, the new ones created
  at the next free numbers by `lifecycle.create`, every kept worker restarted in place;
- a worker being recreated whose pod has been Unschedulable for `elastic.waitSeconds` while
  the gang waits for it at a shut barrier is dropped (`status.dropped`), as long as the world
  stays at or above `minReplicas`: the gang goes on without it, its pod kept pending;
- a dropped worker whose pod was placed (capacity returned) rejoins, at most once per
  `elastic.growAfterSeconds` since the last such shrink or growth.

Ranks stay dense: a worker's `RANK` is its number less the dropped workers below it
(`agent.protocol.dense_rank`), `0..worldSize-1`, one worker each."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from api.constants import REASON_WORKER_REMOVED
from api.failures import FailureClass
from api.v1alpha1 import FailureAction, RestartRecord, RestartTrigger
from controller.policy import restart
from controller.policy.gang import surplus, unschedulable_since
from controller.policy.passstate import Pass

WHY_REPLICAS: Final = "replicas changed"
WHY_NO_CAPACITY: Final = "node lost, no capacity"
WHY_CAPACITY: Final = "capacity returned"


def resize_text(old: int, new: int, why: str) -> str:
    """How a restart record and its Events name a resize: `resized 8 -> 6 (why)`."""
    return f"resized {old} -> {new} ({why})"


def last_elastic_change(records: list[RestartRecord]) -> datetime | None:
    """When the gang last shrank for want of capacity or grew back (not a change of
    `replicas`): the anchor of `growAfterSeconds`."""
    for record in reversed(records):
        detail = record.trigger.detail or ""
        if record.trigger.failure_class == FailureClass.RESIZED and not detail.endswith(
            f"({WHY_REPLICAS})"
        ):
            return record.detected_at
    return None


def _to_drop(p: Pass, world: int, minimum: int, bumping: bool = False) -> list[int]:
    """Workers the gang waits for at a shut barrier whose pods found no node for
    `waitSeconds`: as many as keep the world at `minimum` or above; never the coordinator
    (worker 0 unless `spec.coordinator` says), whose pod is `MASTER_ADDR`. Requeues the pass
    for when the next would be due. With the barrier open, only when this pass bumps anyway
    (`bumping`, a change of `replicas`): the bump takes them, or the next pass, behind the
    shut barrier, would bump again for them."""
    if p.status.barrier_epoch == p.status.epoch and not bumping:
        return []
    elastic = p.job.spec.elastic
    assert elastic is not None
    wait = timedelta(seconds=elastic.wait_seconds)
    due: list[int] = []
    coordinator = p.job.spec.coordinator_worker.worker
    for worker in p.active():
        pod = p.gang.live.get(worker)
        since = None if pod is None or worker == coordinator else unschedulable_since(pod)
        if since is None:
            continue
        if p.now - since >= wait:
            due.append(worker)
        else:
            p.requeue((since + wait - p.now).total_seconds())
    return due[: max(0, world - minimum)]


def _to_add(p: Pass, dropped: list[int]) -> list[int]:
    """Dropped workers whose pods were placed, if `growAfterSeconds` have passed since the
    last shrink or growth for capacity (else the pass is requeued for then)."""
    placed = [
        d for d in dropped if (pod := p.gang.live.get(d)) is not None and pod.node_name is not None
    ]
    if not placed:
        return []
    elastic = p.job.spec.elastic
    assert elastic is not None
    last = last_elastic_change(restart.restart_records(p.status.last_restart, p.status.history))
    if last is not None:
        ready_at = last + timedelta(seconds=elastic.grow_after_seconds)
        if p.now < ready_at:
            p.requeue((ready_at - p.now).total_seconds())
            return []
    return placed


def _joiners_pending(p: Pass, spanned: int) -> bool:
    """Whether a grow by `replicas` waits for the workers it adds (numbers `spanned` and up)
    before its bump: while the barrier is open the gang trains on, and the new workers' pods
    are created, placed and started behind it, each agent arriving at `status.epoch` and
    holding outside the world (`agent.protocol.in_world`). The bump comes once every new worker
    has arrived there, or its pod has found no node for `waitSeconds` (the bump then goes on
    without it); the kept workers stop only for an in-place restart. With the barrier shut
    nobody trains, and the bump goes at once, as before."""
    if p.status.barrier_epoch != p.status.epoch:
        return False
    elastic = p.job.spec.elastic
    assert elastic is not None
    wait = timedelta(seconds=elastic.wait_seconds)
    pending = False
    for worker in range(spanned, len(p.job.spec.workers)):
        pod = p.gang.live.get(worker)
        if pod is not None and pod.arrived_epoch == p.status.epoch:
            continue
        since = None if pod is None else unschedulable_since(pod)
        if since is not None and p.now - since >= wait:
            continue  # `_to_drop` takes it with the bump
        if since is not None:
            p.requeue((since + wait - p.now).total_seconds())
        pending = True
    return pending


def resize(p: Pass) -> bool:
    """Sets `status.worldSize` on a job's first pass; afterwards resizes an elastic gang whose
    size, or whose workers that can run, changed: one bump, or the bump of this pass (a
    failure's, a manual restart's) takes the resize with it, its detail saying both."""
    workers = len(p.job.spec.workers)
    old = p.status.world_size
    if old is None:
        p.status.world_size = workers - len(p.dropped())
        return False
    elastic = p.job.spec.elastic
    if elastic is None:
        return False
    dropped = sorted(p.dropped())
    if workers - len(dropped) == old:
        # The same workers as before (a new `replicas` took away only dropped ones): the
        # gang may grow back, or else go on without workers that cannot be placed.
        added = _to_add(p, dropped)
        if added:
            dropped = [d for d in dropped if d not in added]
            why = WHY_CAPACITY
        else:
            lost = _to_drop(p, old, elastic.min_replicas)
            dropped = sorted({*dropped, *lost})
            why = WHY_NO_CAPACITY
    else:
        # `replicas` changed: dropped workers placed since, and workers of the new size that
        # cannot be placed, go with it in one bump; else the next pass, over the same world,
        # would bump again for them.
        spanned = old + len(p.status.dropped)
        if _joiners_pending(p, spanned):
            return False
        reasons = [WHY_REPLICAS]
        added = _to_add(p, dropped)
        if added:
            dropped = [d for d in dropped if d not in added]
            reasons.append(WHY_CAPACITY)
        lost = _to_drop(p, workers - len(dropped), elastic.min_replicas, bumping=True)
        if lost:
            dropped = sorted({*dropped, *lost})
            reasons.append(WHY_NO_CAPACITY)
        why = "; ".join(reasons)
    world = workers - len(dropped)
    if world == old and dropped == sorted(p.dropped()):
        # No worker joins or leaves the world: no bump. Dropped workers past a smaller size
        # leave the list, and their pods go.
        if dropped != sorted(p.status.dropped):
            for pod in surplus(p.job, p.status, p.gang.strays):
                p.delete(pod, REASON_WORKER_REMOVED)
            p.status.dropped = dropped
        return False
    for pod in surplus(p.job, p.status, p.gang.strays):
        p.delete(pod, REASON_WORKER_REMOVED)
    detail = resize_text(old, world, why)
    p.status.world_size = world
    p.status.dropped = dropped
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
