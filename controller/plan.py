"""The controller's policy, pure: from what was observed of one GangJob (the job, its pods, the
nodes, the time) to a `Plan` of what reconcile must do (the desired status, pods and Service to
create, pods to delete, Events). All decisions of DESIGN.md sections 3-4 live here; no I/O.

`plan` runs a flat sequence of small steps over one `_Pass`. Each step reads the observation,
adds to the pass (status fields, creates, deletes, events), and returns True to end the pass
early, as jobset's reconciler does. The restart protocol slots in as more steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from api.constants import HISTORY_LIMIT, ConditionType
from api.v1alpha1 import (
    Condition,
    ConditionStatus,
    GangJob,
    GangJobStatus,
    Phase,
    SuccessPolicy,
    WorkersStatus,
)
from controller import podspec
from controller.conditions import is_true, set_condition
from controller.views import NodeView, PodView

# Pod phases (core/v1).
POD_RUNNING: Final = "Running"
POD_SUCCEEDED: Final = "Succeeded"
POD_FAILED: Final = "Failed"
_POD_TERMINAL: Final = frozenset({POD_SUCCEEDED, POD_FAILED})

# Condition reasons and Event reasons (CamelCase).
REASON_WORKERS_READY: Final = "AllWorkersReady"
REASON_WORKERS_NOT_READY: Final = "WorkersNotReady"
REASON_WORKERS_CREATED: Final = "WorkersCreated"
REASON_WORKER_FAILED: Final = "WorkerFailed"
REASON_ALL_SUCCEEDED: Final = "AllWorkersSucceeded"
REASON_RANK0_SUCCEEDED: Final = "Rank0Succeeded"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_SUCCEEDED: Final = "Succeeded"
REASON_FAILED: Final = "Failed"
REASON_JOB_FINISHED: Final = "JobFinished"
REASON_STRAY_POD: Final = "StrayPod"


@dataclass(frozen=True)
class PlanConfig:
    """Settings of the controller that policy depends on."""

    agent_image: str = "localhost/gangjob-agent:dev"


@dataclass(frozen=True)
class Observed:
    """Everything `plan` may look at, read from the caches by reconcile."""

    job: GangJob
    pods: Sequence[PodView]
    """Every pod labelled gangjob.io/name=<job> in the job's namespace."""
    nodes: Mapping[str, NodeView]
    """Node name -> view, for all nodes of the cluster."""
    service_exists: bool
    """The headless Service <job> exists."""
    now: datetime
    """Aware UTC."""


@dataclass(frozen=True)
class PodDelete:
    """Delete one pod, preconditioned on its UID (a same-named successor is never hit)."""

    name: str
    uid: str
    grace_seconds: int | None = None
    """None: the pod's own grace period; 0: force."""
    mark_failed: bool = False
    """Set the pod's phase Failed (status patch) before deleting it: the force-delete protocol
    of DESIGN.md section 4 (next issue)."""
    reason: str = ""


@dataclass(frozen=True)
class EventSpec:
    """An Event on the GangJob, emitted once the status write succeeded."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What one reconcile must do."""

    status: GangJobStatus
    """The complete desired status; reconcile writes it only if != job.status."""
    create_service: dict[str, Any] | None
    create_pods: list[dict[str, Any]]
    """Complete pod manifests (from podspec)."""
    delete_pods: list[PodDelete]
    events: list[EventSpec]
    delete_job: bool = False
    """ttlSecondsAfterFinished has elapsed."""
    requeue_after: float | None = None
    """Seconds until a timer fires (ttl, backoff, guards)."""


# --- the pass -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Gang:
    """The observed pods sorted out once: workers by rank, and the rest."""

    workers: dict[int, PodView]
    """Rank -> its pod: ours (controller ownerReference to this job), rank in range, named
    `<job>-<rank>`. At most one per rank, because the name is derived from the rank."""
    strays: list[PodView]
    """Ours, but not a worker: rank missing or out of range, or a name not `<job>-<rank>`."""
    names: frozenset[str]
    """Names of every observed pod, ours or not, terminating or not: a name still taken."""
    live: dict[int, PodView]
    """The workers not being deleted: those that can still work, fail or succeed."""


def _sort_pods(job: GangJob, pods: Sequence[PodView]) -> _Gang:
    workers: dict[int, PodView] = {}
    strays: list[PodView] = []
    for pod in pods:
        # A pod controlled by another object (a deleted namesake GangJob's leftovers, or an
        # orphan) is not ours to count or delete; it still holds its name.
        if job.metadata.uid is None or pod.controller_uid != job.metadata.uid:
            continue
        rank = pod.rank
        if (
            rank is not None
            and 0 <= rank < job.spec.replicas
            and pod.name == podspec.pod_name(job.metadata.name, rank)
        ):
            workers[rank] = pod
        else:
            strays.append(pod)
    live = {rank: pod for rank, pod in workers.items() if not pod.terminating}
    return _Gang(workers, strays, frozenset(pod.name for pod in pods), live)


@dataclass
class _Pass:
    """One planning pass: the observation, and the plan being gathered."""

    observed: Observed
    config: PlanConfig
    gang: _Gang
    # The status being built, starting from the observed one.
    phase: Phase | None
    conditions: list[Condition]
    start_time: datetime | None
    completion_time: datetime | None
    create_service: dict[str, Any] | None = None
    create_pods: dict[int, dict[str, Any]] = field(default_factory=dict)
    delete_pods: dict[str, PodDelete] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None

    @property
    def job(self) -> GangJob:
        return self.observed.job

    @property
    def now(self) -> datetime:
        return self.observed.now

    @property
    def stamp(self) -> datetime:
        """`now` as status timestamps store it (whole seconds), so that a pass that computes
        from a timestamp it wrote gets the same result as the next, which reads it back."""
        return self.observed.now.replace(microsecond=0)

    def set_condition(
        self, type_: ConditionType, status: ConditionStatus, reason: str, message: str
    ) -> None:
        self.conditions = set_condition(
            self.conditions,
            type_,
            status,
            reason,
            message,
            self.now,
            self.job.metadata.generation,
        )

    def delete(self, pod: PodView, reason: str) -> None:
        # A pod already terminating was deleted before: asking again changes nothing.
        if not pod.terminating:
            self.delete_pods[pod.name] = PodDelete(name=pod.name, uid=pod.uid, reason=reason)

    def requeue(self, seconds: float) -> None:
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def is_finished(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def workers_status(self) -> WorkersStatus:
        """Counts as they will be once this plan is carried out, so that the next pass, which
        sees the created pods and the deleted ones terminating, computes the same counts."""
        live = {
            rank: pod for rank, pod in self.gang.live.items() if pod.name not in self.delete_pods
        }
        epoch = self.job.status.epoch
        return WorkersStatus(
            total=len(live) + len(self.create_pods),
            ready=sum(pod.ready for pod in live.values()),
            arrived=sum(pod.arrived_epoch == epoch for pod in live.values()),
        )

    def status(self) -> GangJobStatus:
        old = self.job.status
        return GangJobStatus(
            phase=self.phase,
            # The epoch is the restart protocol's (next issue); it is never lowered.
            epoch=old.epoch,
            barrier_epoch=old.barrier_epoch,
            workers=self.workers_status(),
            restarts=old.restarts,
            last_restart=old.last_restart,
            history=old.history[-HISTORY_LIMIT:],
            conditions=self.conditions,
            observed_generation=self.job.metadata.generation,
            start_time=self.start_time,
            completion_time=self.completion_time,
            mode=old.mode,
        )

    def plan(self) -> Plan:
        return Plan(
            status=self.status(),
            create_service=self.create_service,
            create_pods=[self.create_pods[rank] for rank in sorted(self.create_pods)],
            delete_pods=list(self.delete_pods.values()),
            events=self.events,
            delete_job=self.delete_job,
            requeue_after=self.requeue_after,
        )


Step = Callable[[_Pass], bool]
"""A step of the pass: adds to it, and returns True to end the pass."""


# --- steps, in order --------------------------------------------------------------------------


def _delete_strays(p: _Pass) -> bool:
    """Pods of ours that are no worker (scaled away, rank label missing or wrong name) go."""
    for pod in p.gang.strays:
        p.delete(pod, REASON_STRAY_POD)
    return False


def _stop_if_job_deleted(p: _Pass) -> bool:
    """A job being deleted gets nothing new: garbage collection is removing its pods, and
    creating more would race it."""
    return p.job.metadata.deletion_timestamp is not None


def _finished(p: _Pass) -> bool:
    """A Succeeded or Failed job stays so: it only frees its devices and waits for its TTL."""
    if not p.is_finished():
        return False
    # Running workers hold GPUs for nothing; finished ones are kept for their logs.
    for pod in p.gang.workers.values():
        if pod.phase not in _POD_TERMINAL:
            p.delete(pod, REASON_JOB_FINISHED)
    _ttl(p)
    return True


def _ttl(p: _Pass) -> None:
    ttl = p.job.spec.ttl_seconds_after_finished
    if ttl is None or p.completion_time is None:
        return
    remaining = (p.completion_time + timedelta(seconds=ttl) - p.now).total_seconds()
    if remaining <= 0:
        p.delete_job = True
    else:
        p.requeue(remaining)


def _suspend(p: _Pass) -> bool:
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


def _complete(p: _Pass) -> bool:
    """The job succeeds per its successPolicy, or fails on a worker failure; then it is
    finished and handled as such."""
    outcome = job_succeeded(p.job, p.gang.live)
    if outcome is not None:
        reason, message = outcome
        _finish(p, Phase.SUCCEEDED, ConditionType.SUCCEEDED, reason, message)
        p.events.append(EventSpec("Normal", REASON_SUCCEEDED, message))
        return _finished(p)
    failure = worker_failure(p.job, p.gang.live)
    if failure is not None:
        reason, message = failure
        _finish(p, Phase.FAILED, ConditionType.FAILED, reason, message)
        p.events.append(EventSpec("Warning", REASON_FAILED, message))
        return _finished(p)
    return False


def _finish(p: _Pass, phase: Phase, type_: ConditionType, reason: str, message: str) -> None:
    p.phase = phase
    p.completion_time = p.stamp
    p.set_condition(type_, ConditionStatus.TRUE, reason, message)
    p.set_condition(ConditionType.READY, ConditionStatus.FALSE, REASON_JOB_FINISHED, message)


def _create(p: _Pass) -> bool:
    """The Service if missing, and every missing rank's pod."""
    if not p.observed.service_exists:
        p.create_service = podspec.build_service(p.job)
    name = p.job.metadata.name
    for rank in range(p.job.spec.replicas):
        # A pod of this name still terminating counts as present: a second pod of the same
        # name cannot be created, and the new one waits for the old to be gone.
        if podspec.pod_name(name, rank) not in p.gang.names:
            p.create_pods[rank] = podspec.build_pod(p.job, rank, p.config.agent_image)
    if p.create_pods:
        count = len(p.create_pods)
        p.events.append(
            EventSpec("Normal", REASON_WORKERS_CREATED, f"Created {count} worker pod(s)")
        )
    if p.start_time is None and (p.create_pods or p.gang.workers):
        p.start_time = p.stamp
    return False


def _running(p: _Pass) -> bool:
    """Pending until every worker is Running and Ready, then Running."""
    replicas = p.job.spec.replicas
    live = p.gang.live
    ready = sum(pod.phase == POD_RUNNING and pod.ready for pod in live.values())
    message = f"{ready}/{replicas} workers ready"
    if ready == replicas:
        p.phase = Phase.RUNNING
        p.set_condition(ConditionType.READY, ConditionStatus.TRUE, REASON_WORKERS_READY, message)
    else:
        p.phase = Phase.PENDING
        p.set_condition(
            ConditionType.READY, ConditionStatus.FALSE, REASON_WORKERS_NOT_READY, message
        )
    return True


STEPS: Final[tuple[Step, ...]] = (
    _stop_if_job_deleted,
    _delete_strays,
    _finished,
    _suspend,
    _complete,
    _create,
    _running,
)


def plan(observed: Observed, config: PlanConfig = PlanConfig()) -> Plan:
    """Decide what one reconcile of `observed.job` does.

    Raises ValueError if pods are to be created for a job without `metadata.uid` (the apiserver
    always sets one): a pod must be owned by its job.
    """
    status = observed.job.status
    p = _Pass(
        observed=observed,
        config=config,
        gang=_sort_pods(observed.job, observed.pods),
        phase=status.phase,
        conditions=list(status.conditions),
        start_time=status.start_time,
        completion_time=status.completion_time,
    )
    for step in STEPS:
        if step(p):
            break
    return p.plan()


# --- decisions, as small pure functions -------------------------------------------------------


def job_succeeded(job: GangJob, workers: Mapping[int, PodView]) -> tuple[str, str] | None:
    """(reason, message) if the job has succeeded by its successPolicy, else None."""
    succeeded = {rank for rank, pod in workers.items() if pod.phase == POD_SUCCEEDED}
    if job.spec.success_policy is SuccessPolicy.RANK0:
        if 0 in succeeded:
            return REASON_RANK0_SUCCEEDED, "Rank 0 succeeded"
        return None
    if len(succeeded) == job.spec.replicas:
        return REASON_ALL_SUCCEEDED, f"All {job.spec.replicas} workers succeeded"
    return None


def worker_failure(job: GangJob, workers: Mapping[int, PodView]) -> tuple[str, str] | None:
    """(reason, message) if a worker failed, else None.

    For now any worker pod in phase Failed fails the job. The restart protocol replaces this
    with classification (DESIGN.md section 4) and gang restarts.
    """
    failed = sorted(rank for rank, pod in workers.items() if pod.phase == POD_FAILED)
    if not failed:
        return None
    message = describe_failure(workers[failed[0]], job.spec.trainer_container_name)
    if len(failed) > 1:
        message += f" ({len(failed)} workers failed)"
    return REASON_WORKER_FAILED, message


def describe_failure(pod: PodView, trainer: str) -> str:
    """Which pod failed and how, for a condition message: the trainer's exit code if it has
    one, else the first failed container's, else the pod's own reason (e.g. Evicted)."""
    head = f"Worker pod {pod.name} (rank {pod.rank}) failed"
    terminated = [c for c in pod.containers if c.state == "terminated"]
    candidates = [c for c in terminated if c.name == trainer] + [
        c for c in terminated if c.name != trainer and c.exit_code not in (None, 0)
    ]
    for container in candidates:
        if container.exit_code is not None:
            why = f" ({container.reason})" if container.reason else ""
            return f"{head}: container {container.name} exited with code {container.exit_code}{why}"
    if pod.reason or pod.message:
        return f"{head}: {': '.join(s for s in (pod.reason, pod.message) if s)}"
    return head
