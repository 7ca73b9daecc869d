"""The controller's policy, pure: from what was observed of one GangJob (the job, its pods, the
nodes, the time) to a `Plan` of what reconcile must do (the desired status, pods and Service to
create, pods to delete, Events). All decisions of docs/design.md sections 3-4 live here; no I/O.

`plan` runs a flat sequence of small steps over one `Pass`. Each step reads the observation,
adds to the pass (status fields, creates, deletes, events), and returns True to end the pass
early, as jobset's reconciler does.

The restart protocol (docs/design.md section 3) in these steps: failures are attributed to the epoch
the worker was at, and only a worker at `status.epoch` can cause a restart (a worker below it is
restarting because of the protocol); all failures of a pass make at most one epoch bump; the
barrier of an epoch opens once every worker has arrived at it. Everything is read back from the
API objects on every pass, so a restarted controller carries on where the last one stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from api.constants import (
    ANNOTATION_RESTART_MODE,
    REASON_ALL_SUCCEEDED,
    REASON_BARRIER_OPEN,
    REASON_FAILED,
    REASON_FAILURE_POLICY,
    REASON_FORCE_DELETED,
    REASON_GANG_RESTARTED,
    REASON_GANG_RESTARTING,
    REASON_INVALID_TEMPLATE,
    REASON_JOB_FINISHED,
    REASON_MAX_RESTARTS,
    REASON_MODE_CHANGED,
    REASON_MODE_HONOURED,
    REASON_NODES_LACK_FEATURE,
    REASON_NON_RETRIABLE_EXIT,
    REASON_RANK0_SUCCEEDED,
    REASON_RESUMED,
    REASON_RULES_DROPPED,
    REASON_STRAY_POD,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    REASON_WORKER_RECREATED,
    REASON_WORKERS_CREATED,
    REASON_WORKERS_NOT_READY,
    REASON_WORKERS_READY,
    ConditionType,
)
from api.v1alpha1 import (
    Condition,
    ConditionStatus,
    FailureAction,
    GangJob,
    Phase,
    RestartCounts,
    RestartMode,
    RestartRecord,
    RestartTrigger,
    SuccessPolicy,
)
from controller.policy import classify, nodematch, podspec
from controller.policy.classify import Decision, FailureClass
from controller.policy.conditions import get_condition, is_true
from controller.policy.gang import (
    POD_RUNNING,
    POD_SUCCEEDED,
    POD_TERMINAL,
    arrived_by_barrier,
    at_epoch,
    sort_pods,
)
from controller.policy.passstate import (
    EventSpec,
    Observed,
    Pass,
    Plan,
    PlanConfig,
    PodDelete,
    job_for_pods,
    worker_text,
)
from controller.policy.views import NodeView, PodView

__all__ = ["STEPS", "EventSpec", "Observed", "Plan", "PlanConfig", "PlanStep", "PodDelete", "plan"]

FEATURE_RESTART_ALL_CONTAINERS: Final = "RestartAllContainersOnContainerExits"
"""What a node declares (`status.declaredFeatures`) when its kubelet does KEP-5532."""
BACKOFF_CAP_SECONDS: Final = 300.0
"""Restart backoff doubles up to this, as the kubelet's CrashLoopBackOff does."""
BACKOFF_RESET_SECONDS: Final = 600.0
"""A gang that ran this long since its last barrier opened starts its backoff afresh (the
kubelet resets CrashLoopBackOff after 10 minutes of running, too)."""
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"


PlanStep = Callable[[Pass], bool]
"""A step of the pass: adds to it, and returns True to end the pass."""

# --- steps, in order --------------------------------------------------------------------------


def _delete_strays(p: Pass) -> bool:
    """Pods of ours that are no worker (scaled away, rank label missing or wrong name) go."""
    for pod in p.gang.strays:
        p.delete(pod, REASON_STRAY_POD)
    return False


def _stop_if_job_deleted(p: Pass) -> bool:
    """A job being deleted gets nothing new: garbage collection is removing its pods, and
    creating more would race it."""
    return p.job.metadata.deletion_timestamp is not None


def _force_delete_lost(p: Pass) -> bool:
    """A pod of ours stuck terminating on a lost node is force-deleted once the guards of
    DESIGN.md section 4 all hold: no kubelet will ever confirm its end, and the name it holds
    keeps its worker from being created again. A zombie that is in fact alive is fenced by the
    epoch: an old-epoch worker never passes the barrier."""
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


def _finished(p: Pass) -> bool:
    """A Succeeded or Failed job stays so: it only frees its devices and waits for its TTL."""
    if not p.is_finished():
        return False
    # Running workers hold GPUs for nothing; finished ones are kept for their logs.
    for pod in p.gang.workers.values():
        if pod.phase not in POD_TERMINAL:
            p.delete(pod, REASON_JOB_FINISHED)
    _ttl(p)
    return True


def _ttl(p: Pass) -> None:
    ttl = p.job.spec.ttl_seconds_after_finished
    if ttl is None or p.completion_time is None:
        return
    remaining = (p.completion_time + timedelta(seconds=ttl) - p.now).total_seconds()
    if remaining <= 0:
        p.delete_job = True
    else:
        p.requeue(remaining)


def _suspend(p: Pass) -> bool:
    """`suspend: true` deletes every pod and holds the job; `false` again resumes it."""
    was_suspended = is_true(p.conditions, ConditionType.SUSPENDED)
    if not p.job.spec.suspend:
        if was_suspended:
            p.set_condition(
                ConditionType.SUSPENDED, ConditionStatus.FALSE, REASON_RESUMED, "Job resumed"
            )
            p.events.append(EventSpec("Normal", REASON_RESUMED, "Job resumed"))
        return False
    for pod in p.gang.workers.values():
        p.delete(pod, REASON_SUSPENDED)
    p.phase = Phase.SUSPENDED
    p.set_condition(
        ConditionType.SUSPENDED, ConditionStatus.TRUE, REASON_SUSPENDED, "Job suspended"
    )
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, REASON_SUSPENDED, "Job suspended")
    if not was_suspended:
        p.events.append(EventSpec("Normal", REASON_SUSPENDED, "Job suspended: deleting workers"))
    return True


def _choose_mode(p: Pass) -> bool:
    """`status.mode`: `spec.restart.mode` if the cluster honours it, else the next mode that
    works, said in the `ModeDegraded` condition (never silently). Workers built for another
    mode are deleted, to be created again in this one."""
    degraded = get_condition(p.conditions, ConditionType.MODE_DEGRADED)
    held = degraded if degraded is not None and degraded.status == ConditionStatus.TRUE else None
    mode, problem = p.job.spec.restart.mode, None
    if mode is RestartMode.POD and held is not None and _fallback_holds(p, held):
        mode, problem = p.mode or _fallback_mode(p), (held.reason, held.message)
    elif mode is RestartMode.POD:
        why = _pod_mode_problem(p)
        if why is not None:
            mode = _fallback_mode(p)
            problem = (why[0], f"{why[1]}: restart mode Pod falls back to {mode}")
    p.mode = mode
    if problem is not None:
        reason, message = problem
        if held is None or held.reason != reason:
            p.events.append(EventSpec("Warning", reason, message))
        p.set_condition(ConditionType.MODE_DEGRADED, ConditionStatus.TRUE, reason, message)
    elif held is not None:
        p.set_condition(
            ConditionType.MODE_DEGRADED,
            ConditionStatus.FALSE,
            REASON_MODE_HONOURED,
            f"Restart mode {mode} is honoured",
        )
    for pod in p.gang.live.values():
        if pod.restart_mode is not None and pod.restart_mode != mode:
            p.delete(pod, REASON_MODE_CHANGED)
    return False


def _fallback_holds(p: Pass, held: Condition) -> bool:
    """Whether a fallback made earlier still holds, whatever the nodes say now."""
    # The apiserver's gates do not change under a running job: once rules were dropped, the
    # fallback holds for the job's life (and would otherwise flap with every new pod).
    if held.reason == REASON_RULES_DROPPED:
        return True
    # A gang that exists keeps the mode it was built in: changing it recreates every worker.
    return p.mode not in (None, RestartMode.POD) and bool(p.gang.workers)


def _pod_mode_problem(p: Pass) -> tuple[str, str] | None:
    """(reason, message) if `Pod` mode cannot work here, else None."""
    stripped = sorted(pod.name for pod in p.gang.workers.values() if _rules_dropped(pod))
    if stripped and _pod_mode_has_rules(p):
        return (
            REASON_RULES_DROPPED,
            f"The apiserver dropped the restartPolicyRules of pod {stripped[0]} (feature gates "
            "ContainerRestartRules/RestartAllContainersOnContainerExits off)",
        )
    if p.mode is RestartMode.POD and p.gang.workers:
        return None  # built in Pod mode already: a node that stops declaring it changes nothing
    if any(
        node.ready == "True" and FEATURE_RESTART_ALL_CONTAINERS in node.declared_features
        for node in eligible_nodes(p.job, p.observed.nodes.values())
    ):
        return None
    return (
        REASON_NODES_LACK_FEATURE,
        f"No Ready node the workers may run on declares {FEATURE_RESTART_ALL_CONTAINERS} "
        "(KEP-5532): a Pod-mode worker could not be scheduled",
    )


def eligible_nodes(job: GangJob, nodes: Iterable[NodeView]) -> list[NodeView]:
    """The nodes the template's `nodeSelector` and required node affinity allow: in a mixed
    cluster only those decide whether `Pod` mode can be scheduled."""
    spec = job.spec.template.get("spec") or {}
    return [n for n in nodes if nodematch.allows(spec, n)]


def _rules_dropped(pod: PodView) -> bool:
    return pod.restart_mode == RestartMode.POD and not pod.has_restart_rules


def _pod_mode_has_rules(p: Pass) -> bool:
    """Whether podspec gives a `Pod`-mode worker restart rules at all: only then does a pod
    without any say that the apiserver dropped them."""
    try:
        pod = podspec.build_pod(job_for_pods(p, RestartMode.POD), 0, p.config.agent_image)
    except ValueError:
        return False
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return any(c.get("restartPolicyRules") for c in containers)


def _fallback_mode(p: Pass) -> RestartMode:
    """`Process` needs no KEP-5532; a template it cannot wrap (no `command`) gets `Recreate`,
    which works everywhere."""
    try:
        podspec.build_pod(job_for_pods(p, RestartMode.PROCESS), 0, p.config.agent_image)
    except ValueError:
        return RestartMode.RECREATE
    return RestartMode.PROCESS


def _complete(p: Pass) -> bool:
    """The job succeeds per its successPolicy; then it is finished and handled as such."""
    outcome = job_succeeded(p.job, p.gang.live)
    if outcome is None:
        return False
    reason, message = outcome
    _finish(p, Phase.SUCCEEDED, ConditionType.SUCCEEDED, reason, message)
    p.events.append(EventSpec("Normal", REASON_SUCCEEDED, message))
    return _finished(p)


def _finish(p: Pass, phase: Phase, type_: ConditionType, reason: str, message: str) -> None:
    p.phase = phase
    p.completion_time = p.stamp
    p.set_condition(type_, ConditionStatus.TRUE, reason, message)
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, REASON_JOB_FINISHED, message)
    if is_true(p.conditions, ConditionType.RESTARTING):
        p.set_condition(
            ConditionType.RESTARTING, ConditionStatus.FALSE, REASON_JOB_FINISHED, message
        )


def _classify(p: Pass) -> bool:
    """Every worker's failure at `status.epoch`, classified. A worker below the epoch is
    restarting because of the protocol: its exits and restarts are no failure, so that one
    failure makes one bump however many workers then report it."""
    ctx = classify.Context.of(
        p.job, p.effective_mode, p.epoch, p.barrier_epoch, p.barrier_opened_at
    )
    for rank in range(p.job.spec.replicas):
        pod = p.gang.workers.get(rank)
        if pod is None:
            failure = classify.missing(ctx, rank)
        elif not at_epoch(pod, p.epoch):
            continue
        else:
            if pod.name in p.delete_pods and not pod.terminating:
                # Deleted by this very pass (its mode changed): judged as the next pass will
                # see it, terminating, so that replanning the outcome finds nothing new.
                pod = dataclasses.replace(pod, deletion_timestamp=p.now)
            failure = classify.detect(ctx, rank, pod, p.node_of(pod))
        if failure is not None:
            p.decisions.append(classify.decide(p.job, failure))
    return False


def _fail_by_policy(p: Pass) -> bool:
    """A `FailJob` rule, or a counted restart past `spec.restart.maxRestarts`, fails the job."""
    fails = [d for d in p.decisions if d.action is FailureAction.FAIL_JOB]
    first = classify.lowest(fails)
    if first is not None:
        reason = REASON_NON_RETRIABLE_EXIT if first.by_exit_code else REASON_FAILURE_POLICY
        message = (
            f"{worker_text(p, first.worker)}: {first.failure.detail}; "
            f"spec.failurePolicy.rules[{first.rule}] fails the job"
        )
        p.acted = fails
        return _fail(p, reason, message)
    restarting = _restarting(p.decisions)
    first = classify.lowest(restarting)
    limit = p.job.spec.restart.max_restarts
    if first is not None and any(d.counted for d in restarting) and p.restarts.counted >= limit:
        message = (
            f"{p.restarts.counted} counted restarts reached spec.restart.maxRestarts ({limit}); "
            f"last failure: {worker_text(p, first.worker)}: {first.failure.detail}"
        )
        p.acted = restarting
        return _fail(p, REASON_MAX_RESTARTS, message)
    return False


def _fail(p: Pass, reason: str, message: str) -> bool:
    _finish(p, Phase.FAILED, ConditionType.FAILED, reason, message)
    p.events.append(EventSpec("Warning", REASON_FAILED, message))
    return _finished(p)


def _restart(p: Pass) -> bool:
    """The failures of this pass restart the gang once: `status.epoch` + 1, with the lowest
    rank's failure as the trigger. A counted restart first waits out its backoff; the failure
    stays observable meanwhile, so nothing has to be remembered."""
    restarting = _restarting(p.decisions)
    if not restarting:
        return False
    counted = any(d.counted for d in restarting)
    wait = backoff_remaining(p.job, p.last_restart, p.history, p.start_time, p.now)
    if counted and wait > 0:
        p.pending_failure = True
        p.requeue(wait)
        return False
    _bump(p, restarting, counted)
    return False


def _bump(p: Pass, restarting: list[Decision], counted: bool) -> None:
    epoch = p.epoch + 1
    recreated = _to_recreate(p, restarting)
    for rank in sorted(recreated):
        pod = p.gang.workers.get(rank)
        if pod is not None:
            p.delete(pod, REASON_WORKER_RECREATED)
    for d in restarting:
        node = d.failure.node_name
        device = d.failure_class is FailureClass.DEVICE_UNHEALTHY and d.worker in recreated
        if device and node and node not in p.avoid_nodes:
            p.avoid_nodes.append(node)
    trigger = classify.lowest(restarting)
    assert trigger is not None
    detail = trigger.failure.detail
    if len(restarting) > 1:
        detail += f" ({len(restarting)} workers failed)"
    record = RestartRecord(
        epoch=epoch,
        trigger=RestartTrigger(
            worker=trigger.worker,
            failure_class=trigger.failure_class,
            detail=detail,
            action=trigger.action,
        ),
        detected_at=p.now,
        counted=counted or None,
        **_recreated_fields(recreated, p.job.spec.replicas),
    )
    if p.last_restart is not None and p.last_restart.barrier_open_at is None:
        # Superseded before its barrier opened: the history keeps it, unfinished.
        p.history.append(p.last_restart)
    p.last_restart = record
    p.epoch = epoch
    r = p.restarts
    p.restarts = RestartCounts(
        total=r.total + 1,
        counted=r.counted + counted,
        in_place=r.in_place + (not recreated),
        recreated_workers=r.recreated_workers + len(recreated),
    )
    message = f"Restarting the gang at epoch {epoch}: {worker_text(p, trigger.worker)} " + (
        f"{trigger.failure_class}: {detail}"
    )
    if recreated:
        message += f"; recreating {_ranks_text(recreated, p.job.spec.replicas)}"
    p.phase = Phase.RESTARTING
    p.set_condition(ConditionType.RESTARTING, ConditionStatus.TRUE, trigger.failure_class, message)
    p.events.append(EventSpec("Warning", REASON_GANG_RESTARTING, message))
    p.restart_started = record
    p.acted = restarting


def _to_recreate(p: Pass, restarting: list[Decision]) -> set[int]:
    """Ranks created anew by a restart: all in `Recreate` mode; else those the policy recreates,
    those whose pod is gone, and those that cannot restart in place."""
    replicas = p.job.spec.replicas
    if p.effective_mode is RestartMode.RECREATE:
        return set(range(replicas))
    ranks = {
        d.worker
        for d in restarting
        if d.action is FailureAction.RECREATE_WORKER or not d.failure.in_place
    }
    ranks.update(rank for rank in range(replicas) if rank not in p.gang.workers)
    ranks.update(rank for rank, pod in p.gang.live.items() if _stuck(p, pod) is not None)
    return ranks


def _stuck(p: Pass, pod: PodView) -> tuple[FailureClass, str] | None:
    """Why a live worker cannot restart in place (its pod finished, its node is lost, or in
    `Process` mode its trainer's container, the agent, is dead), or None."""
    if pod.phase in POD_TERMINAL:
        return FailureClass.POD_FAILED, f"pod is {pod.phase}"
    if pod.node_name is not None:
        lost = classify.node_lost(pod.node_name, p.node_of(pod))
        if lost is not None:
            return FailureClass.NODE_LOST, lost
    trainer = pod.container(p.job.spec.trainer_container_name)
    if p.effective_mode is RestartMode.PROCESS and trainer and trainer.state == "terminated":
        return FailureClass.PROCESS_EXIT, f"container {trainer.name} (the agent) terminated"
    return None


def _delete_recreated(p: Pass) -> bool:
    """The old pods of the workers the current restart recreates are deleted until they are
    gone: a pass after a lost delete asks again, from the status alone."""
    last = p.last_restart
    if last is None or last.epoch != p.epoch:
        return False
    for rank in last.recreated_ranks(p.job.spec.replicas):
        pod = p.gang.live.get(rank)
        # The pod created for the restart is at its epoch; any older one is to go.
        if pod is not None and (pod.created_epoch is None or pod.created_epoch < p.epoch):
            p.delete(pod, REASON_WORKER_RECREATED)
    return False


def _recreate_laggards(p: Pass) -> bool:
    """Workers the barrier waits for in vain are recreated at the epoch, without a bump (nobody
    runs at it yet): those below it that cannot restart in place, and those not arrived
    `spec.restart.barrierTimeoutSeconds` after the restart began (or their pod was created)."""
    if p.barrier_epoch == p.epoch:
        return False
    last = p.last_restart if p.last_restart and p.last_restart.epoch == p.epoch else None
    timeout = p.job.spec.restart.barrier_timeout_seconds
    for rank, pod in sorted(p.staying().items()):
        if pod.arrived_epoch == p.epoch:
            continue
        failure: classify.Failure | None = None
        stuck = None if at_epoch(pod, p.epoch) else _stuck(p, pod)
        if stuck is not None:
            cls, detail = stuck
            failure = classify.Failure(rank, cls, detail, node_name=pod.node_name, in_place=False)
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
    p.last_restart = last.model_copy(
        update=_recreated_fields({*last.recreated, rank}, p.job.spec.replicas)
    )
    r = p.restarts
    p.restarts = r.model_copy(update={"recreated_workers": r.recreated_workers + 1})
    p.acted.append(Decision(failure, FailureAction.RECREATE_WORKER, counted=False))
    p.events.append(
        EventSpec(
            "Warning",
            REASON_WORKER_RECREATED,
            f"Recreating {worker_text(p, rank)} at epoch {p.epoch}: "
            f"{failure.failure_class}: {failure.detail}",
        )
    )


def _create(p: Pass) -> bool:
    """The Service if missing, and every missing rank's pod, at the epoch of this pass."""
    if not p.observed.service_exists:
        p.create_service = podspec.build_service(p.job)
    name = p.job.metadata.name
    job = job_for_pods(p, p.effective_mode)
    # A pod of this name still terminating counts as present: a second pod of the same name
    # cannot be created, and the new one waits for the old to be gone. A force-delete (grace
    # 0, no finalizers of ours) frees the name at once, and reconcile deletes before it creates.
    forced = {d.name for d in p.delete_pods.values() if d.grace_seconds == 0}
    taken = p.gang.names - forced
    for rank in range(p.job.spec.replicas):
        if podspec.pod_name(name, rank) in taken:
            continue
        try:
            pod = podspec.build_pod(job, rank, p.config.agent_image, p.config.arrival_url)
        except ValueError as e:
            return _invalid_template(p, e)
        p.create_pods[rank] = finish_pod(pod, p.effective_mode, p.avoid_nodes)
    if p.create_pods:
        count = len(p.create_pods)
        p.events.append(
            EventSpec("Normal", REASON_WORKERS_CREATED, f"Created {count} worker pod(s)")
        )
    if p.start_time is None and (p.create_pods or p.gang.workers):
        p.start_time = p.stamp
    return False


def _invalid_template(p: Pass, error: ValueError) -> bool:
    """podspec cannot build a worker from the template: say why, once, and create nothing
    until the spec changes."""
    reason = getattr(error, "reason", REASON_INVALID_TEMPLATE)
    if not isinstance(reason, str) or not reason.isalnum():
        reason = REASON_INVALID_TEMPLATE
    message = f"Cannot build worker pods: {error}"
    p.create_pods.clear()
    ready = get_condition(p.conditions, ConditionType.READY)
    if ready is None or (ready.reason, ready.message) != (reason, message):
        p.events.append(EventSpec("Warning", reason, message))
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, reason, message)
    return True


def _barrier(p: Pass) -> bool:
    """The barrier of `status.epoch` opens once every worker has arrived at it: all ranks
    present, none terminating or being deleted, each arrived at exactly the epoch; never over a
    failure that waits for its restart."""
    if p.barrier_epoch == p.epoch or p.pending_failure:
        return False
    staying = p.staying()
    if len(staying) < p.job.spec.replicas:
        return False
    if any(pod.arrived_epoch != p.epoch for pod in staying.values()):
        return False
    p.barrier_epoch = p.epoch
    p.barrier_opened_at = p.now
    last = p.last_restart
    if last is None or last.epoch != p.epoch or last.barrier_open_at is not None:
        return False
    duration = max(0.0, (p.now - last.detected_at).total_seconds())
    done = last.model_copy(update={"barrier_open_at": p.now, "duration_seconds": duration})
    p.last_restart = done
    p.history.append(done)
    message = (
        f"Every worker arrived at epoch {p.epoch}: the gang restarted in {duration:.2f}s "
        f"(trigger: {worker_text(p, last.trigger.worker)} {last.trigger.failure_class})"
    )
    p.set_condition(ConditionType.RESTARTING, ConditionStatus.FALSE, REASON_BARRIER_OPEN, message)
    p.events.append(EventSpec("Normal", REASON_GANG_RESTARTED, message))
    p.restart_finished = done
    return False


def _running(p: Pass) -> bool:
    """Restarting until the barrier of a restart opens; then Pending until every worker is
    Running and Ready, then Running."""
    replicas = p.job.spec.replicas
    # Counted as they will be once this plan is carried out, as `workers_status` does.
    live = p.staying()
    ready = sum(pod.phase == POD_RUNNING and pod.ready for pod in live.values())
    message = f"{ready}/{replicas} workers ready"
    restarting = p.last_restart is not None and p.last_restart.epoch == p.epoch
    if restarting and p.barrier_epoch != p.epoch:
        p.phase = Phase.RESTARTING
    elif ready == replicas:
        p.phase = Phase.RUNNING
    else:
        p.phase = Phase.PENDING
    if ready == replicas:
        p.set_condition(ConditionType.READY, ConditionStatus.TRUE, REASON_WORKERS_READY, message)
    else:
        p.set_condition(
            ConditionType.READY, ConditionStatus.FALSE, REASON_WORKERS_NOT_READY, message
        )
    return True


STEPS: Final[tuple[PlanStep, ...]] = (
    _stop_if_job_deleted,
    _delete_strays,
    _force_delete_lost,
    _finished,
    _suspend,
    _choose_mode,
    _complete,
    _delete_recreated,
    _classify,
    _fail_by_policy,
    _restart,
    _recreate_laggards,
    _create,
    _barrier,
    _running,
)


_DEFAULT_CONFIG: Final = PlanConfig()


def plan(observed: Observed, config: PlanConfig = _DEFAULT_CONFIG) -> Plan:
    """Decide what one reconcile of `observed.job` does.

    Raises ValueError if pods are to be created for a job without `metadata.uid` (the apiserver
    always sets one): a pod must be owned by its job.
    """
    status = observed.job.status
    p = Pass(
        observed=observed,
        config=config,
        gang=sort_pods(observed.job, arrived_by_barrier(observed.pods, status)),
        phase=status.phase,
        conditions=list(status.conditions),
        start_time=status.start_time,
        completion_time=status.completion_time,
        epoch=status.epoch,
        barrier_epoch=status.barrier_epoch,
        barrier_opened_at=status.barrier_opened_at,
        restarts=status.restarts,
        last_restart=status.last_restart,
        history=list(status.history),
        mode=status.mode,
        avoid_nodes=list(status.avoid_nodes or ()),
    )
    for step in STEPS:
        if step(p):
            break
    return p.plan()


# --- decisions, as small pure functions -------------------------------------------------------


def _restarting(decisions: Sequence[Decision]) -> list[Decision]:
    return [
        d
        for d in decisions
        if d.action in (FailureAction.RESTART_GANG, FailureAction.RECREATE_WORKER)
    ]


def _recreated_fields(ranks: set[int], replicas: int) -> dict[str, Any]:
    """A restart record's `recreated`/`recreatedAll`: every agent watches the GangJob, so a
    gang of 5000 all recreated is one flag, not 5000 ranks in every write they all receive."""
    if _every_rank(ranks, replicas):
        return {"recreated": [], "recreated_all": True}
    return {"recreated": sorted(ranks), "recreated_all": None}


RANKS_SHOWN: Final = 10
"""Ranks a message lists before it says how many more: messages are read by people."""


def _every_rank(ranks: set[int], replicas: int) -> bool:
    return ranks >= set(range(replicas))


def _ranks_text(ranks: set[int], replicas: int) -> str:
    if _every_rank(ranks, replicas):
        return f"all {replicas} workers"
    shown = sorted(ranks)[:RANKS_SHOWN]
    more = len(ranks) - len(shown)
    return f"worker(s) {shown}" + (f" and {more} more" if more else "")


def finish_pod(
    pod: dict[str, Any], mode: RestartMode, avoid_nodes: Sequence[str]
) -> dict[str, Any]:
    """What plan adds to podspec's worker pod: the mode it is built for (the mode fallback
    reads it back), and a required node affinity that keeps it off `avoid_nodes`."""
    metadata = pod.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[ANNOTATION_RESTART_MODE] = mode.value
    if avoid_nodes:
        avoid = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(avoid_nodes)}
        affinity = pod.setdefault("spec", {}).setdefault("affinity", {})
        node_affinity = affinity.setdefault("nodeAffinity", {})
        required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        # Node selector terms are ORed: the exclusion must be part of every one of them.
        terms = required.get("nodeSelectorTerms") or [{}]
        required["nodeSelectorTerms"] = [
            {**term, "matchExpressions": [*(term.get("matchExpressions") or []), avoid]}
            for term in terms
        ]
    return pod


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


def worker_succeeded(pod: PodView, epoch: int, trainer: str) -> bool:
    """The worker's training finished with success: its pod Succeeded, or at `epoch` its
    trainer exited 0 (its container, or as the agent reported in `Process` mode)."""
    if pod.phase == POD_SUCCEEDED:
        return True
    if not at_epoch(pod, epoch):
        return False
    if pod.reported_exit == (epoch, 0):
        return True
    container = pod.container(trainer)
    return container is not None and container.state == "terminated" and container.exit_code == 0


def job_succeeded(job: GangJob, workers: Mapping[int, PodView]) -> tuple[str, str] | None:
    """(reason, message) if the job has succeeded by its successPolicy, else None."""
    epoch, trainer = job.status.epoch, job.spec.trainer_container_name
    succeeded = {rank for rank, pod in workers.items() if worker_succeeded(pod, epoch, trainer)}
    if job.spec.success_policy is SuccessPolicy.RANK0:
        if 0 in succeeded:
            return REASON_RANK0_SUCCEEDED, "Rank 0 succeeded"
        return None
    if len(succeeded) == job.spec.replicas:
        return REASON_ALL_SUCCEEDED, f"All {job.spec.replicas} workers succeeded"
    return None
