"""A GangJob's life outside its restarts: stray pods, a job being deleted, suspend and resume,
creating the Service and workers (or saying why the template cannot make them), the phase and
`Ready` condition, finishing (`Succeeded`/`Failed`) and the TTL after (docs/design.md sections 3b
and 5.2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Final

from api import naming
from api.constants import (
    ANNOTATION_RESTART_MODE,
    PLACEMENT_GATE,
    REASON_INVALID_TEMPLATE,
    REASON_JOB_FINISHED,
    REASON_RESUMED,
    REASON_STRAY_POD,
    REASON_SUSPENDED,
    REASON_WORKERS_CREATED,
    REASON_WORKERS_NOT_READY,
    REASON_WORKERS_READY,
    ConditionType,
)
from api.v1alpha1 import CleanPodPolicy, ConditionStatus, Phase, RestartMode, RoleState
from controller.policy import classify, kueue, podspec, stuck
from controller.policy.conditions import get_condition, is_true
from controller.policy.gang import POD_RUNNING, POD_TERMINAL, epoch_workers, surplus
from controller.policy.passstate import (
    EventSpec,
    Pass,
    PodPlacement,
    PodStop,
    RoleProgress,
    job_for_pods,
)
from controller.policy.views import PodView

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
LOST_NODES_KEPT_OFF: Final = 64
"""A new worker's affinity names at most this many lost nodes (as `avoidNodes` keeps 64)."""
_WAITING: Final = RoleProgress(RoleState.WAITING)


def delete_strays(p: Pass) -> bool:
    """Pods of ours that are no worker (rank label missing or wrong name) go; those an elastic
    resize removes go with its bump (`elastic.resize`)."""
    resized_away = {pod.name for pod in surplus(p.job, p.status, p.gang.strays)}
    for pod in p.gang.strays:
        if pod.name not in resized_away:
            p.delete(pod, REASON_STRAY_POD)
    return False


def stop_if_job_deleted(p: Pass) -> bool:
    """A job being deleted gets nothing new: garbage collection is removing its pods, and
    creating more would race it."""
    return p.job.metadata.deletion_timestamp is not None


def finished(p: Pass) -> bool:
    """A Succeeded or Failed job stays so: its workers' pods are cleaned up as
    `spec.cleanPodPolicy` says, and the job waits for its TTL."""
    if not p.is_finished():
        return False
    clean = CLEAN_POD_POLICY[p.job.spec.clean_pod_policy]
    for rank, pod in p.gang.live.items():
        clean(p, rank, pod)
    _ttl(p)
    return True


def _stop_running(p: Pass, rank: int, pod: PodView) -> None:
    """`None`: a worker still running is stopped, its pod kept: it holds devices for nothing,
    and its logs are what the user reads next. One whose trainer has ended ends on its own (the
    kubelet stops a pod's sidecars once its trainer is done; a `Process`-mode agent that
    reported its trainer's exit ends when it sees the job finished): stopped, its pod would
    say `DeadlineExceeded` instead of how the worker ended."""
    if pod.phase in POD_TERMINAL or pod.active_deadline_seconds is not None:
        return
    if not trainer_ended(p, rank, pod):
        p.stop_pods[pod.name] = PodStop(pod.name, pod.uid, REASON_JOB_FINISHED)


def _delete_running(p: Pass, rank: int, pod: PodView) -> None:
    """`Running`: a pod still running goes; finished ones are kept."""
    if pod.phase not in POD_TERMINAL:
        p.delete(pod, REASON_JOB_FINISHED)


def _delete_all(p: Pass, rank: int, pod: PodView) -> None:
    """`All`: every pod goes."""
    p.delete(pod, REASON_JOB_FINISHED)


CLEAN_POD_POLICY: Final[dict[CleanPodPolicy, Callable[[Pass, int, PodView], None]]] = {
    CleanPodPolicy.NONE: _stop_running,
    CleanPodPolicy.RUNNING: _delete_running,
    CleanPodPolicy.ALL: _delete_all,
}
"""What a finished job does with each live worker's pod, by `spec.cleanPodPolicy`."""


def trainer_ended(p: Pass, rank: int, pod: PodView) -> bool:
    """The worker's trainer has ended at `status.epoch`: its container terminated, or its agent
    reported its exit while the container runs on: in `Process` mode (the container is the
    agent's) any exit; in the others a success, whose launcher holds the container until the
    job has finished (`agent.pyz launch`)."""
    trainer = pod.container(p.job.spec.workers[rank].role.trainer_container_name)
    if trainer is not None and trainer.state == "terminated":
        return True
    report = pod.reported_exit
    if report is None or report[0] != p.status.epoch:
        return False
    return p.effective_mode is RestartMode.PROCESS or report[1] == 0


def _ttl(p: Pass) -> None:
    ttl = p.job.spec.ttl_seconds_after_finished
    if ttl is None or p.status.completion_time is None:
        return
    remaining = (p.status.completion_time + timedelta(seconds=ttl) - p.now).total_seconds()
    if remaining <= 0:
        p.delete_job = True
    else:
        p.requeue(remaining)


def finish(p: Pass, phase: Phase, type_: ConditionType, reason: str, message: str) -> None:
    """The job ends in `phase` (Succeeded or Failed), said by condition `type_`; it is no
    longer Ready, nor Restarting."""
    p.status.phase = phase
    p.status.completion_time = p.stamp
    p.set_condition(type_, ConditionStatus.TRUE, reason, message)
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, REASON_JOB_FINISHED, message)
    if is_true(p.status.conditions, ConditionType.RESTARTING):
        p.set_condition(
            ConditionType.RESTARTING, ConditionStatus.FALSE, REASON_JOB_FINISHED, message
        )
    stuck.clear(p, REASON_JOB_FINISHED, message)


def suspend(p: Pass) -> bool:
    """`suspend: true` deletes every pod and holds the job; `false` again resumes it."""
    was_suspended = is_true(p.status.conditions, ConditionType.SUSPENDED)
    if not p.job.spec.suspend:
        if was_suspended:
            p.set_condition(
                ConditionType.SUSPENDED, ConditionStatus.FALSE, REASON_RESUMED, "Job resumed"
            )
            p.events.append(EventSpec("Normal", REASON_RESUMED, "Job resumed"))
        return False
    for pod in p.gang.workers.values():
        p.delete(pod, REASON_SUSPENDED)
    p.status.phase = Phase.SUSPENDED
    p.set_condition(
        ConditionType.SUSPENDED, ConditionStatus.TRUE, REASON_SUSPENDED, "Job suspended"
    )
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, REASON_SUSPENDED, "Job suspended")
    stuck.clear(p, REASON_SUSPENDED, "Job suspended")
    if not was_suspended:
        p.events.append(EventSpec("Normal", REASON_SUSPENDED, "Job suspended: deleting workers"))
    return True


def _background(p: Pass) -> frozenset[int]:
    """The workers out of the world whose pods may be made now (docs/design.md section
    3.12): none while a restart's barrier stays shut, so that the new pod of a recreated
    worker, a spare to be, and its scheduling wake no pass of the gang while its agents
    arrive; all of them once it is open, or opens in this pass (`Pass.barrier_opens`), and
    at the gang's first start."""
    first = p.status.barrier_epoch is None
    if first or p.status.barrier_epoch == p.status.epoch or p.barrier_opens():
        return p.dropped()
    return frozenset()


def create(p: Pass) -> bool:
    """The Service if missing, and the pod of every missing worker of a running role, at the
    epoch of this pass."""
    if not p.observed.service_exists:
        p.create_service = podspec.build_service(p.job)
    job = job_for_pods(p, p.effective_mode)
    # A pod of this name still terminating counts as present: a second pod of the same name
    # cannot be created, and the new one waits for the old to be gone. A force-delete (grace
    # 0, no finalizers of ours) frees the name at once, and reconcile deletes before it creates.
    forced = {d.name for d in p.delete_pods.values() if d.grace_seconds == 0}
    taken = p.gang.names - forced
    keep_off: list[str] | None = None
    # A dropped worker keeps a pod, pending: once it is placed, the gang grows back (or it
    # is a spare).
    workers = p.gang.workers
    for rank in sorted({*p.active(), *_background(p)}):
        present = workers.get(rank)
        if present is not None and present.name not in forced:
            continue  # its pod has the worker's name (`sort_pods`), which is taken
        if naming.worker_pod_name(job, rank) in taken:
            continue
        try:
            pod = podspec.build_pod(
                job, rank, p.config.agent_image, p.config.arrival_url, p.config.arrival_ca
            )
        except ValueError as e:
            return _invalid_template(p, e)
        if keep_off is None:
            keep_off = nodes_kept_off(p)
        if kueue.queue_name(p.job) is None:
            p.create_pods[rank] = finish_pod(pod, p.effective_mode, keep_off)
        else:
            # Kueue's role hash, taken at creation, covers the affinity: a worker of another
            # shape than its group's is no member of the admitted Workload and stays gated.
            # Created with the group's shape and gated by us, it is kept off by `place`.
            pod = finish_pod(pod, p.effective_mode, [])
            if keep_off:
                gates = pod["spec"].setdefault("schedulingGates", [])
                gates.append({"name": PLACEMENT_GATE})
            p.create_pods[rank] = pod
    if p.create_pods:
        count = len(p.create_pods)
        p.events.append(
            EventSpec("Normal", REASON_WORKERS_CREATED, f"Created {count} worker pod(s)")
        )
    if p.status.start_time is None and (p.create_pods or p.gang.workers):
        p.status.start_time = p.stamp
    return False


def place(p: Pass) -> bool:
    """A new worker of a Kueue pod group gated by us (`PLACEMENT_GATE`) is kept off the nodes
    to avoid right now: its required node affinity narrowed as `finish_pod` would have built it
    (the apiserver allows narrowing it while the pod is gated), and our gate lifted, in one
    write conditional on the pod's version. Kueue lifts its own gate when the group is
    admitted; the pod is scheduled once both are gone."""
    keep_off: list[str] | None = None
    for rank, pod in p.gang.live.items():
        if PLACEMENT_GATE not in pod.scheduling_gates or pod.resource_version is None:
            continue
        if keep_off is None:
            keep_off = nodes_kept_off(p)
        affinity = None
        if keep_off:
            job = job_for_pods(p, p.effective_mode)
            try:
                built = podspec.build_pod(
                    job, rank, p.config.agent_image, p.config.arrival_url, p.config.arrival_ca
                )
            except ValueError:
                continue  # `create` says why the template cannot make workers
            affinity = finish_pod(built, p.effective_mode, keep_off)["spec"]["affinity"]
        gates = tuple(g for g in pod.scheduling_gates if g != PLACEMENT_GATE)
        p.place_pods.append(PodPlacement(pod.name, pod.resource_version, affinity, gates))
    return False


def nodes_kept_off(p: Pass) -> list[str]:
    """The nodes a worker created now keeps off: `avoidNodes`, and the nodes lost right now."""
    avoided = p.avoided()
    return avoided + [n for n in lost_nodes(p) if n not in avoided]


def _invalid_template(p: Pass, error: ValueError) -> bool:
    """podspec cannot build a worker from the template: say why, once, and create nothing
    until the spec changes."""
    reason = getattr(error, "reason", REASON_INVALID_TEMPLATE)
    if not isinstance(reason, str) or not reason.isalnum():
        reason = REASON_INVALID_TEMPLATE
    message = f"Cannot build worker pods: {error}"
    p.create_pods.clear()
    ready = get_condition(p.status.conditions, ConditionType.READY)
    if ready is None or (ready.reason, ready.message) != (reason, message):
        p.events.append(EventSpec("Warning", reason, message))
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, reason, message)
    return True


def lost_nodes(p: Pass) -> list[str]:
    """The nodes lost right now (`classify.node_lost`), at most `LOST_NODES_KEPT_OFF`: a new
    worker is kept off them. The scheduler keeps off a NotReady node only once the node
    lifecycle controller has tainted it, and that controller, slowed by an overloaded
    apiserver, may lag behind the condition: a worker recreated for a lost node landed on
    another lost one, which restarted the gang again, eight times in a row in the fault
    campaign. Unlike `avoidNodes`, a node that comes back is used again."""
    lost = sorted(name for name, node in p.observed.nodes.items() if classify.node_lost(name, node))
    return lost[:LOST_NODES_KEPT_OFF]


def _out_of_world(p: Pass) -> frozenset[int]:
    """The workers of an elastic gang outside the world of `status.epoch`: `status.dropped`,
    and the numbers past it (a grow's new workers, until its bump)."""
    if p.job.spec.elasticity is None:
        return frozenset()
    spanned = epoch_workers(p.status)
    beyond = range(spanned, len(p.job.spec.workers)) if spanned is not None else range(0)
    return p.dropped() | frozenset(beyond)


def finish_pod(
    pod: dict[str, Any], mode: RestartMode, avoid_nodes: Sequence[str]
) -> dict[str, Any]:
    """What plan adds to podspec's worker pod: the mode it is built for (the mode fallback
    reads it back), and a required node affinity that keeps it off `avoid_nodes` (the
    job's `avoidNodes` and the nodes lost right now)."""
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


def running(p: Pass) -> bool:
    """Restarting until the barrier of a restart opens; then Pending until every worker of the
    roles not complete (waiting ones included) is Running and Ready, then Running. An elastic
    gang's workers out of the world (spares, workers waiting for room, a grow's workers
    starting behind the open barrier) are not waited for: the gang trains without them."""
    out = _out_of_world(p)
    expected = [
        w.worker
        for w in p.job.spec.workers
        if p.roles.get(w.role.name, _WAITING).state is not RoleState.COMPLETE
        and w.worker not in out
    ]
    replicas = len(expected)
    # Counted as they will be once this plan is carried out, as `workers_status` does.
    live = p.staying()
    ready = sum(live[w].phase == POD_RUNNING and live[w].ready for w in expected if w in live)
    message = f"{ready}/{replicas} workers ready"
    if out:
        message += f" ({len(out)} more out of the world: spares, waiting for room or joining)"
    restarting = p.status.last_restart is not None and p.status.last_restart.epoch == p.status.epoch
    if restarting and p.status.barrier_epoch != p.status.epoch:
        p.status.phase = Phase.RESTARTING
    elif ready == replicas:
        p.status.phase = Phase.RUNNING
    else:
        p.status.phase = Phase.PENDING
    if ready == replicas:
        p.set_condition(ConditionType.READY, ConditionStatus.TRUE, REASON_WORKERS_READY, message)
    else:
        p.set_condition(
            ConditionType.READY, ConditionStatus.FALSE, REASON_WORKERS_NOT_READY, message
        )
    return True
