"""Unit tests of api.v1alpha1 and api.constants: defaults, wire names, round trips, validation."""

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from api import constants
from api.constants import ConditionType
from api.v1alpha1 import (
    Condition,
    ConditionStatus,
    FailureAction,
    GangJob,
    GangJobSpec,
    GangJobStatus,
    GangSchedulingMode,
    Phase,
    RestartCounts,
    RestartMode,
    RestartRecord,
    RestartTrigger,
    SuccessPolicy,
    WorkersStatus,
    dump_gangjob,
    dump_status,
    parse_gangjob,
)

REPO = Path(__file__).resolve().parents[2]

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "ml"}},
    "spec": {
        "containers": [
            {"name": "trainer", "image": "trainer:1", "command": ["python", "train.py"]},
            {"name": "logger", "image": "logger:1"},
        ],
        "nodeSelector": {"gpu": "true"},
    },
}


def spec_dict(**overrides: Any) -> dict[str, Any]:
    return {"replicas": 4, "template": TEMPLATE, **overrides}


# A GangJob as the apiserver returns it, every field of 3b set (defaults applied).
SAMPLE: dict[str, Any] = {
    "apiVersion": "gangjob.io/v1alpha1",
    "kind": "GangJob",
    "metadata": {
        "name": "llama",
        "namespace": "ml",
        "uid": "0b6d2c55-6f7e-4a39-9a53-5a0e8f4c1d2e",
        "resourceVersion": "4711",
        "generation": 3,
        "creationTimestamp": "2026-05-01T10:00:00Z",
        "labels": {"app": "llama"},
        "annotations": {"note": "x"},
    },
    "spec": {
        "replicas": 4,
        "template": TEMPLATE,
        "trainerContainer": "trainer",
        "restart": {
            "mode": "Process",
            "maxRestarts": 5,
            "backoffSeconds": 2,
            "barrierTimeoutSeconds": 300,
        },
        "failurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [3]},
                    "countsTowardsMaxRestarts": True,
                },
                {
                    "action": "RecreateWorker",
                    "onPodConditions": [
                        {"type": "DisruptionTarget", "reason": "PreemptionByScheduler"},
                        {"type": "Custom", "status": "False"},
                    ],
                },
                {"action": "RecreateWorker", "onDeviceHealth": "Unhealthy"},
                {
                    "action": "RecreateWorker",
                    "onNodeConditions": [{"type": "GpuXidError", "status": "True"}],
                    "countsTowardsMaxRestarts": False,
                },
            ]
        },
        "nodeLoss": {"forceDeleteAfterSeconds": 30, "forceDelete": False},
        "scheduling": {"gang": "Off"},
        "successPolicy": "Rank0",
        "suspend": False,
        "ttlSecondsAfterFinished": 3600,
        "progress": {"hangSeconds": 60},
        "cleanPodPolicy": "Running",
        "masterPort": 23456,
    },
    "status": {
        "phase": "Running",
        "epoch": 2,
        "barrierEpoch": 2,
        "dropped": [],
        "places": [],
        "workers": {"total": 4, "ready": 4, "arrived": 4},
        "restarts": {"total": 2, "counted": 1, "inPlace": 1, "recreatedWorkers": 1},
        "lastRestart": {
            "epoch": 2,
            "trigger": {
                "worker": 3,
                "class": "NodeLost",
                "detail": "node n3 NotReady",
                "action": "RecreateWorker",
            },
            "detectedAt": "2026-05-01T10:05:00.100000Z",
            "barrierOpenAt": "2026-05-01T10:05:03.500000Z",
            "durationSeconds": 3.4,
            "recreated": [3],
        },
        "history": [
            {
                "epoch": 1,
                "trigger": {"worker": 0, "class": "ProcessExit", "action": "RestartGang"},
                "detectedAt": "2026-05-01T10:01:00.000000Z",
                "barrierOpenAt": "2026-05-01T10:01:01.250000Z",
                "durationSeconds": 1.25,
                "recreated": [],
            },
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-05-01T10:05:03Z",
                "reason": "BarrierOpen",
                "message": "all 4 workers run epoch 2",
            },
        ],
        "observedGeneration": 3,
        "startTime": "2026-05-01T10:00:05Z",
        "mode": "Pod",
    },
}


def test_constants_are_the_protocol_names() -> None:
    assert constants.API_VERSION == "gangjob.io/v1alpha1"
    assert (constants.KIND, constants.PLURAL, constants.SHORT_NAME) == ("GangJob", "gangjobs", "gj")
    assert constants.CRD_NAME == "gangjobs.gangjob.io"
    assert constants.LABEL_NAME == "gangjob.io/name"
    assert constants.LABEL_RANK == "gangjob.io/rank"
    assert constants.ANNOTATION_EPOCH == "gangjob.io/epoch"
    assert constants.ANNOTATION_EXIT == "gangjob.io/exit"
    assert [c.value for c in ConditionType] == [
        "Ready",
        "Restarting",
        "Succeeded",
        "Failed",
        "Suspended",
        "ModeDegraded",
        "GangScheduling",
        "Stuck",
        "ArrivalDegraded",
        "Stragglers",
    ]


def test_spec_defaults() -> None:
    spec = GangJobSpec.model_validate(spec_dict())
    assert spec.restart.mode is RestartMode.POD
    assert spec.restart.max_restarts == 10
    assert spec.restart.backoff_seconds == 0
    assert spec.restart.barrier_timeout_seconds == 600
    assert spec.failure_policy.rules == []
    assert spec.node_loss.force_delete_after_seconds == 60
    assert spec.node_loss.force_delete is True
    assert spec.success_policy is SuccessPolicy.ALL
    assert spec.suspend is False
    assert spec.ttl_seconds_after_finished is None
    assert spec.master_port == 29500
    assert spec.trainer_container is None
    assert spec.scheduling.gang is GangSchedulingMode.AUTO


def test_status_defaults_before_the_first_barrier() -> None:
    status = GangJobStatus()
    assert status.epoch == 0
    # Unset, not 0: a barrier at epoch 0 is open only once every worker has arrived.
    assert status.barrier_epoch is None
    assert status.workers == WorkersStatus(total=0, ready=0, arrived=0)
    assert status.restarts == RestartCounts(total=0, counted=0, in_place=0, recreated_workers=0)
    assert status.phase is None
    assert status.history == []
    assert status.conditions == []


def test_sample_round_trips() -> None:
    job = parse_gangjob(SAMPLE)
    assert dump_gangjob(job) == SAMPLE


def test_sample_reads_as_python() -> None:
    job = parse_gangjob(SAMPLE)
    assert job.metadata.name == "llama"
    assert job.metadata.generation == 3
    assert job.spec.restart.mode is RestartMode.PROCESS
    assert job.spec.trainer_container_name == "trainer"
    assert job.status.phase is Phase.RUNNING
    assert job.status.barrier_epoch == 2
    assert job.status.restarts.in_place == 1
    last = job.status.last_restart
    assert last is not None
    assert last.trigger.failure_class == "NodeLost"
    assert last.trigger.action is FailureAction.RECREATE_WORKER
    assert last.detected_at == datetime(2026, 5, 1, 10, 5, 0, 100000, tzinfo=UTC)
    ready = job.status.condition(ConditionType.READY)
    assert ready is not None
    assert ready.status is ConditionStatus.TRUE
    assert job.status.condition(ConditionType.FAILED) is None


def test_new_object_without_status() -> None:
    job = parse_gangjob({"metadata": {"name": "j", "namespace": "n"}, "spec": spec_dict()})
    assert job.api_version == constants.API_VERSION
    assert job.kind == constants.KIND
    assert job.status == GangJobStatus()


def test_unknown_fields_are_ignored() -> None:
    # A controller older than the CRD it reads must not fail on a field it does not know.
    obj = {**SAMPLE, "spec": {**SAMPLE["spec"], "newField": 1}}
    obj["status"] = {**SAMPLE["status"], "newStatus": {"x": 1}}
    assert parse_gangjob(obj) == parse_gangjob(SAMPLE)


def test_dump_status_is_camel_case_without_nones() -> None:
    status = GangJobStatus(epoch=1, phase=Phase.RESTARTING)
    assert dump_status(status) == {
        "phase": "Restarting",
        "epoch": 1,
        # Always sent, empty too: the status write is a merge patch, and only a list written
        # whole clears the workers an elastic gang had dropped.
        "dropped": [],
        "places": [],
        "workers": {"total": 0, "ready": 0, "arrived": 0},
        "restarts": {"total": 0, "counted": 0, "inPlace": 0, "recreatedWorkers": 0},
        "history": [],
        "conditions": [],
    }


def test_models_are_frozen_but_the_status_a_pass_builds() -> None:
    record = RestartCounts()
    with pytest.raises(ValidationError):
        record.total = 1
    job = parse_gangjob(SAMPLE)
    with pytest.raises(ValidationError):
        job.status = GangJobStatus()
    # The one mutable model: a planning pass writes its copy field by field.
    status = GangJobStatus()
    status.epoch = 1
    assert status.epoch == 1


def test_snake_case_names_construct_models() -> None:
    trigger = RestartTrigger(worker=1, failure_class="ProcessExit", action=FailureAction.IGNORE)
    record = RestartRecord(
        epoch=1,
        trigger=trigger,
        detected_at=datetime(2026, 1, 1, tzinfo=UTC),
        recreated=[1],
    )
    assert dump_status(GangJobStatus(last_restart=record))["lastRestart"] == {
        "epoch": 1,
        "trigger": {"worker": 1, "class": "ProcessExit", "action": "Ignore"},
        "detectedAt": "2026-01-01T00:00:00.000000Z",
        "recreated": [1],
    }


def test_trainer_container_defaults_to_the_first() -> None:
    assert GangJobSpec.model_validate(spec_dict()).trainer_container_name == "trainer"
    spec = GangJobSpec.model_validate(spec_dict(trainerContainer="logger"))
    assert spec.trainer_container_name == "logger"
    assert spec.container_names == ["trainer", "logger"]


# --- times ----------------------------------------------------------------------------------


def test_condition_time_is_whole_seconds_utc() -> None:
    cest = timezone(timedelta(hours=2))
    condition = Condition(
        type="Ready",
        status=ConditionStatus.TRUE,
        reason="BarrierOpen",
        last_transition_time=datetime(2026, 5, 1, 12, 0, 1, 999999, tzinfo=cest),
    )
    assert condition.last_transition_time == datetime(2026, 5, 1, 10, 0, 1, tzinfo=UTC)
    assert condition.model_dump(mode="json")["lastTransitionTime"] == "2026-05-01T10:00:01Z"


def test_naive_times_are_rejected() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        Condition(
            type="Ready",
            status=ConditionStatus.TRUE,
            reason="BarrierOpen",
            last_transition_time=datetime(2026, 5, 1),
        )


aware_times = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(9998, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7)), timezone(timedelta(hours=5))]),
)


@given(aware_times, aware_times)
def test_times_survive_a_round_trip_through_the_api(detected: datetime, changed: datetime) -> None:
    # What the controller holds must equal what it reads back, or every reconcile would see a
    # status change and write again.
    status = GangJobStatus(
        start_time=changed,
        last_restart=RestartRecord(
            epoch=1,
            trigger=RestartTrigger(failure_class="X", action=FailureAction.RESTART_GANG),
            detected_at=detected,
        ),
        conditions=[
            Condition(
                type="Ready",
                status=ConditionStatus.FALSE,
                reason="Waiting",
                last_transition_time=changed,
            )
        ],
    )
    assert GangJobStatus.model_validate(dump_status(status)) == status


# --- validation (mirrors the CRD's rules) ---------------------------------------------------


def rule(**matchers: Any) -> dict[str, Any]:
    return {"action": "RestartGang", **matchers}


EXIT_3 = {"operator": "In", "values": [3]}

INVALID_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("replicas 0", spec_dict(replicas=0), "replicas"),
    ("no template", {"replicas": 1}, "template"),
    ("no containers", spec_dict(template={"spec": {"containers": []}}), "at least one container"),
    ("no spec", spec_dict(template={"metadata": {}}), "at least one container"),
    (
        "container without image",
        spec_dict(template={"spec": {"containers": [{"name": "a"}]}}),
        r"containers\[0\].image is required",
    ),
    (
        "duplicate container",
        spec_dict(
            template={"spec": {"containers": [{"name": "a", "image": "i"}] * 2}},
        ),
        "duplicated",
    ),
    ("unknown trainer", spec_dict(trainerContainer="nope"), "trainerContainer must name"),
    ("mode", spec_dict(restart={"mode": "Reboot"}), "restart.mode"),
    ("maxRestarts", spec_dict(restart={"maxRestarts": -1}), "maxRestarts"),
    ("barrier timeout", spec_dict(restart={"barrierTimeoutSeconds": 0}), "barrierTimeoutSeconds"),
    ("port 0", spec_dict(masterPort=0), "masterPort"),
    ("port 65536", spec_dict(masterPort=65536), "masterPort"),
    ("cleanPodPolicy", spec_dict(cleanPodPolicy="Completed"), "cleanPodPolicy"),
    ("ttl", spec_dict(ttlSecondsAfterFinished=-1), "ttlSecondsAfterFinished"),
    ("successPolicy", spec_dict(successPolicy="Any"), "successPolicy"),
    ("no matcher", spec_dict(failurePolicy={"rules": [rule()]}), "exactly one of"),
    (
        "two matchers",
        spec_dict(failurePolicy={"rules": [rule(onExitCodes=EXIT_3, onDeviceHealth="Unhealthy")]}),
        "exactly one of",
    ),
    (
        "empty values",
        spec_dict(failurePolicy={"rules": [rule(onExitCodes={"operator": "In", "values": []})]}),
        "values",
    ),
    (
        "duplicate values",
        spec_dict(
            failurePolicy={"rules": [rule(onExitCodes={"operator": "NotIn", "values": [1, 1]})]}
        ),
        "values must be unique",
    ),
    (
        "exit code 256",
        spec_dict(failurePolicy={"rules": [rule(onExitCodes={"operator": "In", "values": [256]})]}),
        "values",
    ),
    (
        "In 0",
        spec_dict(
            failurePolicy={"rules": [rule(onExitCodes={"operator": "In", "values": [0, 1]})]}
        ),
        "must not contain 0 with operator In",
    ),
    (
        "unknown container in rule",
        spec_dict(failurePolicy={"rules": [rule(onExitCodes={**EXIT_3, "containerName": "nope"})]}),
        r"rules\[0\].onExitCodes.containerName must name",
    ),
    (
        "empty pod conditions",
        spec_dict(failurePolicy={"rules": [rule(onPodConditions=[])]}),
        "onPodConditions",
    ),
    (
        "node condition without status",
        spec_dict(failurePolicy={"rules": [rule(onNodeConditions=[{"type": "X"}])]}),
        "status",
    ),
    (
        "device health",
        spec_dict(failurePolicy={"rules": [rule(onDeviceHealth="Healthy")]}),
        "onDeviceHealth",
    ),
    (
        "action",
        spec_dict(failurePolicy={"rules": [{"action": "Retry", "onDeviceHealth": "Unknown"}]}),
        "action",
    ),
]


@pytest.mark.parametrize(
    ("spec", "error"),
    [pytest.param(spec, error, id=name) for name, spec, error in INVALID_SPECS],
)
def test_invalid_spec_is_rejected_naming_the_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        GangJobSpec.model_validate(spec)


def test_not_in_may_list_zero() -> None:
    spec = GangJobSpec.model_validate(
        spec_dict(failurePolicy={"rules": [rule(onExitCodes={"operator": "NotIn", "values": [0]})]})
    )
    matcher = spec.failure_policy.rules[0].on_exit_codes
    assert matcher is not None
    assert matcher.values == [0]


def test_invalid_condition_reason_is_rejected() -> None:
    with pytest.raises(ValidationError, match="reason"):
        Condition(
            type="Ready",
            status=ConditionStatus.TRUE,
            reason="not a reason",
            last_transition_time=datetime(2026, 1, 1, tzinfo=UTC),
        )


def test_history_is_capped() -> None:
    record = RestartRecord(
        epoch=1,
        trigger=RestartTrigger(failure_class="X", action=FailureAction.RESTART_GANG),
        detected_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    GangJobStatus(history=[record] * constants.HISTORY_LIMIT)
    with pytest.raises(ValidationError, match="history"):
        GangJobStatus(history=[record] * (constants.HISTORY_LIMIT + 1))


# --- documentation and layering -------------------------------------------------------------


def _models(root: type[BaseModel]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    todo = [root]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.add(model)
        for field in model.model_fields.values():
            for arg in _type_args(field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    todo.append(arg)
    return found


def _type_args(annotation: Any) -> list[Any]:
    args = [annotation]
    for arg in getattr(annotation, "__args__", ()):
        args.extend(_type_args(arg))
    return args


def test_every_field_has_a_description() -> None:
    models = _models(GangJob)
    assert GangJobSpec in models
    assert Condition in models
    missing = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert missing == []


def test_api_is_pure() -> None:
    code = (
        "import sys, api.v1alpha1, api.crd\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('controller', 'kubernetes_asyncio',"
        " 'agent', 'aiohttp')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_constants_need_only_the_standard_library() -> None:
    code = "import sys, api.constants\nassert 'pydantic' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
