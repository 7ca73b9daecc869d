"""Workers created anew instead of restarted in place: which ones a restart recreates, their old
pods deleted (force-deleted behind the guards on a lost node), laggards past the barrier timeout,
and the nodes of unhealthy devices kept out (`avoidNodes`) (docs/design.md sections 3.8, 4.5
and 4.6)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from api.constants import (
    KUEUE_POD_FINALIZER,
    REASON_FORCE_DELETED,
    REASON_WORKER_RECREATED,
    RESTART_MODES,
    AgentPlacement,
)
from api.failures import FailureClass, meaning
from api.v1alpha1 import FailureAction, RestartRecord
from controller.policy import classify
from controller.policy.classify import Decision
from controller.policy.gang import POD_TERMINAL, at_epoch
from controller.policy.passstate import (
    EventSpec,
    FinalizerRelease,
    Pass,
    PodDelete,
    worker_text,
)
from controller.policy.views import PodView

RANKS_SHOWN: Final = 10
"""Ranks a message lists before it says how many more: messages are read by people."""


def force_delete_lost(p: Pass) -> bool:
    """A pod of ours stuck terminating on a lost node is force-deleted once the guards of
    docs/design.md section 4.5 all hold: no kubelet will ever confirm its end, and the name it
    holds keeps its worker from being created again. A zombie that is in fact alive is fenced by
    the epoch: an old-epoch worker never passes the barrier."""
    if not p.job.spec.node_loss.force_delete:
        return False
    after = timedelta(seconds=p.job.spec.node_loss.force_delete_after_seconds)
    for pod in (*p.gang.workers.values(), *p.gang.strays):
        if pod.deletion_timestamp is None or pod.node_name is None:
            continue
        if not classify.may_force_delete_on(p.node_of(pod)):
            continue
        due = pod.deletion_timestamp + after
        if p.now >= due:
            p.delete_pods[pod.name] = PodDelete(
                name=pod.name,
                uid=pod.uid,
                grace_seconds=0,
                mark_failed=True,
                reason=REASON_FORCE_DELETED,
            )
        else:
            p.requeue((due - p.now).total_seconds())
    return False


def release_kueue_finalizer(p: Pass) -> bool:
    """A pod of ours being deleted loses Kueue's finalizer (docs/scheduling.md, Kueue). Kueue
    keeps it on a deleted or Failed member of a pod group until the member's replacement
    exists, and ours, named `<job>-<rank>` like the old pod, cannot exist before the old pod
    is gone: kept, the worker is never recreated. Lifted, the pod still waits for its kubelet
    (or the force-delete protocol); the Workload stays admitted, counting one member absent,
    and Kueue ungates the replacement as a member of it."""
    for pod in (*p.gang.workers.values(), *p.gang.strays):
        if pod.terminating and KUEUE_POD_FINALIZER in pod.finalizers and pod.resource_version:
            kept = tuple(f for f in pod.finalizers if f != KUEUE_POD_FINALIZER)
            p.release_finalizers.append(FinalizerRelease(pod.name, pod.resource_version, kept))
    return False


def to_recreate(p: Pass, restarting: list[Decision]) -> set[int]:
    """Workers created anew by a restart, of the running roles (a completed role is not run
    again): all in `Recreate` mode; else those the policy recreates, those whose pod is gone,
    and those that cannot restart in place."""
    active = p.active()
    if not RESTART_MODES[p.effective_mode].in_place:
        return set(active)
    ranks = {
        d.worker
        for d in restarting
        if d.action is FailureAction.RECREATE_WORKER or not d.failure.in_place
    }
    ranks.update(rank for rank in active if rank not in p.gang.workers)
    live = p.gang.live
    ranks.update(rank for rank in active if rank in live and why_stuck(p, rank, live[rank]))
    return ranks


def avoid_unhealthy_devices(p: Pass, restarting: list[Decision], recreated: set[int]) -> None:
    """The node of a worker recreated for its unhealthy (or slow) device joins `avoidNodes`:
    no pod created from now on lands there again (the class's row says which: `avoids_node`)."""
    for d in restarting:
        node = d.failure.node_name
        if node and d.worker in recreated and meaning(d.failure_class).avoids_node:
            p.avoid(node)


def _agent_wraps_trainer(p: Pass) -> bool:
    """In this pass's mode the trainer's container is the agent (`Process`): asked once per
    pass, not per worker."""
    return RESTART_MODES[p.effective_mode].agent is AgentPlacement.WRAPPER


def why_stuck(p: Pass, rank: int, pod: PodView) -> tuple[FailureClass, str] | None:
    """Why live worker `rank` (its pod `pod`) cannot restart in place (`_stuck`), or None;
    each worker's answer kept for the pass: a restart asks it of every worker twice
    (`to_recreate`, then `recreate_laggards` of those below the new epoch), each an O(N)
    walk."""
    live, wrapped = p.gang.live, _agent_wraps_trainer(p)
    memo = p.stuck_memo
    if memo is None or memo[0] is not live or memo[1] != wrapped:
        memo = p.stuck_memo = (live, wrapped, {})
    known = memo[2]
    if rank not in known:
        known[rank] = _stuck(p, pod, wrapped)
    return known[rank]


def _stuck(p: Pass, pod: PodView, wrapped: bool) -> tuple[FailureClass, str] | None:
    """Why a live worker cannot restart in place (its pod finished, its node is lost, or in
    `Process` mode, `wrapped`, its trainer's container, the agent, is dead), or None."""
    if pod.phase in POD_TERMINAL:
        return FailureClass.POD_FAILED, f"pod is {pod.phase}"
    lost = p.node_lost(pod)
    if lost is not None:
        return FailureClass.NODE_LOST, lost
    if not wrapped:
        return None
    trainer = pod.container(p.job.spec.role_of(pod.rank or 0).trainer_container_name)
    if trainer and trainer.state == "terminated":
        return FailureClass.PROCESS_EXIT, f"container {trainer.name} (the agent) terminated"
    return None


def delete_recreated(p: Pass) -> bool:
    """The old pods of the workers the current restart recreates are deleted until they are
    gone: a pass after a lost delete asks again, from the status alone."""
    for rank, pod in p.gang.live.items():
        if p.superseded(rank, pod):
            p.delete(pod, REASON_WORKER_RECREATED)
    return False


def recreate_laggards(p: Pass) -> bool:
    """Workers the barrier waits for in vain are recreated at the epoch, without a bump (nobody
    runs at it yet): those below it that cannot restart in place, and those not arrived
    `spec.restart.barrierTimeoutSeconds` after the restart began (or their pod was created),
    unless their pod waits unbound in the gang's PodGroup."""
    if p.status.barrier_epoch == p.status.epoch:
        return False
    last = (
        p.status.last_restart
        if p.status.last_restart and p.status.last_restart.epoch == p.status.epoch
        else None
    )
    timeout = p.job.spec.restart.barrier_timeout_seconds
    staying = p.staying()
    for rank in p.active():
        pod = staying.get(rank)
        if pod is None or pod.arrived_epoch == p.status.epoch:
            continue
        failure: classify.Failure | None = None
        why = None if at_epoch(pod, p.status.epoch) else why_stuck(p, rank, pod)
        if why is not None:
            cls, detail = why
            failure = classify.Failure(rank, cls, detail, node_name=pod.node_name, in_place=False)
        elif last is not None and pod.node_name is None and pod.pod_group is not None:
            # Waiting in its PodGroup for the gang to fit (e.g. preempted whole by a higher
            # priority): a new pod would wait the same, so the gang waits whole, and `Stuck`
            # says why.
            continue
        elif last is not None:
            since = max(last.detected_at, pod.creation_timestamp or last.detected_at)
            waited = (p.now - since).total_seconds()
            if waited >= timeout:
                failure = classify.barrier_timeout(rank, waited)
            else:
                p.requeue(timeout - waited)
        if failure is not None:
            _recreate_worker(p, pod, failure, last)
    return False


def _recreate_worker(
    p: Pass, pod: PodView, failure: classify.Failure, last: RestartRecord | None
) -> None:
    p.delete(pod, REASON_WORKER_RECREATED)
    rank = failure.worker
    # Recorded once per rank and restart: a pass over the same pods (a delete not yet seen)
    # must neither count nor announce it again.
    if last is None or last.recreated_all or rank in last.recreated:
        return
    p.status.last_restart = last.model_copy(
        update=recreated_fields({*last.recreated, rank}, len(p.job.spec.workers))
    )
    r = p.status.restarts
    p.status.restarts = r.model_copy(update={"recreated_workers": r.recreated_workers + 1})
    p.acted.append(Decision(failure, FailureAction.RECREATE_WORKER, counted=False))
    p.events.append(
        EventSpec(
            "Warning",
            REASON_WORKER_RECREATED,
            f"Recreating {worker_text(p, rank)} at epoch {p.status.epoch}: "
            f"{failure.failure_class}: {failure.detail}",
        )
    )


def recreated_fields(ranks: set[int], replicas: int) -> dict[str, Any]:
    """A restart record's `recreated`/`recreatedAll`: every agent watches the GangJob, so a
    gang of 5000 all recreated is one flag, not 5000 ranks in every write they all receive."""
    if _every_rank(ranks, replicas):
        return {"recreated": [], "recreated_all": True}
    return {"recreated": sorted(ranks), "recreated_all": None}


def _every_rank(ranks: set[int], replicas: int) -> bool:
    return ranks >= set(range(replicas))


def ranks_text(ranks: set[int], replicas: int) -> str:
    """Recreated ranks as a message names them: all, or the first `RANKS_SHOWN` and a count."""
    if _every_rank(ranks, replicas):
        return f"all {replicas} workers"
    shown = sorted(ranks)[:RANKS_SHOWN]
    more = len(ranks) - len(shown)
    return f"worker(s) {shown}" + (f" and {more} more" if more else "")
