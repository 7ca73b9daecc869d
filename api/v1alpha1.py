"""The GangJob resource, gangjob.io/v1alpha1: pydantic models of its spec and status with the wire
names of docs/design.md section 3b, and the helpers that parse an API object and dump a status.

The CRD's schema is generated from these models (`api.crd`); the validation rules that a schema
alone cannot express are CEL rules attached here, next to the fields they constrain, and mirrored
by pydantic validators so that Python code sees the same errors as the apiserver. The rules on
pod templates and condition types are the apiserver's alone: an object stored before them must
still parse, and the pod builder (controller.policy.podspec) checks the template again.
"""

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    StrictInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from api.constants import (
    AGENT_CONTAINER,
    AGENT_INSTALL_CONTAINER,
    AGENT_PORT_NAME,
    AGENT_TOKEN_VOLUME,
    AGENT_VOLUME,
    API_VERSION,
    ARRIVAL_TOKEN_VOLUME,
    AVOID_NODES_LIMIT,
    DEFAULT_AGENT_PORT,
    DEFAULT_DIR,
    HISTORY_LIMIT,
    KIND,
    NODE_CONDITION_TYPES,
    NPROC_AUTO,
    POD_CONDITION_TYPES,
    RESTART_MODES,
    STRAGGLERS_LIMIT,
)
from api.constants import FailureAction as FailureAction  # the models' enums, re-exported
from api.constants import RestartMode as RestartMode
from api.failures import FailureClass

# --- wire types -----------------------------------------------------------------------------


def _to_utc_seconds(value: datetime) -> datetime:
    # metav1.Time has whole seconds on the wire; truncating on the way in too keeps a value read
    # back from the apiserver equal to the one written, so a reconcile sees no spurious change.
    return value.astimezone(UTC).replace(microsecond=0)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _format_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _format_micro_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Time = Annotated[
    AwareDatetime,
    AfterValidator(_to_utc_seconds),
    PlainSerializer(_format_time, return_type=str, when_used="json"),
]
"""A timestamp with whole seconds in UTC, as metav1.Time (RFC 3339, `...Z`)."""

MicroTime = Annotated[
    AwareDatetime,
    AfterValidator(_to_utc),
    PlainSerializer(_format_micro_time, return_type=str, when_used="json"),
]
"""A timestamp with microseconds in UTC, as metav1.MicroTime: restart timings need sub-second."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        frozen=True,
    )


# --- enums ----------------------------------------------------------------------------------


class ExitCodeOperator(StrEnum):
    """How `onExitCodes.values` match an exit code."""

    IN = "In"
    NOT_IN = "NotIn"


class DeviceHealth(StrEnum):
    """A device health reported by the kubelet (KEP-4680 `allocatedResourcesStatus`)."""

    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class ConditionStatus(StrEnum):
    """The status of a Kubernetes condition."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class SuccessPolicy(StrEnum):
    """When the job has succeeded."""

    ALL = "All"
    RANK0 = "Rank0"


class CleanPodPolicy(StrEnum):
    """Which workers' pods go when the job finishes (Kubeflow's `cleanPodPolicy`)."""

    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


class SuccessOperator(StrEnum):
    """How `spec.success` combines the workers of the roles it names."""

    ALL = "All"
    ANY = "Any"


class DependencyStatus(StrEnum):
    """What a role waits for of a role it depends on."""

    READY = "Ready"
    COMPLETE = "Complete"


class RoleState(StrEnum):
    """Where a role stands: its pods not created yet, running, or every worker succeeded."""

    WAITING = "Waiting"
    RUNNING = "Running"
    COMPLETE = "Complete"


class Phase(StrEnum):
    """The phase of a GangJob."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


# --- spec -----------------------------------------------------------------------------------

# Kubernetes container names are DNS-1123 labels.
_CONTAINER_NAME_MAX: Final = 63
# Pods have no limit on containers; ours bounds the apiserver's CEL cost estimate of the rules
# that search the template's containers, without which it rejects the CRD.
_CONTAINERS_MAX: Final = 100
_RULES_MAX: Final = 20
_MATCHERS_MAX: Final = 20
_MESSAGE_PATTERNS_MAX: Final = 8
_ROLES_MAX: Final = 8
_ROLE_INDEXES: Final = "[" + ", ".join(str(i) for i in range(_ROLES_MAX)) + "]"
_ELASTIC_DROPPED_MAX: Final = 10000
SPARES_NEED_IN_PLACE: Final = (
    "elastic.spares requires a restart mode that keeps the pods (Pod or Process), not "
    "spec.restart.mode Recreate: it creates every pod again at every restart, so no spare "
    "would ever be ready"
)
ROLE_REPLICAS_IN_BOUNDS: Final = (
    "replicas must be within the role's elastic.minReplicas..elastic.maxReplicas"
)
ELASTIC_ROLE_DEPENDS: Final = (
    "dependsOn: an elastic role starts with the gang: it may not depend on another role"
)
ELASTIC_ROLE_LAST: Final = (
    "roles[].elastic: only the last role of spec.roles may be elastic: its workers are "
    "numbered last, so that a resize renumbers no other worker"
)
ELASTIC_ROLES_RANKED: Final = (
    "roles[].ranked: every role of a job with an elastic role must be ranked: the workers of "
    "a role that is not are numbered after the ranks, and a resize would renumber them"
)
ELASTIC_ON_ROLE: Final = (
    "elastic: with spec.roles, set elastic on the role that resizes (spec.roles[].elastic)"
)
_DEPENDENCIES_MAX: Final = 8
# A role's name is part of its pods' names, `<job>-<role>-<index>`, which are DNS labels.
_ROLE_NAME_MAX: Final = 20
_ROLE_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
SHORTHAND_ROLE: Final = "worker"
"""The name of the one role a GangJob written with `replicas` + `template` has."""

# Bounds on the lists and strings of the template that CEL rules search: the apiserver refuses
# a CRD whose rules' estimated cost is unbounded. Generous for a training pod.
_VOLUMES_MAX: Final = 256
_MOUNTS_MAX: Final = 256
_PORTS_MAX: Final = 64
_PATH_MAX: Final = 4096
_AFFINITY_TERMS_MAX: Final = 32
_LABEL_KEY_MAX: Final = 317
RESERVED_CONTAINERS: Final = (AGENT_CONTAINER, AGENT_INSTALL_CONTAINER)
"""Container names a template may not use: the controller injects these."""
RESERVED_VOLUMES: Final = (AGENT_VOLUME, AGENT_TOKEN_VOLUME, ARRIVAL_TOKEN_VOLUME)
"""Volume names a template may not use: the controller injects these."""
HOSTNAME_TOPOLOGY_KEY: Final = "kubernetes.io/hostname"


def _rule(rule: str, message: str, field_path: str) -> JsonValue:
    return {"rule": rule, "message": message, "fieldPath": field_path}


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _bounded_list(items: int, field: str, length: int) -> dict[str, Any]:
    return {
        "type": "array",
        "maxItems": items,
        "items": {
            "type": "object",
            "properties": {field: {"type": "string", "maxLength": length}},
        },
    }


def _container_overlay(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": what,
        "required": ["name", "image"],
        "properties": {
            "name": {
                "type": "string",
                "description": "Name of the container, unique in the pod.",
                "minLength": 1,
                "maxLength": _CONTAINER_NAME_MAX,
            },
            "image": {"type": "string", "description": "Container image.", "minLength": 1},
            "ports": _bounded_list(_PORTS_MAX, "name", 15),
            "volumeMounts": _bounded_list(_MOUNTS_MAX, "mountPath", _PATH_MAX),
        },
    }


# What a template may not use, because the controller adds it to every worker pod
# (controller/policy/podspec.py) or because two workers on one host would collide on it.
_TEMPLATE_RULES: Final[list[JsonValue]] = [
    *(
        _rule(
            rule=f"!has(self.spec.{key}) || self.spec.{key}.all(c, "
            f"!(c.name in {_cel_list(RESERVED_CONTAINERS)}))",
            message=f"spec.{key}[].name: {', '.join(RESERVED_CONTAINERS)} are reserved for "
            "the agent containers the controller injects",
            field_path=f".spec.{key}",
        )
        for key in ("containers", "initContainers")
    ),
    {
        "rule": "!has(self.spec.volumes) || self.spec.volumes.all(v, "
        f"!(v.name in {_cel_list(RESERVED_VOLUMES)}))",
        "message": f"spec.volumes[].name: {', '.join(RESERVED_VOLUMES)} are reserved for the "
        "volumes the controller injects",
        "fieldPath": ".spec.volumes",
    },
    *(
        _rule(
            rule=f"!has(self.spec.{key}) || self.spec.{key}.all(c, "
            "!has(c.volumeMounts) || c.volumeMounts.all(m, "
            f"m.mountPath != '{DEFAULT_DIR}' && m.mountPath != '{DEFAULT_DIR}/'))",
            message=f"spec.{key}[].volumeMounts[].mountPath: {DEFAULT_DIR} is reserved for "
            "the agent's directory, which the controller mounts",
            field_path=f".spec.{key}",
        )
        for key in ("containers", "initContainers")
    ),
    *(
        _rule(
            rule=f"!has(self.spec.{key}) || self.spec.{key}.all(c, !has(c.ports) || "
            f"c.ports.all(p, p.containerPort != {DEFAULT_AGENT_PORT} && "
            f"(!has(p.name) || p.name != '{AGENT_PORT_NAME}')))",
            message=f"spec.{key}[].ports[]: port {DEFAULT_AGENT_PORT} and the name "
            f"{AGENT_PORT_NAME} are reserved for the agent, which listens on them in every "
            "worker pod",
            field_path=f".spec.{key}",
        )
        for key in ("containers", "initContainers")
    ),
    {
        # The agent listens on its fixed port in every worker: on the host network, two
        # workers on one node collide. Where workers land is not known at admission, so the
        # template must rule it out itself.
        "rule": "!has(self.spec.hostNetwork) || !self.spec.hostNetwork || "
        "(has(self.spec.affinity) && has(self.spec.affinity.podAntiAffinity) && "
        "has(self.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution)"
        " && self.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        f".exists(t, t.topologyKey == '{HOSTNAME_TOPOLOGY_KEY}'))",
        "message": f"spec.hostNetwork: the agent listens on port {DEFAULT_AGENT_PORT} of every "
        "worker, so two workers on one node would collide: with hostNetwork, set a required "
        f"podAntiAffinity term with topologyKey {HOSTNAME_TOPOLOGY_KEY} (one worker per node)",
        "fieldPath": ".spec.hostNetwork",
    },
]

_POD_TEMPLATE_SCHEMA: Final[dict[str, Any]] = {
    # The overlay of the generated core/v1 PodTemplateSpec schema (api.podtemplate), which
    # api.crd puts under it: what our rules need bounded, our descriptions, and the rules.
    "type": "object",
    "required": ["spec"],
    "properties": {
        "metadata": {
            "type": "object",
            "description": "Labels and annotations of every worker pod; the controller adds "
            "its own `gangjob.io/*` labels.",
        },
        "spec": {
            "type": "object",
            "description": "PodSpec of every worker. The controller sets the restart policy, "
            "hostname, subdomain, and adds the agent and the worker environment.",
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "description": "Containers of a worker; the first is the trainer unless "
                    "`spec.trainerContainer` names another.",
                    "minItems": 1,
                    "maxItems": _CONTAINERS_MAX,
                    "items": _container_overlay("A container (core/v1 Container)."),
                },
                "initContainers": {
                    "type": "array",
                    "maxItems": _CONTAINERS_MAX,
                    "items": _container_overlay("An init container (core/v1 Container)."),
                },
                "volumes": _bounded_list(_VOLUMES_MAX, "name", _CONTAINER_NAME_MAX),
                "affinity": {
                    "type": "object",
                    "properties": {
                        "podAntiAffinity": {
                            "type": "object",
                            "properties": {
                                "requiredDuringSchedulingIgnoredDuringExecution": _bounded_list(
                                    _AFFINITY_TERMS_MAX, "topologyKey", _LABEL_KEY_MAX
                                ),
                            },
                        },
                    },
                },
            },
        },
    },
    "x-kubernetes-validations": _TEMPLATE_RULES,
}

PodTemplate = Annotated[dict[str, Any], WithJsonSchema(_POD_TEMPLATE_SCHEMA)]
"""A core/v1 PodTemplateSpec, kept as the raw dict the user wrote (the apiserver validated it
against the schema of api.podtemplate, and pruned nothing it knows)."""


def _template_container_names(template: Mapping[str, Any]) -> list[str]:
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        raise ValueError("spec.template.spec.containers must list at least one container")
    names: list[str] = []
    for index, container in enumerate(containers):
        if not isinstance(container, Mapping):
            raise ValueError(f"spec.template.spec.containers[{index}] must be an object")
        name, image = container.get("name"), container.get("image")
        if not isinstance(name, str) or not name:
            raise ValueError(f"spec.template.spec.containers[{index}].name is required")
        if not isinstance(image, str) or not image:
            raise ValueError(f"spec.template.spec.containers[{index}].image is required")
        if name in names:
            raise ValueError(f"spec.template.spec.containers[{index}].name {name!r} is duplicated")
        names.append(name)
    return names


class RestartSpec(_Model):
    """How the gang restarts after a failure."""

    mode: RestartMode = Field(
        default=RestartMode.POD,
        description="`Pod`: every worker's pod restarts in place (KEP-5532 "
        "`RestartAllContainers`). `Process`: the agent restarts the training process inside "
        "the running container (no kubelet backoff). `Recreate`: every pod is deleted and "
        "created again. If the cluster cannot honour the mode, the controller falls back to "
        "the next that works and says so in the `ModeDegraded` condition and `status.mode`.",
    )
    max_restarts: int = Field(
        default=10,
        ge=0,
        description="Gang restarts that count against the budget (see "
        "`failurePolicy.rules[].countsTowardsMaxRestarts`) before the job fails.",
    )
    backoff_seconds: int = Field(
        default=0,
        ge=0,
        description="Wait before a gang restart; it doubles with each consecutive restart up "
        "to a cap. 0 restarts at once.",
    )
    barrier_timeout_seconds: int = Field(
        default=600,
        ge=1,
        description="A worker that has not arrived at the barrier of a new epoch this long "
        "after the restart began is recreated.",
    )


class StragglerSpec(_Model):
    """When a worker is a straggler: its own compute per step (the trainers' `compute=`) at
    least `ratio` times the median of its role's workers, for `forSeconds` (docs/api.md
    "Stragglers")."""

    ratio: float = Field(
        default=1.5,
        ge=1.1,
        le=100,
        description="A worker whose compute per step is at least this many times its role's "
        "median (and beyond the role's spread: 3 median absolute deviations) is slow.",
    )
    for_seconds: int = Field(
        default=120,
        ge=10,
        le=86400,
        description="How long a worker must have been slow, in every summary its agent sent "
        "over that time, to be a straggler: a checkpoint, a data-loader hiccup or jitter "
        "is not one.",
    )


class ProgressSpec(_Model):
    """What the controller does with the training progress the trainers report (docs/api.md
    "Progress"): a trainer reports by writing `step=<n>` lines to `$GANGJOB_PROGRESS`."""

    hang_seconds: int | None = Field(
        default=None,
        ge=5,
        le=86400,
        description="A worker whose reported step has not advanced for this long while its "
        "trainer runs, after its first report of the epoch and once the epoch's barrier is "
        "open, has failed with class `Hang` (by default the gang restarts in place, counted). "
        "A trainer that never reports is never hung. Unset: hangs are not detected.",
    )
    straggler: StragglerSpec | None = Field(
        default=None,
        description="Straggler detection from the `compute=` the trainers report: a straggler "
        "gets a Warning Event `Straggler`, the `Stragglers` condition and a place in "
        "`status.progress.stragglers`, and nothing else unless a failure-policy rule acts on "
        "class `Straggler` (e.g. `RecreateWorker`: the worker is recreated off its node). "
        "Unset: stragglers are not detected.",
    )


class ExitCodesMatcher(_Model):
    """Matches a container's exit code."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator == 'NotIn' || !(0 in self.values)",
                    "message": "values must not contain 0 with operator In: exit code 0 is a "
                    "success, never a failure",
                    "fieldPath": ".values",
                },
            ],
        },
    )

    container_name: str | None = Field(
        default=None,
        max_length=_CONTAINER_NAME_MAX,
        description="Container whose exit code is matched; it must be a container of "
        "`spec.template`. Unset: the trainer container.",
    )
    operator: ExitCodeOperator = Field(
        description="`In`: the exit code is one of `values`. `NotIn`: it is none of them (and "
        "not 0)."
    )
    values: list[Annotated[int, Field(ge=0, le=255)]] = Field(
        min_length=1,
        max_length=255,
        description="Exit codes, 0-255, unique.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("values")
    @classmethod
    def _values_unique(cls, values: list[int]) -> list[int]:
        if len(set(values)) != len(values):
            raise ValueError("values must be unique")
        return values

    @model_validator(mode="after")
    def _no_success_with_in(self) -> Self:
        if self.operator is ExitCodeOperator.IN and 0 in self.values:
            raise ValueError("values must not contain 0 with operator In")
        return self


def _condition_type_rule(kind: str, known: tuple[str, ...]) -> ConfigDict:
    # A typo in a condition type makes a rule that never matches, silently.
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"(has(self.custom) && self.custom) || self.type in {list(known)!r}",
                    "message": f"type must be a {kind} condition type Kubernetes sets "
                    f"({', '.join(known)}); for another (a problem detector's, a device "
                    "plugin's) set custom: true",
                    "fieldPath": ".type",
                },
            ],
        },
    )


_CUSTOM_DESCRIPTION: Final = (
    "The type is not one Kubernetes sets but another component's (a problem detector, a device "
    "plugin): it is matched as written. Unset: the type must be a Kubernetes one, so that a "
    "misspelt type is refused rather than never matching."
)


class PodConditionMatcher(_Model):
    """Matches a condition of the worker's pod, e.g. `DisruptionTarget` with its reason."""

    model_config = _condition_type_rule("pod", POD_CONDITION_TYPES)

    type: str = Field(min_length=1, max_length=316, description="Condition type.")
    custom: bool | None = Field(default=None, description=_CUSTOM_DESCRIPTION)
    reason: str | None = Field(
        default=None,
        max_length=1024,
        description="Condition reason, e.g. `PreemptionByScheduler`. Unset: any reason.",
    )
    status: ConditionStatus | None = Field(
        default=None, description="Condition status. Unset: `True`."
    )


class NodeConditionMatcher(_Model):
    """Matches a condition of the node the worker runs on."""

    model_config = _condition_type_rule("node", NODE_CONDITION_TYPES)

    type: str = Field(
        min_length=1,
        max_length=316,
        description="Node condition type, e.g. `MemoryPressure`, or `GpuXidError` with `custom`.",
    )
    custom: bool | None = Field(default=None, description=_CUSTOM_DESCRIPTION)
    status: ConditionStatus = Field(description="Condition status that matches.")


_MATCHERS: Final = (
    "onExitCodes",
    "onPodConditions",
    "onDeviceHealth",
    "onNodeConditions",
    "onFailureClasses",
    "onMessagePatterns",
)

MESSAGE_PATTERN_MAX: Final = 256
MESSAGE_PATTERN_FLAGS: Final = re.ASCII
"""How the controller compiles an `onMessagePatterns` pattern with Python's `re`: `\\d`, `\\w`,
`\\s`, `\\b` of ASCII only, as in RE2."""

_UNESCAPED: Final = r"(^|[^\\])(\\\\)*"
_ESCAPES_ALIKE: Final = "dDsSwWbBnrtfv"
_ESCAPES_APART: Final = "".join(
    c for c in string.ascii_letters + string.digits if c not in _ESCAPES_ALIKE
)
MESSAGE_PATTERN_APART: Final = "|".join(
    (
        r"[^\x00-\x7f]",  # non-ASCII: RE2 and Python fold case differently beyond ASCII
        _UNESCAPED + r"\$",  # end of text: Python's also matches before a final newline
        _UNESCAPED + rf"\\[{_ESCAPES_APART}]",  # \p \z \Z \A \Q \x \1 ...: one side's only
        _UNESCAPED + r"\(\?([^:i]|i[^:)])",  # (?= (?P< (?s) ...: only (?: (?i: (?i)
        r".\(\?i\)",  # a global flag not at the start: Python refuses it, RE2 does not
        _UNESCAPED + r"\[:",  # RE2's [:alpha:] classes; Python reads them as characters
        _UNESCAPED + r"\{,",  # Python's {,n} repeats, RE2's is the literal text
        _UNESCAPED + r"[*+?}]\+",  # Python's possessive repeats
    )
)
"""A pattern part of which RE2 and Python's `re` read differently (or only one of them
reads): `onMessagePatterns` takes none. Itself in that common subset, so the apiserver's CEL
(RE2) and the controller's `re` find the same."""

_MESSAGE_PATTERN_RULE: Final = (
    "a pattern of onMessagePatterns must be valid RE2 within the part Python's re reads alike: "
    "ASCII only; no $ (match the text before it); escapes only \\d \\D \\s \\S \\w \\W \\b \\B "
    "\\n \\r \\t \\f \\v and of punctuation; groups only ( (?: (?i: and (?i) at the start; "
    "no [:class:], {,n} or possessive repeats"
)


def message_pattern_error(pattern: str) -> str | None:
    """Why `pattern` is no valid `onMessagePatterns` pattern, or None: it must be in the subset
    of RE2 that Python's `re` reads alike (the apiserver's CEL also compiles it as RE2)."""
    if re.search(MESSAGE_PATTERN_APART, pattern):
        return _MESSAGE_PATTERN_RULE
    try:
        re.compile(pattern, MESSAGE_PATTERN_FLAGS)
    except re.error as e:
        return f"{_MESSAGE_PATTERN_RULE}: {e}"
    return None


def _check_message_pattern(pattern: str) -> str:
    error = message_pattern_error(pattern)
    if error is not None:
        raise ValueError(error)
    return pattern


MessagePattern = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MESSAGE_PATTERN_MAX,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # `matches` compiles its argument as RE2: an invalid one fails the rule.
                    "rule": "!self.matches(r'" + MESSAGE_PATTERN_APART + "') && "
                    "type(''.matches(self)) == bool",
                    "message": _MESSAGE_PATTERN_RULE,
                },
            ],
        },
    ),
    AfterValidator(_check_message_pattern),
]
"""One `onMessagePatterns` pattern."""


class FailurePolicyRule(_Model):
    """A failure-policy rule: one matcher and the action taken when it matches."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "["
                    + ", ".join(f"has(self.{name})" for name in _MATCHERS)
                    + "].filter(x, x).size() == 1",
                    "message": "a rule must set exactly one of " + ", ".join(_MATCHERS),
                },
            ],
        },
    )

    action: FailureAction = Field(
        description="`RestartGang`: restart every worker at a new epoch. `RecreateWorker`: "
        "recreate the failed worker and restart the others in place. `FailJob`: fail the job. "
        "`Ignore`: do nothing."
    )
    on_exit_codes: ExitCodesMatcher | None = Field(
        default=None, description="Matches a container's exit code."
    )
    on_pod_conditions: Annotated[list[PodConditionMatcher], Field(min_length=1)] | None = Field(
        default=None,
        max_length=_MATCHERS_MAX,
        description="Matches when the worker's pod has any of these conditions.",
    )
    on_device_health: DeviceHealth | None = Field(
        default=None,
        description="Matches when a device allocated to the worker reports this health.",
    )
    on_node_conditions: Annotated[list[NodeConditionMatcher], Field(min_length=1)] | None = Field(
        default=None,
        max_length=_MATCHERS_MAX,
        description="Matches when the worker's node has any of these conditions.",
    )
    on_failure_classes: (
        Annotated[list[FailureClass], Field(min_length=1, max_length=_MATCHERS_MAX)] | None
    ) = Field(
        default=None,
        description="Matches a failure of any of these classes (docs/design.md section 4.3), "
        "e.g. `[Hang]`.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    on_message_patterns: (
        Annotated[list[MessagePattern], Field(min_length=1, max_length=_MESSAGE_PATTERNS_MAX)]
        | None
    ) = Field(
        default=None,
        description="Matches when the trainer's termination message at this failure (what it "
        "wrote to `terminationMessagePath`, `/dev/termination-log`, or with "
        "`terminationMessagePolicy: FallbackToLogsOnError` its log's last lines) contains a "
        "match of any of these regular expressions, as JobSet's `onJobFailureMessagePatterns`, "
        'e.g. `["NCCL error", "CUDA error: an illegal memory access"]`. RE2 syntax, within '
        "the part that Python's `re` reads alike (admission refuses the rest, naming it): ASCII, "
        "no `$`, escapes `\\d \\s \\w \\b` (ASCII, as RE2's) and their negations, `\\n "
        "\\r \\t \\f \\v` and punctuation, groups `(...)`, `(?:...)`, `(?i:...)` and a "
        "leading `(?i)`.",
    )
    counts_towards_max_restarts: bool | None = Field(
        default=None,
        description="Whether a restart by this rule counts against `spec.restart.maxRestarts`. "
        "Unset: infrastructure failures (node, device, preemption) do not count, others do.",
    )
    roles: list[Annotated[str, Field(max_length=_ROLE_NAME_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=_ROLES_MAX,
        description="Names of `spec.roles` whose workers' failures this rule matches. Unset: "
        "every role's.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _exactly_one_matcher(self) -> Self:
        matchers = (
            self.on_exit_codes,
            self.on_pod_conditions,
            self.on_device_health,
            self.on_node_conditions,
            self.on_failure_classes,
            self.on_message_patterns,
        )
        if sum(matcher is not None for matcher in matchers) != 1:
            raise ValueError("a rule must set exactly one of " + ", ".join(_MATCHERS))
        return self


class FailurePolicy(_Model):
    """How failures are classified into actions."""

    rules: list[FailurePolicyRule] = Field(
        default_factory=list,
        max_length=_RULES_MAX,
        description="Rules in order; the first that matches a failure decides its action. "
        "Failures no rule matches get the default classification.",
    )


class NodeLossSpec(_Model):
    """What happens to workers whose node is lost."""

    force_delete_after_seconds: int = Field(
        default=60,
        ge=0,
        description="A worker pod stuck `Terminating` on an unreachable, out-of-service or "
        "deleted node is force-deleted once its deletion timestamp is this old.",
    )
    force_delete: bool = Field(
        default=True,
        description="Whether such pods may be force-deleted at all. Set false to opt out: "
        "the lost worker is then recreated only once its pod is gone.",
    )


class ElasticSpec(_Model):
    """Bounds of an elastic gang: `spec.replicas` may change between them, and a change
    resizes the gang in place at the next epoch (docs/design.md section 3.12)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "elastic.minReplicas must be <= elastic.maxReplicas",
                    "fieldPath": ".minReplicas",
                }
            ]
        }
    )

    min_replicas: int = Field(
        ge=1, description="The fewest workers the gang runs with; `replicas` may not go below."
    )
    max_replicas: int = Field(
        ge=1,
        description="The most workers the gang runs with; `replicas` may not go above.",
    )
    wait_seconds: int = Field(
        default=300,
        ge=0,
        description="How long a worker being recreated (its node lost, its device gone) may "
        "wait with its pod Unschedulable before the gang goes on without it, at the next "
        "epoch, while the gang stays at or above `minReplicas`; the coordinator (`MASTER_ADDR`, "
        "worker 0 by default) is always waited for. 0: the gang waits for no such worker, "
        "and goes on without it in the very restart that recreates it (a spare, if one is "
        "ready, takes its place instead).",
    )
    grow_after_seconds: int = Field(
        default=600,
        ge=0,
        description="A worker the gang went on without rejoins it, at a new epoch, once its "
        "pending pod is scheduled (capacity returned); at most once per this many seconds "
        "since the gang last shrank or grew so, so that a flapping node does not restart the "
        "gang every minute.",
    )
    spares: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Spare workers: pods beyond `replicas`, scheduled with the gang, their "
        "agents arrived at every epoch but no trainer started. When a worker of the world is "
        "recreated (its node lost, its device gone), a spare placed and arrived takes its "
        "place at the next epoch, in place, and the recreated worker becomes a spare once its "
        "new pod is placed. Never the coordinator's (`MASTER_ADDR`) place: its loss waits for "
        "its new pod. Not with `restart.mode: Recreate`, which keeps no pod.",
    )

    def admits(self, replicas: int) -> bool:
        """Whether `replicas` is within the bounds."""
        return self.min_replicas <= replicas <= self.max_replicas

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("elastic.minReplicas must be <= elastic.maxReplicas")
        return self


class GangSchedulingMode(StrEnum):
    """Whether the gang is placed all-or-nothing by kube-scheduler (KEP-4671)."""

    AUTO = "Auto"
    OFF = "Off"


LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A node label key: an optional DNS-subdomain prefix and `/`, then a name."""


class SchedulingSpec(_Model):
    """How the gang's pods are scheduled."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # A PodGroup's constraints are immutable, and so the gang's domain.
                    "rule": "has(self.topologyKey) == has(oldSelf.topologyKey) && "
                    "(!has(self.topologyKey) || self.topologyKey == oldSelf.topologyKey)",
                    "message": "spec.scheduling.topologyKey is immutable",
                    "fieldPath": ".topologyKey",
                },
            ],
        },
    )

    gang: GangSchedulingMode = Field(
        default=GangSchedulingMode.AUTO,
        description="`Auto`: when the cluster serves `scheduling.k8s.io/v1alpha2` PodGroups, "
        "the controller creates a Workload and a PodGroup whose gang policy's `minCount` is "
        "`replicas`, and links every worker to it, so that kube-scheduler binds no worker "
        "until all of them fit; elsewhere workers are scheduled one by one, as with `Off`. "
        "The `GangScheduling` condition says which is in force. Where the cluster keeps a "
        "PodGroup's `disruptionMode` (feature gate `WorkloadAwarePreemption`, alpha), the "
        "PodGroup asks to be preempted only whole, at the priority of the template's "
        "`priorityClassName`: a preempted gang then restarts once (class `Preempted`, not "
        "counted) and waits, unbound, until it fits whole again.",
    )
    topology_key: str | None = Field(
        default=None,
        max_length=_LABEL_KEY_MAX,
        pattern=LABEL_KEY_PATTERN,
        description="A node label, e.g. `topology.kubernetes.io/rack`: every worker of the gang "
        "is placed in one domain of it (nodes with one value of the label), through the "
        "PodGroup's `schedulingConstraints.topology`, which kube-scheduler 1.36 enforces "
        "(feature gate `TopologyAwareWorkloadScheduling`, alpha; docs/scheduling.md). A worker "
        "recreated later joins the domain of the workers still bound. Needs gang scheduling in "
        "force; where the cluster does not keep the constraint, the gang runs unconstrained and "
        "the `GangScheduling` condition says so. A gang that fits in no domain stays Pending, "
        "and `Stuck` says why. Immutable.",
    )


def _trainer_is(where: str, predicate: str) -> str:
    """CEL: the trainer container of `where` (the spec's shorthand or a role: both have
    `template` and `trainerContainer`) is `c` with `predicate` true. Holds when there is no
    such container: the `trainerContainer` rule says so, once."""
    containers = f"{where}.template.spec.containers"
    name = f"(has({where}.trainerContainer) ? {where}.trainerContainer : {containers}[0].name)"
    return f"{containers}.all(c, c.name != {name} || ({predicate}))"


# The controller sets the trainer's restart policy (Never, and the rules of the restart mode).
_TRAINER_RESTARTS: Final = (
    "(!has(c.restartPolicy) || c.restartPolicy == 'Never') && !has(c.restartPolicyRules)"
)
_TRAINER_RESTARTS_MESSAGE: Final = (
    "the trainer container's restartPolicy must be unset or Never, and its restartPolicyRules "
    "unset: the controller sets them from spec.failurePolicy and spec.restart.mode, express "
    "restarts there"
)
_HAS_COMMAND: Final = "has(c.command) && c.command.size() > 0"
_COMMAND_MESSAGE: Final = (
    "the trainer container's command is required with {why}: the agent runs it, and the "
    "image's ENTRYPOINT is unknown to the controller"
)


class RoleDependency(_Model):
    """A role another role waits for before its pods are created."""

    role: str = Field(
        min_length=1, max_length=_ROLE_NAME_MAX, description="Name of an earlier role."
    )
    status: DependencyStatus = Field(
        description="`Ready`: every pod of that role is Ready. `Complete`: every worker of that "
        "role succeeded."
    )


def _immutable_field(field: str, name: str) -> JsonValue:
    """A transition rule: `field` of the object may not change, appear or vanish."""
    # Evaluated on updates only. Comparing presence first keeps a field that appeared or
    # vanished (shorthand <-> roles) from slipping through.
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"{name} is immutable",
        "fieldPath": f".{field}",
    }


class Role(_Model):
    """A group of identical workers: one pod template, `replicas` pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.trainerContainer) || "
                    "self.template.spec.containers.exists(c, c.name == self.trainerContainer)",
                    "message": "trainerContainer must name a container of the role's "
                    "template.spec.containers",
                    "fieldPath": ".trainerContainer",
                },
                {
                    "rule": _trainer_is("self", _TRAINER_RESTARTS),
                    "message": "template.spec.containers[].restartPolicy: "
                    + _TRAINER_RESTARTS_MESSAGE,
                    "fieldPath": ".template.spec.containers",
                },
                {
                    "rule": "!has(self.elastic) || (self.replicas >= self.elastic.minReplicas "
                    "&& self.replicas <= self.elastic.maxReplicas)",
                    "message": ROLE_REPLICAS_IN_BOUNDS,
                    "fieldPath": ".replicas",
                },
                {
                    "rule": "!has(self.elastic) || !has(self.dependsOn) || "
                    "self.dependsOn.size() == 0",
                    "message": ELASTIC_ROLE_DEPENDS,
                    "fieldPath": ".dependsOn",
                },
                # Transition rules, item by item (`spec.roles` is a map keyed by name; the
                # spec's rule keeps its names and order): a role is fixed once created, but
                # an elastic role's `replicas` (and its `elastic`).
                {
                    "rule": "self.replicas == oldSelf.replicas || "
                    "(has(self.elastic) && has(oldSelf.elastic))",
                    "message": "spec.roles[].replicas is immutable unless the role's elastic "
                    "is set (and was set before this change)",
                    "fieldPath": ".replicas",
                },
                *(
                    _immutable_field(field, f"spec.roles[].{field}")
                    for field in ("template", "trainerContainer", "ranked", "dependsOn")
                ),
            ],
        },
    )

    name: str = Field(
        min_length=1,
        max_length=_ROLE_NAME_MAX,
        pattern=_ROLE_NAME_PATTERN,
        description="Name of the role, a DNS label: its pods are `<job>-<role>-<index>`.",
    )
    replicas: int = Field(ge=1, description="Number of workers of this role.")
    template: PodTemplate = Field(
        description="PodTemplateSpec of the role's workers. Its first container is the trainer "
        "unless `trainerContainer` names another."
    )
    trainer_container: str | None = Field(
        default=None,
        max_length=_CONTAINER_NAME_MAX,
        description="Name of the template's container the agent runs and watches. Unset: the "
        "first.",
    )
    ranked: bool = Field(
        default=True,
        description="Whether the role's workers are ranks of the training process group: "
        "counted in `WORLD_SIZE` and given `RANK`. False for e.g. a launcher or an initializer.",
    )
    depends_on: list[RoleDependency] = Field(
        default_factory=list,
        max_length=_DEPENDENCIES_MAX,
        description="Roles that must reach a status before this role's pods are created. Each "
        "must be an earlier role of `spec.roles`.",
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Makes this role elastic, as `spec.elastic` does a job of one role: its "
        "`replicas` may change within `[minReplicas, maxReplicas]`, a change resizes the gang "
        "in place at the next epoch, and `spares` are workers of this role. Only the last "
        "role of `spec.roles`, in a job whose roles are all ranked, and not with `dependsOn`; "
        "every role's trainer `command` is required. Unset: `replicas` is immutable.",
    )

    @field_validator("template")
    @classmethod
    def _template_has_containers(cls, template: dict[str, Any]) -> dict[str, Any]:
        _template_container_names(template)
        return template

    @model_validator(mode="after")
    def _elastic_bounds(self) -> Self:
        if self.elastic is not None:
            if not self.elastic.admits(self.replicas):
                raise ValueError(f"roles[{self.name}].{ROLE_REPLICAS_IN_BOUNDS}")
            if self.depends_on:
                raise ValueError(f"roles[{self.name}].{ELASTIC_ROLE_DEPENDS}")
        return self

    @model_validator(mode="after")
    def _trainer_exists(self) -> Self:
        if self.trainer_container is not None and self.trainer_container not in (
            self.container_names
        ):
            raise ValueError(
                f"roles[{self.name}].trainerContainer must name a container of the role's "
                "template.spec.containers"
            )
        return self

    @cached_property
    def container_names(self) -> list[str]:
        """Names of the template's containers, in order (kept: a pass at N=5000 asks ~40,000
        times, and the template does not change under a parsed job)."""
        return _template_container_names(self.template)

    @cached_property
    def trainer_container_name(self) -> str:
        """The container that runs training: `trainerContainer`, or the template's first."""
        return self.trainer_container or self.container_names[0]


class Coordinator(_Model):
    """The worker `MASTER_ADDR` points to."""

    role: str = Field(min_length=1, max_length=_ROLE_NAME_MAX, description="Name of a ranked role.")
    index: int = Field(default=0, ge=0, description="Index of the worker within the role.")


class RoleSuccess(_Model):
    """When the job has succeeded, by the workers of some roles."""

    operator: SuccessOperator = Field(
        description="`All`: every worker of the named roles succeeded (a worker whose failure "
        "the failure policy ignores counts as done). `Any`: one worker of them succeeded."
    )
    roles: list[Annotated[str, Field(max_length=_ROLE_NAME_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=_ROLES_MAX,
        description="Names of `spec.roles`. Unset: every role.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


@dataclass(frozen=True)
class Elasticity:
    """An elastic gang's bounds and the workers they bound (docs/design.md section 3.12): the
    workers numbered from `first` on, those of the elastic role (every worker of a job of one
    role). The workers below `first`, of the other roles, are always in the world: never
    dropped, spared or removed by a resize."""

    bounds: ElasticSpec
    first: int
    field: str
    """Where the bounds are written, for messages: `spec.elastic`, `spec.roles[NAME].elastic`."""

    @property
    def min_world(self) -> int:
        """The fewest workers the gang's world may have: the fixed roles' and `minReplicas`."""
        return self.first + self.bounds.min_replicas


@dataclass(frozen=True)
class WorkerSlot:
    """One worker of the gang: its role, its index in the role, its global `RANK` (None in a
    role that is not ranked), and its number in the gang (`gangjob.io/rank`)."""

    role: Role
    index: int
    rank: int | None
    worker: int


def _role_names_exist(names: str) -> str:
    # `names` is a CEL list expression; true when each is a role of `spec.roles`.
    return f"{names}.all(n, has(self.roles) && self.roles.exists(x, x.name == n))"


def _immutable(field: str) -> JsonValue:
    if field == "roles":
        # The same roles in the same order; each role's own rules keep its fields (but an
        # elastic role's replicas).
        return {
            "rule": "has(self.roles) == has(oldSelf.roles) && (!has(self.roles) || "
            "(self.roles.size() == oldSelf.roles.size() && "
            f"{_ROLE_INDEXES}.all(i, i >= self.roles.size() || "
            "self.roles[i].name == oldSelf.roles[i].name)))",
            "message": "spec.roles is immutable (but an elastic role's replicas): the same "
            "roles, in the same order",
            "fieldPath": ".roles",
        }
    if field == "replicas":
        # Elastic jobs resize by `replicas`, within their bounds (a rule of its own).
        return {
            "rule": "has(self.replicas) == has(oldSelf.replicas) && (!has(self.replicas) || "
            "self.replicas == oldSelf.replicas || (has(self.elastic) && has(oldSelf.elastic)))",
            "message": "spec.replicas is immutable unless spec.elastic is set (and was set "
            "before this change)",
            "fieldPath": ".replicas",
        }
    return _immutable_field(field, f"spec.{field}")


IMMUTABLE_FIELDS: Final = ("replicas", "template", "roles", "coordinator", "masterPort")
"""Fields of `spec` the apiserver refuses to change once the GangJob exists (docs/api.md)."""

_KEEPS_PODS: Final = "!has(self.restart) || !has(self.restart.mode) || " + " && ".join(
    f"self.restart.mode != '{mode}'"
    for mode, meaning in RESTART_MODES.items()
    if not meaning.in_place
)
"""CEL, on the spec: its restart mode keeps the pods (spares need it)."""

_SPEC_RULES: Final[list[JsonValue]] = [
    {
        "rule": "has(self.roles) != has(self.replicas)",
        "message": "set either spec.roles or spec.replicas with spec.template, not both nor "
        "neither",
        "fieldPath": ".roles",
    },
    {
        "rule": "has(self.replicas) == has(self.template)",
        "message": "spec.replicas and spec.template go together",
        "fieldPath": ".template",
    },
    {
        "rule": "!has(self.trainerContainer) || (has(self.template) && "
        "self.template.spec.containers.exists(c, c.name == self.trainerContainer))",
        "message": "trainerContainer must name a container of spec.template.spec.containers "
        "(with spec.roles, set it on the role)",
        "fieldPath": ".trainerContainer",
    },
    {
        "rule": "!has(self.failurePolicy) || !has(self.failurePolicy.rules) || "
        "self.failurePolicy.rules.all(r, !has(r.onExitCodes) || "
        "!has(r.onExitCodes.containerName) || (has(self.template) ? "
        "self.template.spec.containers.exists(c, c.name == r.onExitCodes.containerName) : "
        "self.roles.exists(x, "
        "x.template.spec.containers.exists(c, c.name == r.onExitCodes.containerName))))",
        "message": "failurePolicy.rules[].onExitCodes.containerName must name a container of "
        "spec.template.spec.containers (with spec.roles, of a role's template)",
        "fieldPath": ".failurePolicy.rules",
    },
    {
        "rule": "!has(self.failurePolicy) || !has(self.failurePolicy.rules) || "
        "self.failurePolicy.rules.all(r, !has(r.roles) || " + _role_names_exist("r.roles") + ")",
        "message": "failurePolicy.rules[].roles must name roles of spec.roles",
        "fieldPath": ".failurePolicy.rules",
    },
    {
        "rule": "!has(self.success) || !has(self.success.roles) || "
        + _role_names_exist("self.success.roles"),
        "message": "success.roles must name roles of spec.roles",
        "fieldPath": ".success.roles",
    },
    {
        "rule": "!has(self.success) || self.successPolicy != 'Rank0'",
        "message": "successPolicy Rank0 and success exclude each other: say it in success",
        "fieldPath": ".success",
    },
    {
        "rule": "!has(self.coordinator) || (has(self.roles) ? self.roles.exists(r, "
        "r.name == self.coordinator.role && r.ranked && self.coordinator.index < r.replicas) "
        f": (self.coordinator.role == '{SHORTHAND_ROLE}' && "
        "self.coordinator.index < self.replicas))",
        "message": "coordinator must name a ranked role of spec.roles and an index below its "
        "replicas",
        "fieldPath": ".coordinator",
    },
    {
        "rule": "!has(self.template) || " + _trainer_is("self", _TRAINER_RESTARTS),
        "message": "template.spec.containers[].restartPolicy: " + _TRAINER_RESTARTS_MESSAGE,
        "fieldPath": ".template.spec.containers",
    },
    *(
        _rule(
            rule=f"!has(self.{field}) || !({when}) || {trainer_has_command}",
            message=f"{field}{each}.template.spec.containers[].command: "
            + _COMMAND_MESSAGE.format(why=why),
            field_path=f".{field}",
        )
        for field, each, trainer_has_command in (
            ("template", "", _trainer_is("self", _HAS_COMMAND)),
            ("roles", "[]", f"self.roles.all(r, {_trainer_is('r', _HAS_COMMAND)})"),
        )
        for when, why in (
            (
                f"has(self.restart) && has(self.restart.mode) && "
                f"self.restart.mode == '{RestartMode.PROCESS}'",
                "restart mode Process",
            ),
            ("has(self.nprocPerNode)", "spec.nprocPerNode"),
            ("has(self.elastic)", "spec.elastic"),
            (
                "has(self.roles) && self.roles.exists(r, has(r.elastic))",
                "an elastic role (spec.roles[].elastic)",
            ),
        )
    ),
    {
        "rule": "!has(self.elastic) || has(self.replicas)",
        "message": ELASTIC_ON_ROLE,
        "fieldPath": ".elastic",
    },
    {
        "rule": "!has(self.roles) || !self.roles.exists(r, has(r.elastic) && "
        "has(r.elastic.spares) && r.elastic.spares > 0) || " + _KEEPS_PODS,
        "message": "roles[]." + SPARES_NEED_IN_PLACE,
        "fieldPath": ".roles",
    },
    {
        "rule": "!has(self.elastic) || !has(self.elastic.spares) || self.elastic.spares == 0 || "
        + _KEEPS_PODS,
        "message": SPARES_NEED_IN_PLACE,
        "fieldPath": ".elastic.spares",
    },
    {
        "rule": "!has(self.elastic) || !has(self.replicas) || "
        "(self.replicas >= self.elastic.minReplicas && "
        "self.replicas <= self.elastic.maxReplicas)",
        "message": "replicas must be within spec.elastic.minReplicas..spec.elastic.maxReplicas",
        "fieldPath": ".replicas",
    },
    *(_immutable(name) for name in IMMUTABLE_FIELDS),
]


_ROLES_RULES: Final[list[JsonValue]] = [
    {
        # By position, over a literal list of the possible indexes: the apiserver's cost
        # estimate of `indexOf` is unbounded, and CRDs have no `cel.bind`. Naming only earlier
        # roles also rules out cycles.
        "rule": f"{_ROLE_INDEXES}.all(i, i >= self.size() || !has(self[i].dependsOn) || "
        f"self[i].dependsOn.all(d, {_ROLE_INDEXES}.exists(j, j < i && self[j].name == d.role)))",
        "message": "roles[].dependsOn[].role must name an earlier role of spec.roles",
    },
    {
        "rule": "self.exists(r, !has(r.ranked) || r.ranked)",
        "message": "at least one role must be ranked",
    },
    {
        "rule": f"{_ROLE_INDEXES}.all(i, i >= self.size() - 1 || !has(self[i].elastic))",
        "message": ELASTIC_ROLE_LAST,
    },
    {
        "rule": "!has(self[self.size() - 1].elastic) || self.all(r, !has(r.ranked) || r.ranked)",
        "message": ELASTIC_ROLES_RANKED,
    },
]


NprocPerNode = Annotated[
    Annotated[StrictInt, Field(ge=1)] | Literal["auto"],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": f"type(self) == int ? self >= 1 : self == '{NPROC_AUTO}'",
                    "message": f"nprocPerNode must be an integer >= 1 or '{NPROC_AUTO}'",
                }
            ],
        }
    ),
]
"""`spec.nprocPerNode`: an int-or-string, as torchrun's `--nproc-per-node` takes it."""


class GangJobSpec(_Model):
    """The desired state of a GangJob.

    Either `roles`, or the shorthand of one role: `replicas` + `template` (+
    `trainerContainer`), which `effective_roles` turns into the role `worker`; the controller
    reads only `effective_roles` and `workers`.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _SPEC_RULES})

    replicas: int | None = Field(
        default=None,
        ge=1,
        description="Gang size: the number of workers (ranks), for a job of one role. With "
        "`template`; not with `roles`.",
    )
    template: PodTemplate | None = Field(
        default=None,
        description="PodTemplateSpec of a worker, for a job of one role. Its first container "
        "is the trainer unless `trainerContainer` names another.",
    )
    trainer_container: str | None = Field(
        default=None,
        max_length=_CONTAINER_NAME_MAX,
        description="Name of the template's container that runs training. Unset: the first.",
    )
    roles: list[Role] | None = Field(
        default=None,
        min_length=1,
        max_length=_ROLES_MAX,
        description="The job's roles, each a group of identical workers; instead of "
        "`replicas` + `template`. Names are unique; the ranked roles' workers are the ranks, "
        "in the order of this list.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": _ROLES_RULES,
        },
    )
    coordinator: Coordinator | None = Field(
        default=None,
        description="The worker `MASTER_ADDR` points to. Unset: rank 0.",
    )
    restart: RestartSpec = Field(
        default_factory=RestartSpec,
        description="How the gang restarts after a failure.",
        # `{}` rather than the full default object: the apiserver then applies the nested
        # defaults, which stay declared once, on the fields.
        json_schema_extra={"default": {}},
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description="Rules classifying failures into actions; first match wins.",
    )
    node_loss: NodeLossSpec = Field(
        default_factory=NodeLossSpec,
        description="What happens to workers whose node is lost.",
        json_schema_extra={"default": {}},
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="How the gang's pods are scheduled.",
        json_schema_extra={"default": {}},
    )
    success_policy: SuccessPolicy = Field(
        default=SuccessPolicy.ALL,
        description="`All`: the job succeeds when every worker's trainer exited 0. `Rank0`: "
        "when rank 0's did. `success`, when set, decides instead.",
    )
    success: RoleSuccess | None = Field(
        default=None,
        description="When the job succeeds, by roles: e.g. `{operator: Any, roles: [launcher]}`. "
        "Unset: by `successPolicy`.",
    )
    suspend: bool = Field(
        default=False,
        description="Suspend the job: its pods are deleted and none are created until false.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job (reason `DeadlineExceeded`) once this many seconds have passed "
        "since `status.startTime`, as a Kubernetes Job's `activeDeadlineSeconds`: time spent "
        "restarting, recreating workers or waiting to be scheduled counts, and so does time "
        "suspended (the clock is not reset on resume). Its workers are then cleaned up as "
        "`cleanPodPolicy` says. Unset: no deadline.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the GangJob this long after it succeeded or failed. Unset: never.",
    )
    progress: ProgressSpec = Field(
        default_factory=ProgressSpec,
        description="Hang detection from the progress the trainers report.",
        json_schema_extra={"default": {}},
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default=CleanPodPolicy.NONE,
        description="What happens to the workers' pods when the job finishes. `None` (the "
        "default): no pod is deleted; a worker still running is stopped in place (its pod's "
        "`activeDeadlineSeconds`: the kubelet ends it, `Failed`, reason `DeadlineExceeded`), so "
        "every worker's exit and logs stay readable (`kubectl logs`, `gangjob logs`) until "
        "`ttlSecondsAfterFinished` or the user deletes the job, while no pod holds a node's "
        "devices. The default because what a user does first with a finished job is read its "
        "logs. `Running`: the pods still running are deleted, the finished ones kept. `All`: "
        "every pod is deleted.",
    )
    master_port: int = Field(
        default=29500,
        ge=1,
        le=65535,
        description="Port of the rendezvous on the coordinator, given to workers as `MASTER_PORT`.",
    )

    elastic: ElasticSpec | None = Field(
        default=None,
        description="Makes the gang elastic: `replicas` may change within "
        "`[minReplicas, maxReplicas]`, and a change resizes the gang in place at the next "
        "epoch (surplus workers, the highest indices, deleted; new ones created; every kept "
        "worker restarted in place with the new `WORLD_SIZE`). Only with `replicas` + "
        "`template` (with `spec.roles`, set `elastic` on a role). The trainer's `command` is "
        "required: the agent runs it with the epoch's `RANK` and `WORLD_SIZE`. Unset: "
        "`replicas` is immutable.",
    )
    nproc_per_node: NprocPerNode | None = Field(
        default=None,
        description="Processes torchrun starts in each worker pod (a pod is one torchrun node), "
        "given to the trainer as `PET_NPROC_PER_NODE`: an integer, or `auto` for the trainer "
        "container's GPU limit (`nvidia.com/gpu`, `amd.com/gpu`; 1 without one). Unset: 1. Set, "
        "every mode runs the trainer's `command` through the agent, which gives it the "
        "epoch's rendezvous id (`PET_RDZV_ID`): the command is then required.",
    )

    @field_validator("template")
    @classmethod
    def _template_has_containers(cls, template: dict[str, Any] | None) -> dict[str, Any] | None:
        if template is not None:
            _template_container_names(template)
        return template

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.roles is None) == (self.replicas is None):
            raise ValueError(
                "roles: set either spec.roles or spec.replicas with spec.template, not both "
                "nor neither"
            )
        if (self.replicas is None) != (self.template is None):
            raise ValueError("template: spec.replicas and spec.template go together")
        if self.elastic is not None:
            if self.replicas is None:
                raise ValueError(ELASTIC_ON_ROLE)
            if not self.elastic.admits(self.replicas):
                raise ValueError(
                    "replicas must be within spec.elastic.minReplicas..spec.elastic.maxReplicas"
                )
            if self.elastic.spares and not RESTART_MODES[self.restart.mode].in_place:
                raise ValueError(SPARES_NEED_IN_PLACE)
        if self.roles is not None and self.trainer_container is not None:
            raise ValueError("trainerContainer: with spec.roles, set trainerContainer on the role")
        if (
            self.template is not None
            and self.trainer_container is not None
            and self.trainer_container not in _template_container_names(self.template)
        ):
            raise ValueError(
                "trainerContainer must name a container of spec.template.spec.containers"
            )
        return self

    @model_validator(mode="after")
    def _roles_consistent(self) -> Self:
        roles = self.effective_roles
        names = [role.name for role in roles]
        for index, role in enumerate(roles):
            if role.name in names[:index]:
                raise ValueError(f"roles[{index}].name {role.name!r} is duplicated")
            for dep in role.depends_on:
                if dep.role not in names[:index]:
                    raise ValueError(
                        f"roles[{index}].dependsOn[].role {dep.role!r} must name an earlier role"
                    )
        if not any(role.ranked for role in roles):
            raise ValueError("roles: at least one role must be ranked")
        if any(role.elastic is not None for role in roles[:-1]):
            raise ValueError(ELASTIC_ROLE_LAST)
        elastic = roles[-1].elastic
        if self.roles is not None and elastic is not None:
            if not all(role.ranked for role in roles):
                raise ValueError(ELASTIC_ROLES_RANKED)
            if elastic.spares and not RESTART_MODES[self.restart.mode].in_place:
                raise ValueError("roles[]." + SPARES_NEED_IN_PLACE)
        coordinator = self.coordinator
        if coordinator is not None:
            target = next((r for r in roles if r.name == coordinator.role), None)
            if target is None or not target.ranked or coordinator.index >= target.replicas:
                raise ValueError(
                    "coordinator must name a ranked role of spec.roles and an index below its "
                    "replicas"
                )
        for index, rule in enumerate(self.failure_policy.rules):
            unknown = set(rule.roles or ()) - set(names)
            if (self.roles is None and rule.roles is not None) or unknown:
                raise ValueError(
                    f"failurePolicy.rules[{index}].roles must name roles of spec.roles"
                )
            exit_codes = rule.on_exit_codes
            container = exit_codes.container_name if exit_codes else None
            if container is not None and not any(container in r.container_names for r in roles):
                raise ValueError(
                    f"failurePolicy.rules[{index}].onExitCodes.containerName must name a "
                    "container of spec.template.spec.containers (with spec.roles, of a "
                    "role's template)"
                )
        if self.success is not None:
            unknown = set(self.success.roles or ()) - set(names)
            if (self.roles is None and self.success.roles is not None) or unknown:
                raise ValueError("success.roles must name roles of spec.roles")
            if self.success_policy is SuccessPolicy.RANK0:
                raise ValueError(
                    "success: successPolicy Rank0 and success exclude each other: say it in success"
                )
        return self

    @cached_property
    def effective_roles(self) -> tuple[Role, ...]:
        """The job's roles: `spec.roles`, or for the shorthand the one role `worker` made of
        `replicas`, `template` and `trainerContainer`. The one place the shorthand becomes a
        role; everything downstream reads roles."""
        if self.roles is not None:
            last = self.roles[-1]
            if last.elastic is None or not last.elastic.spares:
                return tuple(self.roles)
            # The elastic role's spares are workers of it, numbered after its replicas.
            spares = last.elastic.spares
            return (*self.roles[:-1], last.model_copy(update={"replicas": last.replicas + spares}))
        # `_one_form` holds: the shorthand has both.
        assert self.replicas is not None
        assert self.template is not None
        # Constructed, not validated: the fields were validated on the spec, and the role
        # shares the spec's template (a copy would be paid per job, and be a second truth).
        # An elastic gang's spares are workers of its one role, numbered after the world.
        spares = 0 if self.elastic is None else self.elastic.spares
        return (
            Role.model_construct(
                name=SHORTHAND_ROLE,
                replicas=self.replicas + spares,
                template=self.template,
                trainer_container=self.trainer_container,
                ranked=True,
                depends_on=[],
            ),
        )

    @cached_property
    def elasticity(self) -> Elasticity | None:
        """What makes the gang elastic, if anything: `spec.elastic`, or the elastic role's
        (the last of `spec.roles`, whose workers are numbered last)."""
        if self.elastic is not None:
            return Elasticity(self.elastic, 0, "spec.elastic")
        if self.roles is not None and (bounds := self.roles[-1].elastic) is not None:
            fixed = sum(role.replicas for role in self.roles[:-1])
            return Elasticity(bounds, fixed, f"spec.roles[{self.roles[-1].name}].elastic")
        return None

    @property
    def shorthand(self) -> bool:
        """Written with `replicas` + `template`: its pods keep the names `<job>-<index>`."""
        return self.roles is None

    @cached_property
    def pod_names(self) -> dict[str, tuple[str, ...]]:
        """Job name -> every worker's pod name, by worker number, as `api.naming` computes
        them on first ask (a pass at N=5000 asks each of 5000 once or more: ~50 ms of string
        formatting a pass, and the names do not change under a parsed spec)."""
        return {}

    @cached_property
    def workers(self) -> tuple[WorkerSlot, ...]:
        """Every worker of the gang, numbered (docs/api.md, "Ranks and names"): the ranked
        roles' workers first, in role order and index order, numbered 0..WORLD_SIZE-1 (their
        `RANK`); then the other roles' workers, in role order, numbered on from WORLD_SIZE."""
        slots: list[WorkerSlot] = []
        for ranked in (True, False):
            for role in self.effective_roles:
                if role.ranked is ranked:
                    for index in range(role.replicas):
                        number = len(slots)
                        slots.append(WorkerSlot(role, index, number if ranked else None, number))
        return tuple(slots)

    @property
    def world_size(self) -> int:
        """`WORLD_SIZE`: the workers of the ranked roles."""
        return sum(role.replicas for role in self.effective_roles if role.ranked)

    def role(self, name: str) -> Role | None:
        """The role of this name, if any."""
        return next((role for role in self.effective_roles if role.name == name), None)

    def worker_of(self, role: str, index: int) -> WorkerSlot:
        """The worker `index` of role `role` (both must exist)."""
        return next(w for w in self.workers if w.role.name == role and w.index == index)

    @property
    def container_names(self) -> list[str]:
        """Names of the first role's template's containers, in order."""
        return self.effective_roles[0].container_names

    @property
    def trainer_container_name(self) -> str:
        """The first role's trainer container (the shorthand's `trainerContainer`, or its
        template's first container)."""
        return self.effective_roles[0].trainer_container_name

    def role_of(self, worker: int) -> Role:
        """The role of worker number `worker`; the first role's for a number out of range."""
        if 0 <= worker < len(self.workers):
            return self.workers[worker].role
        return self.effective_roles[0]

    @property
    def coordinator_worker(self) -> WorkerSlot:
        """The worker `MASTER_ADDR` points to: `coordinator`, or rank 0."""
        if self.coordinator is not None:
            return self.worker_of(self.coordinator.role, self.coordinator.index)
        return self.workers[0]


# --- status ---------------------------------------------------------------------------------


class WorkersStatus(_Model):
    """Counts of the gang's workers."""

    total: int = Field(default=0, ge=0, description="Workers that exist (pods of the gang).")
    ready: int = Field(default=0, ge=0, description="Workers whose pod is Ready.")
    arrived: int = Field(
        default=0,
        ge=0,
        description="Workers that have arrived at `status.epoch` (their pod's "
        "`gangjob.io/epoch` annotation).",
    )


class Place(_Model):
    """A worker of an elastic gang's world that holds another worker's place in the rank
    order: a spare that took the place of a lost worker runs with that worker's `RANK`."""

    worker: int = Field(ge=0, description="The worker (`gangjob.io/rank`) holding the place.")
    place: int = Field(
        ge=0,
        description="The worker whose place in the rank order it holds: it is ranked as that "
        "worker would be, so its `RANK` is the one the lost worker had.",
    )


class RoleStatus(_Model):
    """Where one role stands, and counts of its workers."""

    name: str = Field(description="Name of the role.")
    state: RoleState = Field(
        description="`Waiting`: its pods wait for the roles it depends on. `Running`: its pods "
        "are created. `Complete`: every worker succeeded; a gang restart does not run it again."
    )
    replicas: int = Field(default=0, ge=0, description="Workers of the role.")
    ready: int = Field(default=0, ge=0, description="Workers whose pod is Ready.")
    arrived: int = Field(default=0, ge=0, description="Workers arrived at `status.epoch`.")
    succeeded: int = Field(default=0, ge=0, description="Workers that succeeded.")
    failed: int = Field(
        default=0,
        ge=0,
        description="Workers whose pod failed, or whose trainer ended with a non-zero code at "
        "`status.epoch` (whatever the failure policy does about it).",
    )
    started_late_at: int | None = Field(
        default=None,
        ge=0,
        description="The epoch whose barrier was already open when the role's pods were first "
        "created (a role that waited for another to be Ready): until the next restart, a pod "
        "of it that is gone is created again rather than restarting the gang. Unset: the role "
        "started before its epoch's barrier opened.",
    )


class RestartCounts(_Model):
    """Counts of the gang's restarts."""

    total: int = Field(default=0, ge=0, description="Gang restarts so far (epoch bumps).")
    counted: int = Field(
        default=0, ge=0, description="Restarts that counted against `spec.restart.maxRestarts`."
    )
    in_place: int = Field(
        default=0, ge=0, description="Restarts in which every worker restarted in place."
    )
    recreated_workers: int = Field(
        default=0, ge=0, description="Workers recreated so far, over all restarts."
    )


class RestartTrigger(_Model):
    """The failure that caused a restart."""

    worker: int | None = Field(
        default=None, ge=0, description="Rank of the worker that failed; unset if not one worker's."
    )
    failure_class: str = Field(
        # Not `alias`: type checkers take that for the constructor's keyword, and `class` is
        # not a usable keyword; the attribute name is what Python code passes.
        validation_alias="class",
        serialization_alias="class",
        min_length=1,
        description="Class of the failure, e.g. `ProcessExit`, `NodeLost`, `DeviceUnhealthy`.",
    )
    detail: str | None = Field(
        default=None, description="What was observed, for humans (exit code, condition, node)."
    )
    action: FailureAction = Field(description="The action the failure policy chose.")


class RestartRecord(_Model):
    """One gang restart and how long it took."""

    epoch: int = Field(ge=0, description="The epoch the gang restarted to.")
    trigger: RestartTrigger = Field(description="The failure that caused the restart.")
    detected_at: MicroTime = Field(
        description="When the controller observed the failure and raised the epoch."
    )
    barrier_open_at: MicroTime | None = Field(
        default=None,
        description="When every worker had arrived and the barrier opened; unset while the "
        "restart is in progress.",
    )
    duration_seconds: float | None = Field(
        default=None, ge=0, description="`barrierOpenAt` - `detectedAt`, in seconds."
    )
    recreated: list[int] = Field(
        default_factory=list,
        description="Ranks of the workers recreated by this restart; empty when "
        "`recreatedAll` is set.",
    )
    recreated_all: bool | None = Field(
        default=None,
        description="Every worker was recreated by this restart (`Recreate` mode), and "
        "`recreated` does not list them: every agent watches this object, so its size is paid "
        "once per agent on every write. Unset: only those in `recreated`.",
    )
    counted: bool | None = Field(
        default=None,
        description="Whether this restart counted against `spec.restart.maxRestarts`; "
        "consecutive counted restarts double `spec.restart.backoffSeconds`. Unset: it did not.",
    )
    onset_at: MicroTime | None = Field(
        default=None,
        description="When the failure began, as far as the controller can tell: for a `Hang`, "
        "when the hung worker last made progress; else when it was detected.",
    )
    step: int | None = Field(
        default=None,
        ge=0,
        description="The gang's step when it failed (its lowest reported step); unset without "
        "progress reports.",
    )
    checkpoint_step: int | None = Field(
        default=None,
        ge=0,
        description="The gang's latest checkpoint when it failed: the step it resumes from.",
    )
    lost_steps: int | None = Field(
        default=None,
        ge=0,
        description="`step` - `checkpointStep`: steps done since the checkpoint the gang "
        "resumes from, to be computed again.",
    )
    lost_seconds: float | None = Field(
        default=None,
        ge=0,
        description="`lostSteps` at the gang's step rate before the failure: the time the "
        "gang spends computing them again (the `recompute` badput).",
    )

    def recreated_ranks(self, replicas: int) -> list[int]:
        """The ranks this restart recreated, whichever way the record holds them."""
        return list(range(replicas)) if self.recreated_all else list(self.recreated)


# metav1.Condition's validation, so that our conditions read like every other resource's.
_CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class ProgressStatus(_Model):
    """The gang's training progress, from what its workers' trainers report."""

    step: int | None = Field(
        default=None, ge=0, description="The gang's step: the lowest step its workers reported."
    )
    steps_per_second: float | None = Field(
        default=None, ge=0, description="The gang's step rate over the last reports."
    )
    checkpoint_step: int | None = Field(
        default=None,
        ge=0,
        description="The latest step a worker reported checkpointed: the step the gang "
        "resumes from.",
    )
    reporting: int = Field(
        default=0, ge=0, description="Workers whose trainer reported progress at the epoch."
    )
    stragglers: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        max_length=STRAGGLERS_LIMIT,
        description="The ranks of the workers found straggling at the epoch (see "
        f"`spec.progress.straggler`), the lowest {STRAGGLERS_LIMIT}; unset: none.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    malformed_lines: int = Field(
        default=0,
        ge=0,
        description="Lines of the workers' progress files at the epoch that were not "
        "`step=<int> [compute=<seconds>] [checkpoint=<int>]`: ignored, and counted here.",
    )
    updated_at: Time | None = Field(
        default=None,
        description="When this was written: at each restart, and while the gang runs every "
        "30 s (every N/50 s for gangs of N > 1500 workers, as often as their agents summarise).",
    )


class BadputSeconds(_Model):
    """Wall time that trained nothing, by cause (docs/api.md "Goodput")."""

    scheduling: float = Field(
        default=0, ge=0, description="From the job's start until its first barrier opened."
    )
    detection: float = Field(
        default=0,
        ge=0,
        description="From each failure's onset until the controller raised the epoch.",
    )
    restart: float = Field(
        default=0, ge=0, description="From each epoch raised until its barrier opened."
    )
    recompute: float = Field(
        default=0,
        ge=0,
        description="Computing again the steps lost since the last checkpoint, at each failure.",
    )


class GoodputStatus(_Model):
    """What the job's failures cost: productive time against wall time."""

    ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="`productiveSeconds` / `wallSeconds`: the job's goodput (Meta's effective "
        "training time ratio).",
    )
    wall_seconds: float = Field(
        default=0, ge=0, description="Since the job started, until now or its end."
    )
    productive_seconds: float = Field(
        default=0, ge=0, description="Wall time less every cause of `lostSeconds`."
    )
    lost_seconds: BadputSeconds = Field(
        default_factory=BadputSeconds, description="Wall time that trained nothing, by cause."
    )


class Condition(_Model):
    """A condition of the GangJob (the shape of metav1.Condition)."""

    type: str = Field(
        max_length=316,
        pattern=_CONDITION_TYPE_PATTERN,
        description="Type of the condition: Ready, Restarting, Succeeded, Failed, Suspended, "
        "ModeDegraded, GangScheduling, Stuck, ArrivalDegraded, Stragglers (see Conditions).",
    )
    status: ConditionStatus = Field(description="Status of the condition.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="`metadata.generation` the condition was set for.",
    )
    last_transition_time: Time = Field(description="When the condition last changed status.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=_CONDITION_REASON_PATTERN,
        description="CamelCase reason for the condition's last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable details of the transition."
    )


class GangJobStatus(_Model):
    """The observed state of a GangJob, written by the controller."""

    # Not frozen: a planning pass works on a copy, each field written by the step that owns it.
    model_config = ConfigDict(frozen=False)

    phase: Phase | None = Field(default=None, description="Phase of the job.")
    epoch: int = Field(
        default=0,
        ge=0,
        description="The gang's target epoch. Only the controller raises it, by one per gang "
        "restart; workers below it stop and restart.",
    )
    barrier_epoch: int | None = Field(
        default=None,
        ge=0,
        description="The epoch whose barrier is open: every worker has arrived at it and may "
        "run. Unset until the first barrier opens.",
    )
    barrier_opened_at: MicroTime | None = Field(
        default=None,
        description="When the barrier of `barrierEpoch` opened, for every epoch, the first "
        "included: a worker's container that terminated after it had failed at that epoch.",
    )
    world_size: int | None = Field(
        default=None,
        ge=0,
        description="`WORLD_SIZE` of `status.epoch`: the ranked workers the gang runs with at "
        "this epoch. Differs from the spec's only while an elastic resize is pending.",
    )
    dropped: list[int] = Field(
        default_factory=list,
        max_length=_ELASTIC_DROPPED_MAX,
        description="Workers (`gangjob.io/rank`) an elastic gang goes on without at this epoch: "
        "its spares (`elastic.spares`), and workers whose pods could not be placed for "
        "`elastic.waitSeconds`. Ranks stay dense: a worker's `RANK` is its place among the "
        "epoch's workers, in the order of their numbers (or of their `places`).",
    )
    places: list[Place] = Field(
        default_factory=list,
        max_length=_ELASTIC_DROPPED_MAX,
        description="Workers of the world ranked in another worker's place: a spare that took "
        "a lost worker's place holds its rank, so the other workers keep theirs.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["worker"],
        },
    )
    workers: WorkersStatus = Field(
        default_factory=WorkersStatus, description="Counts of the gang's workers."
    )
    roles: list[RoleStatus] | None = Field(
        default=None,
        max_length=_ROLES_MAX,
        description="Each role's state and counts, in the order of the spec's roles.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    roles_ready: str | None = Field(
        default=None,
        max_length=512,
        description="Each role's `<ready>/<replicas>` while it runs, else its state, e.g. "
        "`init Complete, worker 4/4, launcher Waiting` (the `Roles` printer column).",
    )
    restarts: RestartCounts = Field(
        default_factory=RestartCounts, description="Counts of the gang's restarts."
    )
    last_restart: RestartRecord | None = Field(
        default=None, description="The latest gang restart, in progress or done."
    )
    history: list[RestartRecord] = Field(
        default_factory=list,
        max_length=HISTORY_LIMIT,
        description=f"The last {HISTORY_LIMIT} gang restarts, oldest first.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Restarting, Succeeded, Failed, Suspended, ModeDegraded, "
        "GangScheduling, Stuck, ArrivalDegraded, Stragglers (see Conditions).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="`metadata.generation` this status was computed for."
    )
    start_time: Time | None = Field(default=None, description="When the job first started running.")
    completion_time: Time | None = Field(
        default=None, description="When the job succeeded or failed."
    )
    mode: RestartMode | None = Field(
        default=None,
        description="The restart mode in effect: `spec.restart.mode`, or the mode fallen back "
        "to when the cluster cannot honour it.",
    )
    progress: ProgressStatus | None = Field(
        default=None,
        description="The gang's training progress; unset until a trainer reports.",
    )
    goodput: GoodputStatus | None = Field(
        default=None,
        description="What the job's failures cost, once it has run (see Goodput).",
    )
    avoid_nodes: list[str] | None = Field(
        default=None,
        max_length=AVOID_NODES_LIMIT,
        description="Nodes whose devices failed a worker: workers created from then on get a "
        "required node affinity that keeps them off these nodes. The most recent "
        f"{AVOID_NODES_LIMIT}, oldest first; unset: none.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    def condition(self, type_: str) -> Condition | None:
        """The condition of this type, if any."""
        return next((c for c in self.conditions if c.type == type_), None)

    def role_state(self, name: str) -> RoleState | None:
        """The recorded state of the role of this name, if any."""
        return next((r.state for r in self.roles or () if r.name == name), None)


# --- the object -----------------------------------------------------------------------------


class ObjectMeta(_Model):
    """The parts of a GangJob's metadata the controller reads."""

    name: str = Field(description="Name of the GangJob.")
    namespace: str = Field(default="default", description="Namespace of the GangJob.")
    uid: str | None = Field(default=None, description="UID, for owner references of worker pods.")
    resource_version: str | None = Field(default=None, description="Resource version read.")
    generation: int | None = Field(default=None, description="Generation of the spec.")
    creation_timestamp: Time | None = Field(default=None, description="When it was created.")
    deletion_timestamp: Time | None = Field(
        default=None, description="When deletion was requested."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class GangJob(_Model):
    """A GangJob object as the API returns it."""

    api_version: str = Field(default=API_VERSION, description="gangjob.io/v1alpha1")
    kind: str = Field(default=KIND, description="GangJob")
    metadata: ObjectMeta = Field(description="Standard object metadata (the parts we read).")
    spec: GangJobSpec = Field(description="Desired state.")
    status: GangJobStatus = Field(default_factory=GangJobStatus, description="Observed state.")


def parse_gangjob(obj: Mapping[str, Any]) -> GangJob:
    """A GangJob from the dict the API returns (camelCase); raises pydantic.ValidationError."""
    return GangJob.model_validate(obj)


def dump_gangjob(job: GangJob) -> dict[str, Any]:
    """The GangJob as an API dict (camelCase, unset fields left out), e.g. to create it."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)


def dump_status(status: GangJobStatus) -> dict[str, Any]:
    """The status as an API dict (camelCase, unset fields left out), for a status write.

    Fields that are None are left out, not sent as null: under a merge patch they keep their
    old value, so clearing one needs an explicit null (or a full update of the status).
    """
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)
