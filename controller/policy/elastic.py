"""Elastic gangs (docs/design.md section 3.12): `status.worldSize`, the `WORLD_SIZE` of
`status.epoch`, and the resizes of a gang with `spec.elastic` (or an elastic role,
`spec.roles[].elastic`: its workers numbered last), each one more reason for an
epoch (one bump, class `Resized`, not counted):

- `replicas` changed: the surplus workers (the highest numbers) deleted, the new ones created
  at the next free numbers by `lifecycle.create`, every kept worker restarted in place; a
  grow while the gang trains creates the new pods first and bumps once they arrived
  (`_joiners_pending`);
- a worker being recreated whose pod has been Unschedulable for `elastic.waitSeconds` while
  the gang waits for it at a shut barrier is dropped (`status.dropped`), as long as the world
  stays at or above `minReplicas`: the gang goes on without it, its pod kept pending;
- a dropped worker whose pod was placed (capacity returned) rejoins, at most once per
  `elastic.growAfterSeconds` since the last such shrink or growth;
- spares (`elastic.spares`): workers beyond `replicas`, out of the world (in `status.dropped`)
  but placed and arrived; a worker of the world that a restart recreates gives its place to
  one in that restart's bump, and its new pod becomes a spare once placed.

Ranks stay dense: a worker's `RANK` is its position among the epoch's workers in the order of
their numbers (`agent.protocol.dense_rank`), `0..worldSize-1`, one worker each; a spare that
took a worker's place is ranked in that place (`status.places`), so it runs with the lost
worker's `RANK` and no other worker's rank moves."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Final

from api.constants import (
    REASON_GANG_RESTARTING,
    REASON_SPARE_TOOK_OVER,
    REASON_WORKER_RECREATED,
    REASON_WORKER_REMOVED,
)
from api.failures import FailureClass
from api.v1alpha1 import Elasticity, FailureAction, Place, RestartRecord, RestartTrigger
from controller.policy import restart
from controller.policy.gang import (
    POD_RUNNING,
    POD_TERMINAL,
    epoch_workers,
    surplus,
    unschedulable_since,
)
from controller.policy.passstate import EventSpec, Pass

WHY_REPLICAS: Final = "replicas changed"
WHY_NO_CAPACITY: Final = "node lost, no capacity"
WHY_CAPACITY: Final = "capacity returned"
WHY_NO_SPARE: Final = "worker lost, no spare"


def resize_text(old: int, new: int, why: str) -> str:
    """How a restart record and its Events name a resize: `resized 8 -> 6 (why)`."""
    return f"resized {old} -> {new} ({why})"


def last_elastic_change(records: list[RestartRecord]) -> datetime | None:
    """When the gang last shrank for want of capacity or grew back (not a change of
    `replicas`): the anchor of `growAfterSeconds`."""
    for record in reversed(records):
        detail = record.trigger.detail or ""
        # A resize riding on a failure's bump keeps the failure's class: read the detail.
        if "resized " in detail and not detail.endswith(f"({WHY_REPLICAS})"):
            return record.detected_at
    return None


def swap_text(spare: int, worker: int) -> str:
    """How a restart record and its Events name a spare taking a worker's place."""
    return f"spare {spare} takes worker {worker}'s place"


def _to_drop(p: Pass, world: int, minimum: int, bumping: bool = False) -> list[int]:
    """Workers the gang waits for at a shut barrier whose pods found no node for
    `waitSeconds`: as many as keep the world at `minimum` or above; never the coordinator
    (worker 0 unless `spec.coordinator` says), whose pod is `MASTER_ADDR`, nor a worker of a
    role that is not elastic (below `Elasticity.first`). Requeues the pass
    for when the next would be due. With the barrier open, only when this pass bumps anyway
    (`bumping`, a change of `replicas`): the bump takes them, or the next pass, behind the
    shut barrier, would bump again for them."""
    if p.status.barrier_epoch == p.status.epoch and not bumping:
        return []
    elastic = p.job.spec.elasticity
    assert elastic is not None
    wait = timedelta(seconds=elastic.bounds.wait_seconds)
    due: list[int] = []
    coordinator = p.job.spec.coordinator_worker.worker
    for worker in p.active():
        if worker < elastic.first:
            continue
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
    # Placed on a node that is not lost: a cache a moment behind a force-delete can still
    # show the worker's old pod on its dead node, and taking that in would lose it again.
    placed = [
        d
        for d in dropped
        if (pod := p.gang.live.get(d)) is not None
        and pod.node_name is not None
        and p.node_lost(pod) is None
    ]
    if not placed:
        return []
    elastic = p.job.spec.elasticity
    assert elastic is not None
    last = last_elastic_change(restart.restart_records(p.status.last_restart, p.status.history))
    if last is not None:
        ready_at = last + timedelta(seconds=elastic.bounds.grow_after_seconds)
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
    elastic = p.job.spec.elasticity
    assert elastic is not None
    wait = timedelta(seconds=elastic.bounds.wait_seconds)
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


def _ready_spares(p: Pass, out: set[int]) -> list[int]:
    """Workers out of the world that can join it at once, no pod to schedule or start: their
    pod running on a node that is not lost, their agent arrived at the epoch the gang was at
    when this pass began."""
    epoch = p.observed.job.status.epoch
    staying = p.staying()
    ready: list[int] = []
    for worker in sorted(out):
        pod = staying.get(worker)
        if pod is None or pod.node_name is None or pod.phase != POD_RUNNING:
            continue
        if p.node_lost(pod) is not None:
            continue
        if pod.arrived_epoch == epoch:
            ready.append(worker)
    return ready


def _recreated_members(p: Pass, out: set[int]) -> list[int]:
    """The workers of the elastic role's world that this pass's bump recreates, but the
    coordinator: its pod is `MASTER_ADDR`, fixed in every worker's environment, so it is
    always waited for (as are the other roles' workers: no spare has their template)."""
    started = p.restart_started
    elastic = p.job.spec.elasticity
    if started is None or elastic is None:
        return []
    coordinator = p.job.spec.coordinator_worker.worker
    recreated = started.recreated_ranks(len(p.job.spec.workers))
    return [
        w for w in sorted(recreated) if w not in out and w != coordinator and w >= elastic.first
    ]


def _renew_lost_spares(p: Pass, out: set[int]) -> None:
    """A spare whose pod ended or whose node was lost gets a new pod, in the background:
    nothing waits for it, and `lifecycle.create` makes the new one once the name is free."""
    staying = p.staying()
    for worker in sorted(out):
        pod = staying.get(worker)
        if pod is not None and (pod.phase in POD_TERMINAL or p.node_lost(pod) is not None):
            p.delete(pod, REASON_WORKER_RECREATED)


def _to_spares(p: Pass, out: set[int], count: int) -> list[int]:
    """`count` workers of the world to become spares (the size shrank, or spares were added):
    the highest numbers of the elastic role, never the coordinator."""
    elastic = p.job.spec.elasticity
    assert elastic is not None
    coordinator = p.job.spec.coordinator_worker.worker
    numbers = range(elastic.first, len(p.job.spec.workers))
    members = [w for w in numbers if w not in out and w != coordinator]
    return members[::-1][:count]


def _places(places: dict[int, int], out: set[int], workers: int) -> list[Place]:
    """`status.places` of a world without `out`: the members ranked in another's place."""
    return [
        Place(worker=w, place=at)
        for w, at in sorted(places.items())
        if w not in out and w < workers and w != at
    ]


def _members_before(p: Pass) -> set[int]:
    spanned = epoch_workers(p.status)
    assert spanned is not None
    return set(range(spanned)) - set(p.status.dropped)


def _first_pass(p: Pass, elastic: Elasticity | None) -> None:
    """The world of epoch 0: every worker but the spares, the highest numbers but the
    coordinator."""
    workers = len(p.job.spec.workers)
    if elastic is not None and elastic.bounds.spares:
        p.status.dropped = sorted(_to_spares(p, set(), elastic.bounds.spares))
    p.status.world_size = workers - len(p.dropped())


def resize(p: Pass) -> bool:
    """Sets `status.worldSize` on a job's first pass; afterwards changes the world of an
    elastic gang whose size, or whose workers that can run, changed: one bump, or the bump of
    this pass (a failure's, a manual restart's) takes the change with it, its detail saying
    both. In order: spares take the places of the world's workers this pass recreates (with
    `waitSeconds` 0 and no spare ready, those go at once); workers that found no node for
    `waitSeconds` go; placed workers out of the world join it while it is below `replicas`;
    above it, the highest numbers become spares."""
    workers = len(p.job.spec.workers)
    old = p.status.world_size
    elasticity = p.job.spec.elasticity
    if old is None:
        _first_pass(p, elasticity)
        return False
    if elasticity is None:
        return False
    elastic, minimum = elasticity.bounds, elasticity.min_world
    target = workers - elastic.spares
    out = set(p.dropped())
    _renew_lost_spares(p, out)
    spanned = epoch_workers(p.status)
    assert spanned is not None
    if target > old and workers > spanned and _joiners_pending(p, spanned):
        ready = _ready_spares(p, out)
        if len(ready) < target - old:
            return False  # a grow: its new pods start while the gang trains on
        # Ready spares fill the grow at once, in place; the new pods are the next spares.
        out = (out | set(range(spanned, workers))) - set(ready[: target - old])
    reasons: list[str] = []
    if workers - len(out) != old:
        reasons.append(WHY_REPLICAS)
    swaps: list[tuple[int, int]] = []
    places = {pl.worker: pl.place for pl in p.status.places}
    lost = _recreated_members(p, out)
    for spare in _ready_spares(p, out):
        if not lost:
            break
        worker = lost.pop(0)
        swaps.append((spare, worker))
        out = (out - {spare}) | {worker}
        # The spare is ranked where the lost worker was: its RANK, and nobody else's moves.
        places[spare] = places.pop(worker, worker)
    room = max(0, workers - len(out) - minimum)
    gone = lost[:room] if elastic.wait_seconds == 0 else []
    if gone:
        out |= set(gone)
        reasons.append(WHY_NO_SPARE)
    bumping = WHY_REPLICAS in reasons
    waited = [w for w in _to_drop(p, workers - len(out), minimum, bumping) if w not in out]
    if waited:
        out |= set(waited)
        reasons.append(WHY_NO_CAPACITY)
    world = workers - len(out)
    if world < target:
        added = _to_add(p, sorted(out - set(gone) - set(waited)))[: target - world]
        if added:
            out -= set(added)
            reasons.append(WHY_CAPACITY)
            # The larger world may now go on without workers it had to wait for at its
            # minimum: in this bump, or the next pass would bump again for them.
            more = [w for w in _to_drop(p, workers - len(out), minimum, True) if w not in out]
            if more:
                out |= set(more)
                waited += more
                if WHY_NO_CAPACITY not in reasons:
                    reasons.append(WHY_NO_CAPACITY)
    world = workers - len(out)
    if world > target:
        out |= set(_to_spares(p, out, world - target))
    world = workers - len(out)
    if world < minimum:
        # A smaller size took members while others were out for want of capacity: the gang
        # never runs below its minimum, so some come back, the ready spares first, and the
        # gang waits for the rest (`Stuck`: ElasticAtMinimum).
        ready = _ready_spares(p, out)
        back = [*ready, *sorted(out - set(ready))][: minimum - world]
        out -= set(back)
    world = workers - len(out)
    dropped = sorted(out)
    # Again over the final `out`: a worker this pass put out of the world (no spare, no
    # capacity, a smaller size) whose node is lost gets its new pod now, not a pass later.
    _renew_lost_spares(p, out)
    for pod in surplus(p.job, p.status, p.gang.strays):
        p.delete(pod, REASON_WORKER_REMOVED)
    if set(range(workers)) - out == _members_before(p):
        # No worker joins or leaves the world: no bump. Dropped workers and spares past a
        # smaller size leave the list, and their pods go; new spares are created.
        p.status.dropped = dropped
        p.status.places = _places(places, out, workers)
        return False
    parts = [swap_text(spare, worker) for spare, worker in swaps]
    if world != old or reasons:
        parts.insert(0, resize_text(old, world, "; ".join(reasons or [WHY_REPLICAS])))
    detail = "; ".join(parts)
    p.status.world_size = world
    p.status.dropped = dropped
    p.status.places = _places(places, out, workers)
    for spare, worker in swaps:
        p.events.append(
            EventSpec(
                "Normal",
                REASON_SPARE_TOOK_OVER,
                f"Spare {spare} takes worker {worker}'s place at epoch {p.status.epoch}; "
                f"worker {worker}'s new pod will be a spare",
            )
        )
    started = p.restart_started
    if started is not None:
        # This pass already raised the epoch: the change rides on that bump.
        trigger = started.trigger
        record = started.model_copy(
            update={"trigger": trigger.model_copy(update={"detail": f"{trigger.detail}; {detail}"})}
        )
        p.restart_started = record
        p.status.last_restart = record
        # And so does the bump's Event, which `kubectl describe gj` shows.
        p.events = [
            dataclasses.replace(e, message=f"{e.message}; {detail}")
            if e.reason == REASON_GANG_RESTARTING
            else e
            for e in p.events
        ]
        return False
    trigger = RestartTrigger(
        worker=None,
        failure_class=FailureClass.RESIZED,
        detail=detail,
        action=FailureAction.RESTART_GANG,
    )
    restart.bump(p, trigger, [], counted=False)
    return False
