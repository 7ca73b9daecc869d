"""Typed views of the Pods and Nodes the controller reads: small frozen dataclasses parsed from
the raw dicts the API returns, holding only what `controller.policy.plan` decides on.

The hot path sees thousands of pods per gang, so parsing stays shallow and never validates
whole objects: a field that is missing or malformed becomes None (or empty), never an error,
because one odd pod must not stop the reconcile of its gang.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import cached_property
from typing import Any, Final, Literal

from api.constants import (
    ANNOTATION_CREATED_EPOCH,
    ANNOTATION_EPOCH,
    ANNOTATION_EXIT,
    ANNOTATION_RESTART_MODE,
    LABEL_RANK,
)

ContainerStateName = Literal["running", "waiting", "terminated"]
NodeReady = Literal["True", "False", "Unknown", "Unreported"]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_dict(value: Any) -> dict[str, str]:
    return {k: v for k, v in _mapping(value).items() if isinstance(v, str)}


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API (`2026-05-01T10:00:00Z`) as an aware UTC datetime."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def parse_decimal_int(value: Any) -> int | None:
    """A non-negative decimal integer written as a string (annotations, labels), else None."""
    # Stricter than int(): no sign, no whitespace, no underscores, so that "+1" or " 1" written
    # by hand is not mistaken for what the protocol writes.
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


UNKNOWN_EXIT: Final = "-1"
"""The code a `Pod`-mode agent reports when its pod restarted under it at an epoch it had
arrived at: the trainer failed there, but the kubelet kept no exit code (KEP-5532)."""


def parse_exit_report(value: Any) -> tuple[int, int | None] | None:
    """The `gangjob.io/exit` annotation, `<epoch>:<code>`, as (epoch, code), the code None when
    the agent reported it unknown; else None."""
    if not isinstance(value, str):
        return None
    epoch_text, sep, code_text = value.partition(":")
    epoch = parse_decimal_int(epoch_text)
    code = None if code_text == UNKNOWN_EXIT else parse_decimal_int(code_text)
    if not sep or epoch is None or (code is None and code_text != UNKNOWN_EXIT):
        return None
    return epoch, code


# --- pods -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerView:
    """One entry of a pod's `containerStatuses` or `initContainerStatuses`."""

    name: str
    restart_count: int = 0
    ready: bool = False
    started: bool | None = None
    state: ContainerStateName | None = None
    exit_code: int | None = None
    """Exit code of the current state, when it is `terminated`."""
    reason: str | None = None
    """Reason of the current state (`CrashLoopBackOff`, `OOMKilled`, `Completed`, ...)."""
    message: str | None = None
    """Message of the current state (the kubelet's, e.g. why an image cannot be pulled)."""
    last_exit_code: int | None = None
    """`lastState.terminated.exitCode`: the previous run's exit, kept across a restart."""
    last_reason: str | None = None
    last_message: str | None = None
    """`lastState.terminated.message`: the previous run's termination message."""
    unhealthy_resources: tuple[str, ...] = ()
    """Resource names (`nvidia.com/gpu`) with a device the kubelet reports `Unhealthy`
    (KEP-4680 `allocatedResourcesStatus`)."""
    unknown_health_resources: tuple[str, ...] = ()
    """Resource names with a device whose health the kubelet reports `Unknown`."""
    finished_at: datetime | None = None
    """`state.terminated.finishedAt` (whole seconds, the node's clock)."""
    last_finished_at: datetime | None = None
    """`lastState.terminated.finishedAt`: when the previous run ended."""

    @classmethod
    def from_status(cls, obj: Mapping[str, Any]) -> ContainerView:
        state_name: ContainerStateName | None = None
        exit_code: int | None = None
        reason: str | None = None
        message: str | None = None
        finished_at: datetime | None = None
        state = _mapping(obj.get("state"))
        for name in ("terminated", "running", "waiting"):
            detail = state.get(name)
            if isinstance(detail, Mapping):
                state_name = name
                exit_code = _int_or_none(detail.get("exitCode"))
                reason = _str_or_none(detail.get("reason"))
                message = _str_or_none(detail.get("message"))
                finished_at = parse_time(detail.get("finishedAt"))
                break
        last_terminated = _mapping(_mapping(obj.get("lastState")).get("terminated"))
        started = obj.get("started")
        return cls(
            name=str(obj.get("name", "")),
            restart_count=_int_or_none(obj.get("restartCount")) or 0,
            ready=obj.get("ready") is True,
            started=started if isinstance(started, bool) else None,
            state=state_name,
            exit_code=exit_code,
            reason=reason,
            message=message,
            last_exit_code=_int_or_none(last_terminated.get("exitCode")),
            last_reason=_str_or_none(last_terminated.get("reason")),
            last_message=_str_or_none(last_terminated.get("message")),
            unhealthy_resources=_resources_with_health(
                obj.get("allocatedResourcesStatus"), "Unhealthy"
            ),
            unknown_health_resources=_resources_with_health(
                obj.get("allocatedResourcesStatus"), "Unknown"
            ),
            finished_at=finished_at,
            last_finished_at=parse_time(last_terminated.get("finishedAt")),
        )


def _resources_with_health(value: Any, health: str) -> tuple[str, ...]:
    names: list[str] = []
    for entry in _list(value):
        entry = _mapping(entry)
        name = entry.get("name")
        if isinstance(name, str) and any(
            _mapping(resource).get("health") == health for resource in _list(entry.get("resources"))
        ):
            names.append(name)
    return tuple(names)


def _is_extended_resource(name: str) -> bool:
    # Extended resources (devices) are the names with a domain prefix, e.g. nvidia.com/gpu;
    # `kubernetes.io/` names are the cluster's own.
    return "/" in name and "kubernetes.io/" not in name


def _requested_extended_resources(spec: Mapping[str, Any]) -> frozenset[str]:
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for container in map(_mapping, _list(spec.get(key))):
            resources = _mapping(container.get("resources"))
            for part in ("requests", "limits"):
                names.update(n for n in _mapping(resources.get(part)) if _is_extended_resource(n))
    return frozenset(names)


def _has_restart_rules(spec: Mapping[str, Any]) -> bool:
    return any(
        bool(_list(_mapping(container).get("restartPolicyRules")))
        for key in ("containers", "initContainers")
        for container in _list(spec.get(key))
    )


@dataclass(frozen=True)
class WorkerProgress:
    """What a worker's agent last said of its trainer's progress at one epoch (docs/design.md
    section 4.7), its times on the controller's clock (the agent sends ages, which the
    controller turns into times when a report arrives, so agents' clocks never meet)."""

    epoch: int
    step: int | None
    """The trainer's latest step at `epoch`; None: it has not reported one."""
    steps_per_second: float | None = None
    checkpoint: int | None = None
    """The latest step it reported durably checkpointed."""
    compute_seconds: float | None = None
    """Its own compute in its latest step, without waiting for other ranks."""
    last_step_at: datetime | None = None
    """When `step` last advanced."""
    stalled: bool = False
    """The agent found no advance for `spec.progress.hangSeconds` while the trainer ran."""
    trainer_state: str | None = None
    """The trainer's process state when the agent found it stalled (`R`, `S`, `D`, `T`, `Z`,
    as /proc shows it); None where the agent cannot see it."""
    malformed: int = 0
    """Lines of its progress file the agent could not read, since it started."""
    compute_median_seconds: float | None = None
    """The median of its compute over the window of its latest summary (docs/progress.md)."""
    compute_runs: tuple[tuple[float, float], ...] = ()
    """Its compute windows at this epoch as the straggler judgement reads them
    (`controller.policy.straggler.fold`): (start, floor) pairs, oldest first, the start of
    each window on the controller's clock (seconds since the epoch) and the lowest median of
    the windows from it to the latest; the floors rise, the last is the latest median."""
    reported_at: datetime | None = None
    """When its latest summary came in."""


@dataclass(frozen=True)
class PodView:
    """What the controller's policy reads of a worker Pod."""

    name: str
    namespace: str
    uid: str
    rank: int | None
    """The `gangjob.io/rank` label; None if missing or not a decimal integer."""
    phase: str | None
    node_name: str | None
    deletion_timestamp: datetime | None
    creation_timestamp: datetime | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    controller_uid: str | None
    """UID of the pod's controller ownerReference: tells our pods from a namesake's leftovers."""
    arrived_epoch: int | None
    """The `gangjob.io/epoch` annotation: the epoch the agent says this worker arrived at."""
    created_epoch: int | None
    """The `gangjob.io/created-epoch` annotation: `status.epoch` when the pod was created."""
    reported_exit: tuple[int, int | None] | None
    """The `gangjob.io/exit` annotation (`Process` mode) as (epoch, exit code)."""
    reason: str | None
    """`status.reason` (`Evicted`, `NodeLost`, ...)."""
    message: str | None
    ready: bool
    """The pod condition `Ready` is True."""
    conditions: Mapping[str, tuple[str, str | None]]
    """Pod condition type -> (status, reason)."""
    containers: tuple[ContainerView, ...]
    init_containers: tuple[ContainerView, ...]
    requested_resources: frozenset[str] = frozenset()
    """Extended resources (devices, e.g. `nvidia.com/gpu`) a container of the pod requests."""
    has_restart_rules: bool = False
    """A container or init container has `restartPolicyRules` (KEP-5307/5532). A pod built
    for `Pod` mode without any was stripped by an apiserver with the gates off."""
    restart_mode: str | None = None
    """The `gangjob.io/restart-mode` annotation: the mode the pod was built for."""
    condition_times: Mapping[str, datetime] = field(default_factory=dict)
    """Pod condition type -> its `lastTransitionTime` (the kubelet's clock, whole seconds)."""
    pod_group: str | None = None
    """`spec.schedulingGroup.podGroupName`: the PodGroup (KEP-4671) the pod is scheduled in."""
    finalizers: tuple[str, ...] = ()
    """`metadata.finalizers`."""
    resource_version: str | None = None
    progress: WorkerProgress | None = None
    """Not read from the pod: the training progress its agent last reported to the controller
    (controller.arrivals)."""
    scheduling_gates: tuple[str, ...] = ()
    """`spec.schedulingGates[].name`: the pod waits for them to go before it is scheduled."""
    active_deadline_seconds: int | None = None
    """`spec.activeDeadlineSeconds`: set, the kubelet ends the pod that long after its start
    (how a finished job stops a worker without deleting its pod)."""
    restarted: bool = False
    """Not read from the pod: the controller's arrival book proved that the agent which reported
    `arrived_epoch` started after the pod's restart to it (controller.arrivals.book), so the
    restart signals this status may still show (the kubelet's writes lag) are that restart's."""

    @property
    def terminating(self) -> bool:
        """Deletion was requested (the pod may linger, e.g. on a node that is gone)."""
        return self.deletion_timestamp is not None

    def container(self, name: str) -> ContainerView | None:
        """The status of the (regular) container of this name, if the kubelet reported one."""
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> Mapping[str, ContainerView]:
        # A pass looks up a container of each of N pods several times, and a view serves every
        # pass until its pod changes: one walk per view. The first of a name, as the API lists.
        by_name: dict[str, ContainerView] = {}
        for c in self.containers:
            by_name.setdefault(c.name, c)
        return by_name

    @cached_property
    def all_containers(self) -> tuple[ContainerView, ...]:
        """The init containers' statuses, then the regular containers'."""
        return (*self.init_containers, *self.containers)

    @cached_property
    def unsettled_containers(self) -> tuple[ContainerView, ...]:
        """Of `all_containers`, those waiting, or running and not through their startup probe:
        the only ones a stuck gang's checks look at, and in a running gang none."""
        return tuple(
            c
            for c in self.all_containers
            if c.state == "waiting" or (c.state == "running" and c.started is not True)
        )

    def evolve(self, **changes: Any) -> PodView:
        """`dataclasses.replace(self, **changes)` at a quarter of its cost, and keeping what this
        view has cached of its containers where they do not change. A restart of N workers
        makes a new view of every pod (each agent's report joined to it: `ArrivalBook.apply`),
        ~8-30 us each by `replace` at 30 fields, and the cached lookups would be walked again."""
        unknown = changes.keys() - _POD_VIEW_FIELDS
        if unknown:
            raise TypeError(f"PodView has no field {sorted(unknown)[0]!r}")
        state = dict(self.__dict__)  # the fields, and the cached values
        if not changes.keys().isdisjoint(_CONTAINER_FIELDS):
            for cached in _CACHED_OF_CONTAINERS:
                state.pop(cached, None)
        state.update(changes)
        view = object.__new__(PodView)
        view.__dict__.update(state)  # frozen: no __setattr__, as `replace`'s __init__ does
        return view

    @classmethod
    def from_pod(cls, obj: Mapping[str, Any]) -> PodView:
        """Parse a core/v1 Pod dict as the API returns it."""
        metadata = _mapping(obj.get("metadata"))
        spec = _mapping(obj.get("spec"))
        status = _mapping(obj.get("status"))
        labels = _str_dict(metadata.get("labels"))
        annotations = _str_dict(metadata.get("annotations"))
        conditions: dict[str, tuple[str, str | None]] = {}
        condition_times: dict[str, datetime] = {}
        for condition in _list(status.get("conditions")):
            condition = _mapping(condition)
            type_, cond_status = condition.get("type"), condition.get("status")
            if isinstance(type_, str) and isinstance(cond_status, str):
                conditions[type_] = (cond_status, _str_or_none(condition.get("reason")))
                since = parse_time(condition.get("lastTransitionTime"))
                if since is not None:
                    condition_times[type_] = since
        controller_uid = next(
            (
                _str_or_none(ref.get("uid"))
                for ref in map(_mapping, _list(metadata.get("ownerReferences")))
                if ref.get("controller") is True
            ),
            None,
        )
        return cls(
            name=str(metadata.get("name", "")),
            namespace=str(metadata.get("namespace", "")),
            uid=str(metadata.get("uid", "")),
            rank=parse_decimal_int(labels.get(LABEL_RANK)),
            phase=_str_or_none(status.get("phase")),
            node_name=_str_or_none(spec.get("nodeName")),
            deletion_timestamp=parse_time(metadata.get("deletionTimestamp")),
            creation_timestamp=parse_time(metadata.get("creationTimestamp")),
            labels=labels,
            annotations=annotations,
            controller_uid=controller_uid,
            arrived_epoch=parse_decimal_int(annotations.get(ANNOTATION_EPOCH)),
            created_epoch=parse_decimal_int(annotations.get(ANNOTATION_CREATED_EPOCH)),
            reported_exit=parse_exit_report(annotations.get(ANNOTATION_EXIT)),
            reason=_str_or_none(status.get("reason")),
            message=_str_or_none(status.get("message")),
            ready=conditions.get("Ready", ("",))[0] == "True",
            conditions=conditions,
            condition_times=condition_times,
            containers=tuple(
                ContainerView.from_status(_mapping(c))
                for c in _list(status.get("containerStatuses"))
            ),
            init_containers=tuple(
                ContainerView.from_status(_mapping(c))
                for c in _list(status.get("initContainerStatuses"))
            ),
            requested_resources=_requested_extended_resources(spec),
            has_restart_rules=_has_restart_rules(spec),
            restart_mode=annotations.get(ANNOTATION_RESTART_MODE),
            pod_group=_str_or_none(_mapping(spec.get("schedulingGroup")).get("podGroupName")),
            finalizers=tuple(f for f in _list(metadata.get("finalizers")) if isinstance(f, str)),
            resource_version=_str_or_none(metadata.get("resourceVersion")),
            scheduling_gates=tuple(
                name
                for gate in _list(spec.get("schedulingGates"))
                if isinstance(name := _mapping(gate).get("name"), str)
            ),
            active_deadline_seconds=_int_or_none(spec.get("activeDeadlineSeconds")),
        )


# --- nodes ----------------------------------------------------------------------------------

_QUANTITY: Final = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))"  # the number
    r"(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"  # a decimal exponent or a suffix
)
_BINARY_SUFFIX: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIX: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}

# Resources whose quantities policy compares as counts. Memory, storage and hugepages stay the
# strings the API wrote: nothing decides on them yet, and a byte count is easy to misread.
_COUNTED_RESOURCES: Final = frozenset({"cpu", "pods"})


def parse_quantity(value: str) -> Decimal | None:
    """A Kubernetes resource quantity (`8`, `500m`, `2Ki`, `1e3`) as a Decimal; else None."""
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
        if exponent is not None:
            return amount.scaleb(int(exponent[1:]))
        if suffix in _BINARY_SUFFIX:
            return amount * Decimal(1024) ** _BINARY_SUFFIX[suffix]
        return amount.scaleb(_DECIMAL_SUFFIX[suffix or ""])
    except InvalidOperation:
        return None


def _is_counted(resource: str) -> bool:
    # The API requires the quantities of extended resources to be integers.
    return resource in _COUNTED_RESOURCES or _is_extended_resource(resource)


def parse_resources(value: Any) -> dict[str, int | str]:
    """`allocatable`/`capacity`: counted resources (cpu, pods, devices) as ints when they are
    whole numbers; everything else, and fractions such as cpu `3500m`, as the raw string."""
    resources: dict[str, int | str] = {}
    for name, raw in _mapping(value).items():
        text = str(raw)
        if _is_counted(name):
            amount = parse_quantity(text)
            if amount is not None and amount == amount.to_integral_value():
                resources[name] = int(amount)
                continue
        resources[name] = text
    return resources


def _node_ready(status: str | None) -> NodeReady:
    if status == "True":
        return "True"
    if status == "False":
        return "False"
    if status is None:
        return "Unreported"
    return "Unknown"


_POD_VIEW_FIELDS: Final = frozenset(f.name for f in fields(PodView))
_CONTAINER_FIELDS: Final = frozenset({"containers", "init_containers"})
_CACHED_OF_CONTAINERS: Final = ("_by_name", "all_containers", "unsettled_containers")
"""`PodView`'s cached properties: each of `_CONTAINER_FIELDS` alone."""


@dataclass(frozen=True)
class NodeView:
    """What the controller's policy reads of a Node."""

    name: str
    ready: NodeReady
    """Status of the `Ready` condition; `Unreported` when the node has none yet (just
    registered, or the cache's copy is the one from before its kubelet's first status)."""
    taints: tuple[tuple[str, str], ...]
    """(key, effect) of each taint."""
    conditions: Mapping[str, str]
    """Node condition type -> status."""
    allocatable: Mapping[str, int | str]
    capacity: Mapping[str, int | str]
    declared_features: frozenset[str]
    """`status.declaredFeatures` (KEP-5328): e.g. `RestartAllContainersOnContainerExits`."""
    unschedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict)

    def has_taint(self, key: str, effect: str | None = None) -> bool:
        """A taint with this key (and effect, if given) is on the node."""
        return any(k == key and effect in (None, e) for k, e in self.taints)

    @classmethod
    def from_node(cls, obj: Mapping[str, Any]) -> NodeView:
        """Parse a core/v1 Node dict as the API returns it."""
        metadata = _mapping(obj.get("metadata"))
        spec = _mapping(obj.get("spec"))
        status = _mapping(obj.get("status"))
        conditions: dict[str, str] = {}
        for condition in map(_mapping, _list(status.get("conditions"))):
            type_, cond_status = condition.get("type"), condition.get("status")
            if isinstance(type_, str) and isinstance(cond_status, str):
                conditions[type_] = cond_status
        taints = tuple(
            (str(taint.get("key", "")), str(taint.get("effect", "")))
            for taint in map(_mapping, _list(spec.get("taints")))
        )
        return cls(
            name=str(metadata.get("name", "")),
            ready=_node_ready(conditions.get("Ready")),
            taints=taints,
            conditions=conditions,
            allocatable=parse_resources(status.get("allocatable")),
            capacity=parse_resources(status.get("capacity")),
            declared_features=frozenset(
                f for f in _list(status.get("declaredFeatures")) if isinstance(f, str)
            ),
            unschedulable=spec.get("unschedulable") is True,
            labels={str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()},
        )
