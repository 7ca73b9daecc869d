"""One planning pass: what it reads (`Observed`, `PlanConfig`), the `Pass` its steps add to, and
what it yields (`Plan`, with its `PodDelete`s and `EventSpec`s) (docs/design.md section 5.2).
`controller.policy.plan` exports these types; the policy modules share `Pass`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from api import naming
from api.constants import AVOID_NODES_LIMIT, HISTORY_LIMIT, ConditionType
from api.failures import FailureClass
from api.v1alpha1 import (
    ConditionStatus,
    GangJob,
    GangJobStatus,
    Phase,
    RestartMode,
    RestartRecord,
    RoleState,
    RoleStatus,
    WorkersStatus,
)
from controller.policy.classify import Decision, node_lost
from controller.policy.conditions import set_condition
from controller.policy.gang import Gang
from controller.policy.views import NodeView, PodView

if TYPE_CHECKING:
    from controller.policy.straggler import Straggler


@dataclass(frozen=True)
class PlanConfig:
    """Settings of the controller that policy depends on."""

    agent_image: str = "localhost/gangjob-agent:dev"
    arrival_url: str | None = None
    """The controller's arrival endpoint as pods reach it (controller.arrivals); None: agents
    arrive by annotation only."""
    arrival_ca: str | None = None
    """The CA (PEM) of an `https://` `arrival_url`, given to every agent (policy/podspec.py)."""
    pod_groups_served: bool | None = None
    """The apiserver serves `scheduling.k8s.io/v1alpha2` PodGroups (KEP-4671), as discovered
    when this replica started leading; None: not discovered, and plan leaves gang scheduling
    alone (no condition, no PodGroup)."""
    pod_group_topology_served: bool | None = None
    """The apiserver keeps a PodGroup's `schedulingConstraints.topology` (feature gate
    `TopologyAwareWorkloadScheduling`), as a dry-run create of a Workload showed when this
    replica started leading; None: not known, and taken as not kept."""
    pod_group_disruption_served: bool | None = None
    """The apiserver keeps a PodGroup's `disruptionMode` (feature gate
    `WorkloadAwarePreemption`), learnt as `pod_group_topology_served` is; None: not known, and
    nothing is said about it."""
    barrier_stall_seconds: float = 120.0
    """A barrier still short of workers this long (since the restart, or the worker's pod was
    created) makes the gang `Stuck` (`BarrierStalled`), naming who has not arrived; at most
    `spec.restart.barrierTimeoutSeconds`."""
    recheck_seconds: float = 30.0
    """How often a gang that is not running at an open barrier, or is stuck, is looked at
    again with no event: the causes of `Stuck` outside the cache (the workers' RBAC) change
    without one."""


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
    denied: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Worker ServiceAccount name -> what the agent needs that it may not do (`get pods`, ...),
    by SubjectAccessReview; a name missing: allowed, or not known."""
    creation_refused: str | None = None
    """The apiserver's answer to the last refused creation of a worker pod of this job, until
    one is created again."""


@dataclass(frozen=True)
class PodDelete:
    """Delete one pod, preconditioned on its UID (a same-named successor is never hit)."""

    name: str
    uid: str
    grace_seconds: int | None = None
    """None: the pod's own grace period; 0: force."""
    mark_failed: bool = False
    """Set the pod's phase Failed (status patch) before deleting it: the force-delete protocol
    of docs/design.md section 4.5."""
    reason: str = ""


@dataclass(frozen=True)
class PodStop:
    """Stop one pod without deleting it, preconditioned on its UID: its
    `spec.activeDeadlineSeconds` is set to `STOP_DEADLINE_SECONDS`, already past for a pod that
    ran, and the kubelet ends it (`Failed`, reason `DeadlineExceeded`), its containers and their
    logs kept."""

    name: str
    uid: str
    reason: str = ""


@dataclass(frozen=True)
class PodPlacement:
    """Narrow a gated pod's node affinity to `affinity` (None: leave it) and set its scheduling
    gates to `gates`, on condition that it is still at `resource_version` (a merge patch
    replaces the whole list: a gate Kueue lifted meanwhile is never put back)."""

    name: str
    resource_version: str
    affinity: dict[str, Any] | None
    gates: tuple[str, ...]


STOP_DEADLINE_SECONDS: Final = 1
"""The smallest `activeDeadlineSeconds` the apiserver takes."""


@dataclass(frozen=True)
class FinalizerRelease:
    """Set the finalizers of pod `name` to `kept`, on condition that it is still at
    `resource_version` (a merge patch replaces the whole list; a same-named successor, or a
    finalizer added meanwhile, is never hit)."""

    name: str
    resource_version: str
    kept: tuple[str, ...]


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
    """Seconds until a timer fires (ttl, backoff, barrier timeout, force-delete guard)."""
    restart_started: RestartRecord | None = None
    """The restart this pass began (the epoch was raised): for the restart's trace span."""
    restart_finished: RestartRecord | None = None
    """The restart whose barrier this pass opened, with its timings."""
    failures: list[Decision] = field(default_factory=list)
    """The failures this pass acted on (a restart, a recreated worker, the job failed), each
    with its class, action and whether it counted: for `gangjob_restarts_total{class,action}`.
    A failure is acted on in one pass only; ignored failures are never listed."""
    create_workload: dict[str, Any] | None = None
    create_pod_group: dict[str, Any] | None = None
    """Gang scheduling (controller.policy.scheduling): created, Workload first, before the
    pods; either may exist already."""
    release_finalizers: list[FinalizerRelease] = field(default_factory=list)
    """Finalizers of other controllers lifted from pods being deleted (Kueue's)."""
    stop_pods: list[PodStop] = field(default_factory=list)
    """Workers still running when the job finished, stopped but kept (`spec.cleanPodPolicy`)."""
    place_pods: list[PodPlacement] = field(default_factory=list)
    """New workers of a Kueue pod group kept off nodes, then ungated (`PLACEMENT_GATE`)."""
    every_step: bool = True
    """Every step ran: none ended the pass for the next one to go on from its outcome."""

    def settled(self) -> bool:
        """Planning again over this plan's status alone decides nothing new: every step ran and
        the plan asks for nothing but the status (and Events). Plan over a carried-out plan
        repeats nothing (tests/unit/test_plan.py), so once the status is stored, only a change
        of something else (a pod, a node, a report, the spec, a timer) needs another pass."""
        return self.every_step and not (
            self.create_service
            or self.create_pods
            or self.delete_pods
            or self.delete_job
            or self.create_workload
            or self.create_pod_group
            or self.release_finalizers
            or self.stop_pods
            or self.place_pods
        )


@dataclass(frozen=True)
class RoleProgress:
    """Where a role stands in this pass (`status.roles[].state`, `startedLateAt`)."""

    state: RoleState
    started_late_at: int | None = None


@dataclass
class Pass:
    """One planning pass: the observation, and the plan being gathered."""

    observed: Observed
    config: PlanConfig
    gang: Gang
    status: GangJobStatus
    """The status being built: a copy of the observed one, each field written by the step that
    owns it; what is counted from the whole pass (workers, roles, the generation) and the list
    limits are applied at the end (`finish_status`). """
    create_service: dict[str, Any] | None = None
    create_pods: dict[int, dict[str, Any]] = field(default_factory=dict)
    create_workload: dict[str, Any] | None = None
    create_pod_group: dict[str, Any] | None = None
    delete_pods: dict[str, PodDelete] = field(default_factory=dict)
    release_finalizers: list[FinalizerRelease] = field(default_factory=list)
    stop_pods: dict[str, PodStop] = field(default_factory=dict)
    place_pods: list[PodPlacement] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    decisions: list[Decision] = field(default_factory=list)
    """The failures at `status.epoch` found in this pass, classified."""
    pending_failure: bool = False
    """A failure at the epoch waits (backoff): the barrier must not open over it."""
    acted: list[Decision] = field(default_factory=list)
    restart_started: RestartRecord | None = None
    restart_finished: RestartRecord | None = None
    roles: dict[str, RoleProgress] = field(default_factory=dict)
    """Role name -> its state; read from `status.roles`, advanced by `roles.advance`."""
    every_step: bool = True
    """No step ended the pass early (`Plan.every_step`)."""
    stragglers: list[Straggler] | None = None
    """The workers found straggling in this pass (`straggler.find`); None: the job does not
    look for stragglers, or the pass ended before."""
    _active: tuple[object, tuple[int, ...]] | None = field(default=None, repr=False, compare=False)
    _staying: tuple[dict[int, PodView], int, int, Mapping[int, PodView]] | None = field(
        default=None, repr=False, compare=False
    )
    """`active()` and `staying()` as last computed, with what they were computed from: a pass
    asks for them ~45 times, each an O(N) walk (at N=5000, a third of `plan`)."""
    stuck_memo: tuple[object, bool, dict[int, tuple[FailureClass, str] | None]] | None = field(
        default=None, repr=False, compare=False
    )
    """`recreate.why_stuck`'s answers so far, with the live workers and the agent placement they
    were found for (owned by `recreate`)."""

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

    @property
    def effective_mode(self) -> RestartMode:
        return self.status.mode or self.job.spec.restart.mode

    def node_of(self, pod: PodView) -> NodeView | None:
        return self.observed.nodes.get(pod.node_name) if pod.node_name else None

    def node_lost(self, pod: PodView) -> str | None:
        """Why the node the pod is placed on is lost (`classify.node_lost`); None if it is not,
        or if the pod is not placed."""
        return node_lost(pod.node_name, self.node_of(pod)) if pod.node_name else None

    def set_condition(
        self, type_: ConditionType, status: ConditionStatus, reason: str, message: str
    ) -> None:
        self.status.conditions = set_condition(
            self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.now,
            self.job.metadata.generation,
        )

    def delete(self, pod: PodView, reason: str) -> None:
        # A pod already terminating was deleted before: asking again changes nothing.
        if not pod.terminating and pod.name not in self.delete_pods:
            self.delete_pods[pod.name] = PodDelete(name=pod.name, uid=pod.uid, reason=reason)

    def superseded(self, rank: int, pod: PodView) -> bool:
        """`pod` is the old pod of a worker that the current restart recreates: it is to go,
        and nothing it shows is a failure at the epoch. In `Process` mode its agent may even
        arrive at the epoch before its deletion reaches it, with the signal that triggered the
        restart (an unhealthy device, a lost node) still on the pod."""
        last = self.status.last_restart
        if last is None or last.epoch != self.status.epoch:
            return False
        if rank not in last.recreated_ranks(len(self.job.spec.workers)):
            return False
        # The pod created for the restart is at its epoch; any older one is to go.
        return pod.created_epoch is None or pod.created_epoch < self.status.epoch

    def requeue(self, seconds: float) -> None:
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def is_finished(self) -> bool:
        return self.status.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def active(self) -> Sequence[int]:
        """The workers the gang's protocol spans in this pass: those of the running roles (not
        of a role still waiting, nor of one that completed), but those an elastic gang goes
        on without (`dropped`)."""
        dropped = self.dropped()
        running = frozenset(n for n, r in self.roles.items() if r.state is RoleState.RUNNING)
        basis = (running, dropped)
        if self._active is not None and self._active[0] == basis:
            return self._active[1]
        active = tuple(
            w.worker
            for w in self.job.spec.workers
            if w.role.name in running and w.worker not in dropped
        )
        self._active = (basis, active)
        return active

    def barrier_opens(self) -> bool:
        """The barrier of `status.epoch` is shut and opens in this pass (`restart.barrier`):
        every worker of the running roles present, not being deleted, arrived at exactly the
        epoch, and no failure waiting."""
        if self.status.barrier_epoch == self.status.epoch or self.pending_failure:
            return False
        staying = self.staying()
        active = self.active()
        if not active or any(w not in staying for w in active):
            return False
        return all(staying[w].arrived_epoch == self.status.epoch for w in active)

    def dropped(self) -> frozenset[int]:
        """The workers an elastic gang goes on without at `status.epoch` (docs/design.md
        section 3.12): their pods are kept, pending, but nobody waits for them."""
        if self.job.spec.elasticity is None:
            return frozenset()
        return frozenset(d for d in self.status.dropped if d < len(self.job.spec.workers))

    def started_late(self, worker: int) -> bool:
        """The worker's role started behind the open barrier of `epoch`: a pod of it that is
        missing is created again, not a failure of the gang."""
        role = self.job.spec.workers[worker].role.name
        progress = self.roles.get(role)
        return progress is not None and progress.started_late_at == self.status.epoch

    def staying(self) -> Mapping[int, PodView]:
        """The live workers that this plan does not delete."""
        # Deletions are only ever added in a pass: their count tells whether it changed.
        live, deleted, held = self.gang.live, self.delete_pods, self._staying
        if held is not None and held[0] is live and held[1:3] == (len(live), len(deleted)):
            return held[3]
        staying = MappingProxyType({r: pod for r, pod in live.items() if pod.name not in deleted})
        self._staying = (live, len(live), len(deleted), staying)
        return staying

    def workers_status(self) -> WorkersStatus:
        """Counts as they will be once this plan is carried out, so that the next pass, which
        sees the created pods and the deleted ones terminating, computes the same counts."""
        live = self.staying()
        return WorkersStatus(
            total=len(live) + len(self.create_pods),
            ready=sum(pod.ready for pod in live.values()),
            arrived=sum(pod.arrived_epoch == self.status.epoch for pod in live.values()),
        )

    def avoided(self) -> list[str]:
        """`status.avoidNodes`: the nodes no pod created from now on may land on."""
        return list(self.status.avoid_nodes or ())

    def avoid(self, node: str) -> None:
        """`node` joins `status.avoidNodes` (the last `AVOID_NODES_LIMIT` are kept)."""
        avoided = self.avoided()
        if node not in avoided:
            self.status.avoid_nodes = [*avoided, node]

    def finish_status(self, role_statuses: Sequence[RoleStatus]) -> None:
        """What the status counts from the whole pass, once every step ran."""
        s = self.status
        s.workers = self.workers_status()
        s.roles = list(role_statuses) or None
        s.roles_ready = roles_summary(role_statuses)
        s.history = s.history[-HISTORY_LIMIT:]
        s.avoid_nodes = (s.avoid_nodes or [])[-AVOID_NODES_LIMIT:] or None
        s.observed_generation = self.job.metadata.generation

    def plan(self) -> Plan:
        return Plan(
            status=self.status,
            create_service=self.create_service,
            create_pods=[self.create_pods[rank] for rank in sorted(self.create_pods)],
            delete_pods=list(self.delete_pods.values()),
            events=self.events,
            delete_job=self.delete_job,
            requeue_after=self.requeue_after,
            restart_started=self.restart_started,
            restart_finished=self.restart_finished,
            failures=self.acted,
            create_workload=self.create_workload,
            create_pod_group=self.create_pod_group,
            release_finalizers=self.release_finalizers,
            stop_pods=list(self.stop_pods.values()),
            place_pods=self.place_pods,
            every_step=self.every_step,
        )


def roles_summary(roles: Sequence[RoleStatus]) -> str | None:
    """`status.rolesReady`, the `Roles` printer column: `<role> <ready>/<replicas>` for a
    running role, `<role> Waiting` or `<role> Complete` for the others."""
    parts = [
        f"{r.name} {r.ready}/{r.replicas}"
        if r.state is RoleState.RUNNING
        else f"{r.name} {r.state}"
        for r in roles
    ]
    return ", ".join(parts) or None


def worker_text(p: Pass, rank: int | None) -> str:
    """A worker as messages name it: its rank and pod (None: the whole gang)."""
    if rank is None:
        return "the gang"
    if not 0 <= rank < len(p.job.spec.workers):
        return f"worker {rank}"
    return f"worker {rank} (pod {naming.worker_pod_name(p.job, rank)})"


def job_for_pods(p: Pass, mode: RestartMode) -> GangJob:
    """The job as podspec must see it to build pods of this pass: at its (maybe new) epoch,
    which the pods record as their created-epoch, and in the mode in effect."""
    status = p.job.status.model_copy(update={"epoch": p.status.epoch, "mode": mode})
    return p.job.model_copy(update={"status": status})
