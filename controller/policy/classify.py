"""Failure classification, pure (docs/design.md section 4): the signals of one worker (its pod,
its node, its devices) as one classified `Failure`, and `spec.failurePolicy` applied to it: the
first matching rule, else the defaults. Also the exit codes the kubelet may restart in place.

What counts as a failure *at which epoch* is `controller.policy.plan`'s business; this module
reads the signals of a worker `plan` hands it as being at the gang's epoch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from api.constants import RESTART_MODES, AgentPlacement
from api.failures import FAILURE_CLASSES, PRIORITY, FailureClass
from api.v1alpha1 import (
    MESSAGE_PATTERN_FLAGS,
    ConditionStatus,
    DeviceHealth,
    ExitCodeOperator,
    FailureAction,
    FailurePolicyRule,
    GangJob,
    NodeConditionMatcher,
    RestartMode,
    Role,
)
from controller.policy.views import ContainerView, NodeView, PodView, WorkerProgress

POD_FAILED: Final = "Failed"
POD_SUCCEEDED: Final = "Succeeded"

# Pod conditions (core/v1) and the kubelet's own reasons.
ALL_CONTAINERS_RESTARTING: Final = "AllContainersRestarting"
DISRUPTION_TARGET: Final = "DisruptionTarget"
RESTARTING_ALL_CONTAINERS: Final = "RestartingAllContainers"
"""The reason of the synthetic `lastState` (exit code 137) the kubelet writes into every
container after a KEP-5532 restart: the real exit code is lost (docs/localcluster.md)."""
OOM_KILLED: Final = "OOMKilled"

# Node taints that say the node is gone or going (node lifecycle controller, KEP-2268).
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_OUT_OF_SERVICE: Final = "node.kubernetes.io/out-of-service"
_NODE_LOST_TAINTS: Final = (TAINT_UNREACHABLE, TAINT_NOT_READY, TAINT_OUT_OF_SERVICE)

CLOCK_SKEW_MARGIN: Final = timedelta(seconds=2)
"""A container's `finishedAt` is the node's clock in whole seconds, `barrierOpenedAt` the
controller's: a termination counts as after the barrier only if it is this much later, so that a
restart the protocol itself caused just before the barrier opened is never taken for a failure.
A crash inside the margin is still seen through the pod condition or the exit code."""

_EXIT_CODES: Final = range(1, 256)
"""What a Linux process exits with when it fails (128+n for signal n)."""


DISRUPTION_CLASSES: Final[Mapping[str, FailureClass]] = {
    "DeletionByTaintManager": FailureClass.DISRUPTION,
    "DeletionByPodGC": FailureClass.DISRUPTION,
    "TerminationByKubelet": FailureClass.DISRUPTION,
    "EvictionByEvictionAPI": FailureClass.EVICTED,
    "PreemptionByScheduler": FailureClass.PREEMPTED,
    "DeletionByDeviceTaintManager": FailureClass.DEVICE_UNHEALTHY,
}
"""`DisruptionTarget` condition reason -> class; an unknown reason is a `Disruption`."""


@dataclass(frozen=True)
class Failure:
    """One worker's failure at the gang's epoch, with the facts the policy's rules match on."""

    worker: int
    failure_class: FailureClass
    detail: str
    """What was observed, for humans: exit code, condition, node."""
    container: str | None = None
    """The container whose exit this is, if it is one."""
    exit_code: int | None = None
    """Its exit code; None when unknown (e.g. the kubelet restarted the pod and kept none)."""
    exit_codes: Mapping[str, int] = field(default_factory=dict)
    """Container -> known exit code, for `onExitCodes` of any container."""
    pod_conditions: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    device_health: frozenset[str] = frozenset()
    """`Unhealthy` / `Unknown` if a device of the worker has that health."""
    node_name: str | None = None
    node_conditions: Mapping[str, str] = field(default_factory=dict)
    message: str | None = None
    """The trainer's termination message of its exit at this epoch (`/dev/termination-log`, or
    its log's tail with `FallbackToLogsOnError`), for `onMessagePatterns`."""
    onset_at: datetime | None = None
    """When the failure began, where the signal says (a hang: the stalled step's time)."""
    trainer_state: str | None = None
    """A hang: the trainer's process state, as its agent saw it (`TRAINER_STATES`)."""
    in_place: bool = True
    """False: the worker cannot restart in place (its pod failed, is going, or its trainer's
    container is dead in `Process` mode): it is recreated whatever the action."""


@dataclass(frozen=True)
class Decision:
    """A failure and what the policy does about it."""

    failure: Failure
    action: FailureAction
    counted: bool
    """Whether a restart for it counts against `spec.restart.maxRestarts`."""
    rule: int | None = None
    """Index of the matching `spec.failurePolicy.rules` entry; None: the defaults decided."""
    by_exit_code: bool = False
    """The rule matched on an exit code (`onExitCodes`)."""

    @property
    def worker(self) -> int:
        return self.failure.worker

    @property
    def failure_class(self) -> FailureClass:
        return self.failure.failure_class


@dataclass(frozen=True)
class Context:
    """What the signals of a worker are read against."""

    epoch: int
    """`status.epoch`."""
    trainer: str
    """The trainer container's name."""
    mode: RestartMode
    """The restart mode in effect."""
    barrier_open: bool
    """The barrier of `epoch` is open: every worker arrived at it and runs."""
    barrier_opened_at: datetime | None
    """When it opened (the controller's clock)."""
    node_conditions: Sequence[NodeConditionMatcher] = ()
    """Node conditions the rules list: on a worker's node, a device failure."""
    watch_unknown_devices: bool = False
    """A rule matches `onDeviceHealth: Unknown`: such devices are a failure too."""
    hang_seconds: int | None = None
    """`spec.progress.hangSeconds`: a worker whose agent reports its trainer stalled has hung.
    None: hangs are not detected."""
    stragglers: Mapping[int, str] = field(default_factory=dict)
    """Worker -> what was found: the workers the gang's straggler judgement found slow
    (`controller.policy.straggler`); a judgement of the gang, not a signal of one pod."""

    @classmethod
    def of(
        cls,
        job: GangJob,
        mode: RestartMode,
        epoch: int,
        barrier_epoch: int | None,
        barrier_opened_at: datetime | None,
    ) -> Context:
        rules = job.spec.failure_policy.rules
        return cls(
            epoch=epoch,
            trainer=job.spec.trainer_container_name,
            mode=mode,
            barrier_open=barrier_epoch == epoch,
            barrier_opened_at=barrier_opened_at,
            node_conditions=[m for r in rules for m in r.on_node_conditions or ()],
            watch_unknown_devices=any(r.on_device_health is DeviceHealth.UNKNOWN for r in rules),
            hang_seconds=job.spec.progress.hang_seconds,
        )


# --- the node -------------------------------------------------------------------------------


def node_lost(node_name: str, node: NodeView | None) -> str | None:
    """Why the node is lost (gone, not Ready, tainted unreachable/not-ready/out-of-service), or
    None if it is not."""
    if node is None:
        return f"node {node_name} is gone"
    if node.taints:  # most nodes have none: asked for each of N pods, every pass
        for taint in _NODE_LOST_TAINTS:
            if node.has_taint(taint):
                return f"node {node_name} has taint {taint}"
    # A node with no Ready condition yet is not lost: it just registered, or the cache's copy
    # predates its kubelet's first status (a pod the scheduler bound to it says it is Ready
    # by now). If its kubelet never reports, the node lifecycle controller sets Ready
    # Unknown after its grace period, and that is a loss.
    if node.ready not in ("True", "Unreported"):
        return f"node {node_name} is not Ready ({node.ready})"
    return None


def may_force_delete_on(node: NodeView | None) -> bool:
    """The guard on the node of docs/design.md section 4: a pod stuck terminating may be
    force-deleted only if its node is gone, unreachable, or NotReady and out of service: a
    kubelet that merely reports NotReady may still be running the pod."""
    if node is None:
        return True
    if node.has_taint(TAINT_UNREACHABLE):
        return True
    return node.ready != "True" and node.has_taint(TAINT_OUT_OF_SERVICE)


# --- the signals ----------------------------------------------------------------------------


@dataclass
class _Signals:
    """The signals found on one worker, by class, each with its detail."""

    found: dict[FailureClass, str] = field(default_factory=dict)
    container: str | None = None
    exit_code: int | None = None

    def add(self, cls: FailureClass, detail: str) -> None:
        self.found.setdefault(cls, detail)

    def exit(self, cls: FailureClass, container: str, code: int | None, detail: str) -> None:
        # The first exit found with a known code is the one reported.
        if cls not in self.found or (self.exit_code is None and code is not None):
            self.found[cls] = detail
            if self.container is None or self.exit_code is None:
                self.container, self.exit_code = container, code


def _exit_detail(container: str, code: int | None, reason: str | None, how: str = "") -> str:
    if code is None:
        return f"container {container} restarted{how} (exit code unknown)"
    why = f" ({reason})" if reason else ""
    return f"container {container} exited with code {code}{why}{how}"


def _exit_class(reason: str | None) -> FailureClass:
    return FailureClass.OOM_KILLED if reason == OOM_KILLED else FailureClass.PROCESS_EXIT


def _real_code(code: int | None, reason: str | None) -> int | None:
    return None if reason == RESTARTING_ALL_CONTAINERS else code


def _node_signals(s: _Signals, ctx: Context, pod: PodView, node: NodeView | None) -> None:
    if pod.node_name is None:
        return  # not scheduled: no node to lose
    lost = node_lost(pod.node_name, node)
    if lost is not None:
        s.add(FailureClass.NODE_LOST, lost)
        return
    assert node is not None
    for resource in sorted(pod.requested_resources):
        allocatable, capacity = node.allocatable.get(resource), node.capacity.get(resource)
        # The device plugin lowers allocatable below capacity for devices it finds unhealthy.
        if isinstance(allocatable, int) and isinstance(capacity, int) and allocatable < capacity:
            s.add(
                FailureClass.DEVICE_UNHEALTHY,
                f"node {node.name} has {allocatable} of {capacity} {resource} allocatable",
            )
    for matcher in ctx.node_conditions:
        if node.conditions.get(matcher.type) == matcher.status:
            s.add(
                FailureClass.DEVICE_UNHEALTHY,
                f"node {node.name} has condition {matcher.type}={matcher.status}",
            )


def _device_signals(s: _Signals, ctx: Context, pod: PodView, node: NodeView | None) -> None:
    for container in pod.all_containers:
        for resource in container.unhealthy_resources:
            s.add(
                FailureClass.DEVICE_UNHEALTHY,
                f"device {resource} of container {container.name} is Unhealthy",
            )
        if ctx.watch_unknown_devices:
            for resource in container.unknown_health_resources:
                s.add(
                    FailureClass.DEVICE_UNHEALTHY,
                    f"device {resource} of container {container.name} has Unknown health",
                )


def _disruption_signal(s: _Signals, ctx: Context, pod: PodView, node: NodeView | None) -> None:
    status, reason = pod.conditions.get(DISRUPTION_TARGET, ("", None))
    if status == ConditionStatus.TRUE:
        cls = DISRUPTION_CLASSES.get(reason or "", FailureClass.DISRUPTION)
        s.add(cls, f"pod condition DisruptionTarget ({reason or 'no reason'})")


def _after_barrier(ctx: Context, finished_at: datetime | None) -> bool:
    opened = ctx.barrier_opened_at
    if not ctx.barrier_open or opened is None or finished_at is None:
        return False
    return finished_at > opened + CLOCK_SKEW_MARGIN


def _of_this_epoch(ctx: Context, pod: PodView, at: datetime | None, *, same_second: bool) -> bool:
    """Whether a restart signal that a worker at the gang's epoch shows (its trainer terminated,
    the pod condition `AllContainersRestarting`; `at` = when, by the kubelet's clock) is a
    failure at the epoch, and not the whole-pod restart that brought the worker to it.

    Only `Pod` mode restarts pods in place, and the kubelet writes a restart's statuses
    asynchronously: the worker's arrival (its annotation, or its report) can overtake them, so
    its status may still show that restart. A trainer cannot run at an epoch before the
    epoch's barrier opens (the barrier probe holds it back), so before then such a signal is
    that restart, and after it only a signal from after the barrier opened is new. Any later
    restart of the pod starts another agent, which reports the failure itself (`exit`), so a
    signal judged old is never the only trace of a failure. Without a time (not what a
    kubelet writes), a worker the arrival book proved restarted (`pod.restarted`) is judged
    old, another as before: a failure."""
    if not RESTART_MODES[ctx.mode].pods_restart_in_place or pod.phase in (
        POD_FAILED,
        POD_SUCCEEDED,
    ):
        return True  # no restart in place: nothing stale to explain
    opened = ctx.barrier_opened_at
    if not ctx.barrier_open or opened is None:
        return False
    if at is None:
        return not pod.restarted
    # Whole seconds, as the kubelet writes them. A trainer's exit in the barrier's own second
    # is new (it could not have ended before the barrier it waited for); a condition of that
    # second may be the restart the last arrival came back from.
    second = opened.replace(microsecond=0)
    return at >= second if same_second else at > second


def _exit_signals(s: _Signals, ctx: Context, pod: PodView) -> None:
    trainer = pod.container(ctx.trainer)
    if (
        trainer is not None
        and trainer.state == "terminated"
        and trainer.exit_code != 0
        and _of_this_epoch(ctx, pod, trainer.finished_at, same_second=True)
    ):
        code = _real_code(trainer.exit_code, trainer.reason)
        s.exit(
            _exit_class(trainer.reason),
            trainer.name,
            code,
            _exit_detail(trainer.name, code, trainer.reason),
        )
    if pod.reported_exit is not None:
        epoch, code = pod.reported_exit
        if epoch == ctx.epoch and code != 0:
            how = f"with code {code}" if code is not None else "(its pod restarted; code unknown)"
            s.exit(
                FailureClass.PROCESS_EXIT,
                ctx.trainer,
                code,
                f"trainer exited {how} at epoch {epoch} (reported by the agent)",
            )
    since = pod.condition_times.get(ALL_CONTAINERS_RESTARTING)
    if all_containers_restarting(pod) and _of_this_epoch(ctx, pod, since, same_second=False):
        s.exit(
            FailureClass.PROCESS_EXIT,
            ctx.trainer,
            None,
            "pod condition AllContainersRestarting (exit code unknown)",
        )
    # The durable trace of a restart the transient condition above may have been missed for:
    # a container that ended after the barrier opened, while the worker was running.
    for container in pod.all_containers:
        _durable_exit(s, ctx, container)


def _durable_exit(s: _Signals, ctx: Context, container: ContainerView) -> None:
    ends = (
        (container.finished_at, container.exit_code, container.reason, container.state),
        (container.last_finished_at, container.last_exit_code, container.last_reason, None),
    )
    for finished_at, code, reason, state in ends:
        if state not in (None, "terminated") or code == 0 or not _after_barrier(ctx, finished_at):
            continue
        real = _real_code(code, reason)
        s.exit(
            _exit_class(reason),
            container.name,
            real,
            _exit_detail(container.name, real, reason, " after the barrier opened"),
        )
        return


TRAINER_STATES: Final[Mapping[str, str]] = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "a zombie",
}
"""The process states of /proc/<pid>/stat, as a hang's detail names them."""


def hang_detail(progress: WorkerProgress, hang_seconds: int) -> str:
    step = "no step" if progress.step is None else f"no step past {progress.step}"
    state = TRAINER_STATES.get(progress.trainer_state or "", "")
    return f"{step} for {hang_seconds}s or more" + (f"; its trainer is {state}" if state else "")


def _hang_signal(s: _Signals, ctx: Context, pod: PodView, node: NodeView | None) -> None:
    # The agent judges the stall (it counts from its trainer's first report of the epoch, after
    # the barrier opened): before the barrier, the barrier's own timeout applies.
    progress = pod.progress
    if ctx.hang_seconds is None or not ctx.barrier_open or pod.terminating:
        return
    if progress is None or progress.epoch != ctx.epoch or not progress.stalled:
        return
    # A sidecar outside the trainer's process namespace cannot see it end: the pod can.
    trainer = pod.container(ctx.trainer)
    if trainer is not None and trainer.state not in (None, "running"):
        return
    s.add(FailureClass.HANG, hang_detail(progress, ctx.hang_seconds))


def _pod_end_signals(s: _Signals, ctx: Context, pod: PodView, node: NodeView | None) -> None:
    if not pod.terminating:
        # A pod being deleted has its containers killed: their exits are the deletion's.
        _exit_signals(s, ctx, pod)
        if pod.phase == POD_FAILED:
            s.add(FailureClass.POD_FAILED, _pod_failed_detail(pod))
    elif ctx.barrier_open:
        s.add(FailureClass.POD_DELETED, "pod is being deleted")


Signal = Callable[[_Signals, Context, PodView, NodeView | None], None]
"""Adds what one kind of signal on a worker (its pod, and its node's view) says, by class."""

SIGNALS: Final[tuple[Signal, ...]] = (
    _node_signals,
    _device_signals,
    _disruption_signal,
    _hang_signal,
    _pod_end_signals,
)
"""Every signal `detect` reads on a worker; the class it finds is a row of
`api.failures.FAILURE_CLASSES`, whose order picks the one that explains the worker."""


def all_containers_restarting(pod: PodView) -> bool:
    """The pod condition `AllContainersRestarting` is True: the kubelet is restarting the whole
    pod in place (KEP-5532), as this view of it says."""
    return pod.conditions.get(ALL_CONTAINERS_RESTARTING, ("",))[0] == ConditionStatus.TRUE


def _cannot_restart_in_place(ctx: Context, pod: PodView) -> bool:
    if pod.terminating or pod.phase in (POD_FAILED, POD_SUCCEEDED):
        return True
    # Where the agent wraps the trainer, the trainer's container *is* the agent: dead, nothing
    # restarts it.
    trainer = pod.container(ctx.trainer)
    wrapped = RESTART_MODES[ctx.mode].agent is AgentPlacement.WRAPPER
    return wrapped and trainer is not None and trainer.state == "terminated"


def _device_health(pod: PodView) -> frozenset[str]:
    health: set[str] = set()
    for container in pod.all_containers:
        if container.unhealthy_resources:
            health.add(DeviceHealth.UNHEALTHY)
        if container.unknown_health_resources:
            health.add(DeviceHealth.UNKNOWN)
    return frozenset(health)


def _known_exit_codes(pod: PodView) -> dict[str, int]:
    codes: dict[str, int] = {}
    for c in pod.containers:
        code = _real_code(c.exit_code, c.reason) if c.state == "terminated" else None
        if code is not None:
            codes[c.name] = code
    return codes


def detect(ctx: Context, rank: int, pod: PodView, node: NodeView | None) -> Failure | None:
    """The failure of a worker at the gang's epoch, if its pod, node or devices show one.

    `node` is the view of `pod.node_name`, None if that Node is gone. A pod being deleted by
    someone else is a `PodDeleted` failure only once the barrier is open: before, nobody runs at
    the epoch yet, and the worker is simply created again when its pod is gone.
    """
    s = _Signals()
    for signal in SIGNALS:
        signal(s, ctx, pod, node)
    straggling = ctx.stragglers.get(rank)
    if straggling is not None and not pod.terminating:
        s.add(FailureClass.STRAGGLER, straggling)
    if not s.found:
        return None
    primary = next(c for c in PRIORITY if c in s.found)
    exit_codes = _known_exit_codes(pod)
    if s.container is not None and s.exit_code is not None:
        exit_codes.setdefault(s.container, s.exit_code)
    detail = s.found[primary]
    others = [c for c in PRIORITY if c in s.found and c is not primary]
    if others:
        detail += f"; also {', '.join(others)}"
    message = trainer_message(ctx, pod)
    if message:
        detail += f"; message: {message_excerpt(message)}"
    is_exit = primary in (FailureClass.PROCESS_EXIT, FailureClass.OOM_KILLED)
    return Failure(
        worker=rank,
        failure_class=primary,
        detail=detail,
        container=s.container if is_exit else None,
        exit_code=s.exit_code if is_exit else None,
        exit_codes=exit_codes,
        pod_conditions=dict(pod.conditions),
        device_health=_device_health(pod),
        node_name=pod.node_name,
        node_conditions=dict(node.conditions) if node is not None else {},
        message=message,
        onset_at=_onset(primary, pod),
        trainer_state=pod.progress.trainer_state if pod.progress is not None else None,
        in_place=not _cannot_restart_in_place(ctx, pod),
    )


MESSAGE_EXCERPT: Final = 160
"""The characters of a termination message a failure's detail quotes: its last line's end."""


def message_excerpt(message: str) -> str:
    """The end of the message's last non-empty line, where an error says what it was."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= MESSAGE_EXCERPT else "..." + last[-MESSAGE_EXCERPT:]


def trainer_message(ctx: Context, pod: PodView) -> str | None:
    """The trainer's termination message at this epoch: its current run's if it ended, else
    the previous run's if that ended after the barrier opened (the kubelet restarted it in
    place since). An older one is another failure's, already acted on."""
    trainer = pod.container(ctx.trainer)
    if trainer is None:
        return None
    if trainer.state == "terminated":
        return trainer.message
    if _after_barrier(ctx, trainer.last_finished_at):
        return trainer.last_message
    return None


def _onset(primary: FailureClass, pod: PodView) -> datetime | None:
    if primary is FailureClass.HANG and pod.progress is not None:
        return pod.progress.last_step_at
    return None


def _pod_failed_detail(pod: PodView) -> str:
    parts = [s for s in (pod.reason, pod.message) if s]
    return "pod Failed" + (": " + ": ".join(parts) if parts else "")


def missing(ctx: Context, rank: int) -> Failure | None:
    """The failure of a worker whose pod is gone: one once the barrier is open, when every
    worker had arrived and runs; before that, the worker is simply created again."""
    if not ctx.barrier_open:
        return None
    return Failure(
        worker=rank, failure_class=FailureClass.POD_DELETED, detail="pod is gone", in_place=False
    )


def barrier_timeout(rank: int, waited: float) -> Failure:
    """A worker that has not arrived at the barrier in time."""
    return Failure(
        worker=rank,
        failure_class=FailureClass.BARRIER_TIMEOUT,
        detail=f"not arrived at the barrier after {waited:.0f}s",
        in_place=False,
    )


# --- the policy -----------------------------------------------------------------------------


def default_decision(failure_class: FailureClass) -> tuple[FailureAction, bool]:
    """(action, counted) when no rule matches: the class's row of `FAILURE_CLASSES`."""
    meaning = FAILURE_CLASSES[failure_class]
    return meaning.action, meaning.counted


def _matches_exit(rule: FailurePolicyRule, trainer: str, exit_codes: Mapping[str, int]) -> bool:
    matcher = rule.on_exit_codes
    if matcher is None:
        return False
    code = exit_codes.get(matcher.container_name or trainer)
    if code is None:
        return False
    if matcher.operator is ExitCodeOperator.IN:
        return code in matcher.values
    return code != 0 and code not in matcher.values


def rule_matches(rule: FailurePolicyRule, failure: Failure, trainer: str) -> bool:
    """Whether the rule's matcher matches the failure's facts."""
    if rule.on_exit_codes is not None:
        return _matches_exit(rule, trainer, failure.exit_codes)
    if rule.on_pod_conditions is not None:
        for matcher in rule.on_pod_conditions:
            status, reason = failure.pod_conditions.get(matcher.type, ("", None))
            if status == (matcher.status or ConditionStatus.TRUE) and matcher.reason in (
                None,
                reason,
            ):
                return True
        return False
    if rule.on_device_health is not None:
        return rule.on_device_health in failure.device_health
    if rule.on_node_conditions is not None:
        return any(failure.node_conditions.get(m.type) == m.status for m in rule.on_node_conditions)
    if rule.on_failure_classes is not None:
        return failure.failure_class in rule.on_failure_classes
    if rule.on_message_patterns is not None:
        return failure.message is not None and any(
            search(failure.message) for search in message_searches(tuple(rule.on_message_patterns))
        )
    return False


@functools.lru_cache(maxsize=256)
def message_searches(patterns: tuple[str, ...]) -> tuple[Callable[[str], object], ...]:
    """The compiled `onMessagePatterns` (admission checked they are in the subset of RE2 that
    Python's `re` reads alike: `api.v1alpha1.message_pattern_error`)."""
    return tuple(re.compile(pattern, MESSAGE_PATTERN_FLAGS).search for pattern in patterns)


def applies_to(rule: FailurePolicyRule, role: Role) -> bool:
    """The rule matches failures of the role's workers: it names the role, or no role."""
    return rule.roles is None or role.name in rule.roles


def decide(job: GangJob, failure: Failure) -> Decision:
    """The policy's decision on a failure: the first matching rule that applies to the failed
    worker's role, else the defaults; a rule's `countsTowardsMaxRestarts` overrides the default
    counting."""
    default_action, default_counted = default_decision(failure.failure_class)
    role = job.spec.role_of(failure.worker)
    trainer = role.trainer_container_name
    for index, rule in enumerate(job.spec.failure_policy.rules):
        if applies_to(rule, role) and rule_matches(rule, failure, trainer):
            counted = rule.counts_towards_max_restarts
            return Decision(
                failure=failure,
                action=rule.action,
                counted=default_counted if counted is None else counted,
                rule=index,
                by_exit_code=rule.on_exit_codes is not None,
            )
    return Decision(failure=failure, action=default_action, counted=default_counted)


def exit_code_action(
    job: GangJob, container: str, exit_code: int, role: Role | None = None
) -> FailureAction | None:
    """The action for `container` of a worker of `role` (by default the first) exiting with
    `exit_code` by what the kubelet can know when the container exits, the code alone; None
    for 0, a success, and for an exit of the trainer whose action an `onMessagePatterns` rule
    before the deciding one may change: only its termination message tells, which the
    controller reads and a whole-pod restart would not keep."""
    if exit_code == 0:
        return None
    role = role or job.spec.effective_roles[0]
    trainer = role.trainer_container_name
    codes = {container: exit_code}
    by_message: set[FailureAction] = set()
    action = default_decision(FailureClass.PROCESS_EXIT)[0]
    for rule in job.spec.failure_policy.rules:
        if not applies_to(rule, role):
            continue
        if rule.on_message_patterns is not None and container == trainer:
            by_message.add(rule.action)
        elif _matches_exit(rule, trainer, codes):
            action = rule.action
            break
    return action if by_message <= {action} else None


def retriable_exit_codes(
    job: GangJob, role: Role | None = None
) -> tuple[ExitCodeOperator, list[int]] | None:
    """The trainer's exit codes that restart the gang in place, for a worker of `role` (by
    default the first), as the `exitCodes` of its `RestartAllContainers` rule (`Pod` mode):
    (operator, values), or None if no code does.

    Codes the policy sends elsewhere (FailJob, RecreateWorker, Ignore), or may send elsewhere
    by the trainer's termination message (`onMessagePatterns`), are left out, so that
    the trainer stays terminated with its real code for the controller to classify: after a
    whole-pod restart the kubelet keeps none. The shorter form is chosen: `NotIn [0, <left
    out>]` (0 is a success, never restarted) or `In [<retriable>]`; both fit the API's 255.
    """
    role = role or job.spec.effective_roles[0]
    trainer = role.trainer_container_name
    retriable = [
        code
        for code in _EXIT_CODES
        if exit_code_action(job, trainer, code, role) is FailureAction.RESTART_GANG
    ]
    if not retriable:
        return None
    left_out = sorted(set(_EXIT_CODES) - set(retriable))
    if len(left_out) + 1 <= len(retriable):
        return ExitCodeOperator.NOT_IN, [0, *left_out]
    return ExitCodeOperator.IN, retriable


def lowest(decisions: Iterable[Decision]) -> Decision | None:
    """The decision about the lowest rank: the one a restart names as its trigger."""
    return min(decisions, key=lambda d: d.worker, default=None)
