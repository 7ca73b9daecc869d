"""Tests of controller.policy.classify: every failure signal of docs/design.md section 4 as a table,
the failure policy (first match wins, the defaults, counting), and the exit codes the kubelet may
restart in place."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.failures import FailureClass
from api.v1alpha1 import ExitCodeOperator, FailureAction, GangJob, RestartMode
from controller.policy import classify, podspec
from controller.policy.classify import Context, Failure
from controller.policy.views import NodeView, PodView
from tests.unit.builders import T0, make_job, make_node, make_pod

OPENED = T0 + timedelta(minutes=1)
"""When the barrier of epoch 2 opened, in these tests."""


def ctx(
    job: GangJob | None = None, *, barrier_open: bool = True, mode: RestartMode = RestartMode.POD
) -> Context:
    return Context.of(
        job or make_job(),
        mode,
        epoch=2,
        barrier_epoch=2 if barrier_open else 1,
        barrier_opened_at=OPENED,
    )


def pod(**changes: Any) -> dict[str, Any]:
    """Worker 1, arrived at epoch 2, Running on node-0."""
    return make_pod(1, epoch=2, **changes)


def trainer(obj: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = obj["status"]["containerStatuses"][0]
    return status


def terminated(code: int, reason: str = "Error", at: str | None = None) -> dict[str, Any]:
    detail: dict[str, Any] = {"exitCode": code, "reason": reason}
    if at is not None:
        detail["finishedAt"] = at
    return {"terminated": detail}


def condition(obj: dict[str, Any], type_: str, reason: str | None = None) -> dict[str, Any]:
    entry = {"type": type_, "status": "True"}
    if reason is not None:
        entry["reason"] = reason
    obj["status"]["conditions"].append(entry)
    return obj


def detect(
    obj: dict[str, Any], node: dict[str, Any] | None = None, context: Context | None = None
) -> Failure | None:
    view = PodView.from_pod(obj)
    node_view = NodeView.from_node(node if node is not None else make_node())
    return classify.detect(context or ctx(), 1, view, node_view)


def summary(failure: Failure | None) -> tuple[Any, ...] | None:
    if failure is None:
        return None
    return failure.failure_class, failure.exit_code, failure.in_place


# --- signals --------------------------------------------------------------------------------


def test_a_healthy_worker_has_no_failure() -> None:
    assert detect(pod()) is None


def test_trainer_exit_code() -> None:
    obj = pod()
    trainer(obj)["state"] = terminated(3)
    failure = detect(obj)
    assert summary(failure) == (FailureClass.PROCESS_EXIT, 3, True)
    assert failure is not None
    assert failure.container == "trainer"
    assert failure.detail == "container trainer exited with code 3 (Error)"


def test_trainer_oom_killed() -> None:
    obj = pod()
    trainer(obj)["state"] = terminated(137, "OOMKilled")
    assert summary(detect(obj)) == (FailureClass.OOM_KILLED, 137, True)


def test_trainer_exit_0_is_no_failure() -> None:
    obj = pod()
    trainer(obj)["state"] = terminated(0, "Completed")
    assert detect(obj) is None


def test_all_containers_restarting_has_no_exit_code() -> None:
    failure = detect(condition(pod(), "AllContainersRestarting"))
    assert summary(failure) == (FailureClass.PROCESS_EXIT, None, True)


def test_a_restart_the_protocol_caused_before_the_barrier_opened_is_no_failure() -> None:
    """The synthetic lastState of a KEP-5532 restart that brought the worker to epoch 2."""
    obj = pod()
    trainer(obj)["lastState"] = terminated(137, "RestartingAllContainers", "2026-05-01T10:00:59Z")
    assert detect(obj) is None


def test_a_restart_after_the_barrier_opened_is_a_failure_with_no_exit_code() -> None:
    """The durable trace of a missed AllContainersRestarting: the real code is lost."""
    obj = pod()
    trainer(obj)["lastState"] = terminated(137, "RestartingAllContainers", "2026-05-01T10:01:30Z")
    failure = detect(obj)
    assert summary(failure) == (FailureClass.PROCESS_EXIT, None, True)
    assert failure is not None
    assert "after the barrier opened" in failure.detail


def test_the_durable_trace_allows_for_clock_skew_and_needs_an_open_barrier() -> None:
    obj = pod()
    # One second after the barrier opened, by the node's clock: inside the margin.
    trainer(obj)["lastState"] = terminated(1, "Error", "2026-05-01T10:01:01Z")
    assert detect(obj) is None
    trainer(obj)["lastState"] = terminated(1, "Error", "2026-05-01T10:05:00Z")
    assert summary(detect(obj)) == (FailureClass.PROCESS_EXIT, 1, True)
    assert detect(obj, context=ctx(barrier_open=False)) is None


def test_a_sidecar_that_restarted_after_the_barrier_is_a_failure() -> None:
    """The agent restarted on its own: it will not rejoin the epoch it arrived at."""
    obj = pod()
    obj["status"]["initContainerStatuses"] = [
        {
            "name": "gangjob-agent",
            "state": {"running": {}},
            "lastState": terminated(2, "Error", "2026-05-01T10:04:00Z"),
        }
    ]
    failure = detect(obj)
    assert summary(failure) == (FailureClass.PROCESS_EXIT, 2, True)
    assert failure is not None
    assert failure.container == "gangjob-agent"


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        ("2:3", (FailureClass.PROCESS_EXIT, 3, True)),
        ("2:0", None),  # a success
        ("1:3", None),  # an exit at an older epoch was handled then
    ],
)
def test_process_mode_exit_report(report: str, expected: tuple[Any, ...] | None) -> None:
    obj = pod()
    obj["metadata"]["annotations"]["gangjob.io/exit"] = report
    assert summary(detect(obj, context=ctx(mode=RestartMode.PROCESS))) == expected


def test_pod_mode_agent_report_of_a_restart_is_a_failure_with_unknown_code() -> None:
    # The pod restarted in place at the gang's epoch while the controller was not looking: the
    # agent, back up and already arrived there, reports it (code unknown to the kubelet).
    obj = pod()
    obj["metadata"]["annotations"]["gangjob.io/exit"] = "2:-1"
    assert summary(detect(obj)) == (FailureClass.PROCESS_EXIT, None, True)
    obj["metadata"]["annotations"]["gangjob.io/exit"] = "1:-1"  # an older epoch: handled then
    assert detect(obj) is None


def test_process_mode_dead_agent_cannot_restart_in_place() -> None:
    obj = pod()
    trainer(obj)["state"] = terminated(1)
    failure = detect(obj, context=ctx(mode=RestartMode.PROCESS))
    assert summary(failure) == (FailureClass.PROCESS_EXIT, 1, False)


def test_pod_failed_with_the_trainers_code_is_an_exit_that_recreates() -> None:
    failure = detect(pod(phase="Failed", exit_code=5))
    assert summary(failure) == (FailureClass.PROCESS_EXIT, 5, False)
    assert failure is not None
    assert failure.detail == "container trainer exited with code 5 (Error); also PodFailed"


def test_pod_failed_without_a_trainer_code_is_pod_failed() -> None:
    obj = pod(phase="Failed")
    obj["status"]["containerStatuses"] = []
    obj["status"]["reason"] = "Evicted"
    obj["status"]["message"] = "low on memory"
    failure = detect(obj)
    assert summary(failure) == (FailureClass.POD_FAILED, None, False)
    assert failure is not None
    assert failure.detail == "pod Failed: Evicted: low on memory"


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("DeletionByTaintManager", FailureClass.DISRUPTION),
        ("DeletionByPodGC", FailureClass.DISRUPTION),
        ("TerminationByKubelet", FailureClass.DISRUPTION),
        ("EvictionByEvictionAPI", FailureClass.EVICTED),
        ("PreemptionByScheduler", FailureClass.PREEMPTED),
        ("DeletionByDeviceTaintManager", FailureClass.DEVICE_UNHEALTHY),
        ("SomethingNew", FailureClass.DISRUPTION),
    ],
)
def test_disruption_target_reasons(reason: str, expected: FailureClass) -> None:
    failure = detect(condition(pod(), "DisruptionTarget", reason))
    assert failure is not None
    assert failure.failure_class is expected
    assert failure.detail == f"pod condition DisruptionTarget ({reason})"


def test_a_disrupted_pod_being_deleted_is_still_disrupted_whatever_its_exits() -> None:
    obj = condition(pod(terminating=True), "DisruptionTarget", "EvictionByEvictionAPI")
    trainer(obj)["state"] = terminated(143)
    assert summary(detect(obj)) == (FailureClass.EVICTED, None, False)


def test_a_pod_deleted_by_someone_else_is_a_failure_once_the_barrier_is_open() -> None:
    obj = pod(terminating=True)
    trainer(obj)["state"] = terminated(143)  # its deletion killed it: not a ProcessExit
    assert summary(detect(obj)) == (FailureClass.POD_DELETED, None, False)
    assert detect(obj, context=ctx(barrier_open=False)) is None


def test_a_missing_pod_is_a_failure_once_the_barrier_is_open() -> None:
    assert summary(classify.missing(ctx(), 1)) == (FailureClass.POD_DELETED, None, False)
    assert classify.missing(ctx(barrier_open=False), 1) is None


@pytest.mark.parametrize(
    ("node", "detail"),
    [
        (make_node(ready="False"), "node node-0 is not Ready (False)"),
        (make_node(ready="Unknown"), "node node-0 is not Ready (Unknown)"),
        (
            make_node(taints=("node.kubernetes.io/unreachable",)),
            "node node-0 has taint node.kubernetes.io/unreachable",
        ),
        (
            make_node(taints=("node.kubernetes.io/not-ready",)),
            "node node-0 has taint node.kubernetes.io/not-ready",
        ),
        (
            make_node(taints=("node.kubernetes.io/out-of-service",)),
            "node node-0 has taint node.kubernetes.io/out-of-service",
        ),
    ],
)
def test_node_lost(node: dict[str, Any], detail: str) -> None:
    obj = pod()
    trainer(obj)["state"] = terminated(137)  # what the dying node did to it
    failure = detect(obj, node)
    assert failure is not None
    assert failure.failure_class is FailureClass.NODE_LOST
    assert failure.detail == detail + "; also ProcessExit"


def test_node_gone() -> None:
    failure = classify.detect(ctx(), 1, PodView.from_pod(pod()), None)
    assert failure is not None
    assert (failure.failure_class, failure.detail) == (
        FailureClass.NODE_LOST,
        "node node-0 is gone",
    )


def test_an_unscheduled_pod_has_no_node_to_lose() -> None:
    obj = pod(phase="Pending")
    del obj["spec"]["nodeName"]
    assert classify.detect(ctx(), 1, PodView.from_pod(obj), None) is None


def test_unhealthy_device() -> None:
    obj = pod()
    trainer(obj)["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g1", "health": "Unhealthy"}]}
    ]
    failure = detect(obj)
    assert failure is not None
    assert failure.failure_class is FailureClass.DEVICE_UNHEALTHY
    assert failure.detail == "device nvidia.com/gpu of container trainer is Unhealthy"
    assert failure.device_health == {"Unhealthy"}
    assert failure.node_name == "node-0"


def test_unknown_device_health_is_a_failure_only_if_a_rule_asks() -> None:
    obj = pod()
    trainer(obj)["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g1", "health": "Unknown"}]}
    ]
    assert detect(obj) is None
    job = make_job(failurePolicy={"rules": [{"action": "FailJob", "onDeviceHealth": "Unknown"}]})
    failure = detect(obj, context=ctx(job))
    assert failure is not None
    assert failure.failure_class is FailureClass.DEVICE_UNHEALTHY


def test_node_allocatable_below_capacity_of_a_requested_device() -> None:
    obj = pod()
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    short = make_node(allocatable={"nvidia.com/gpu": "7"}, capacity={"nvidia.com/gpu": "8"})
    failure = detect(obj, short)
    assert failure is not None
    assert failure.failure_class is FailureClass.DEVICE_UNHEALTHY
    assert failure.detail == "node node-0 has 7 of 8 nvidia.com/gpu allocatable"
    # A device the pod does not use is none of its business.
    del obj["spec"]["containers"][0]["resources"]
    assert detect(obj, short) is None


def test_node_condition_listed_in_a_rule() -> None:
    rules = [
        {
            "action": "RecreateWorker",
            "onNodeConditions": [{"type": "GpuXidError", "status": "True"}],
        }
    ]
    job = make_job(failurePolicy={"rules": rules})
    node = make_node(conditions={"GpuXidError": "True"})
    assert detect(pod(), node) is None  # no rule lists it: not our business
    failure = detect(pod(), node, ctx(job))
    assert failure is not None
    assert failure.failure_class is FailureClass.DEVICE_UNHEALTHY
    assert failure.detail == "node node-0 has condition GpuXidError=True"


def test_node_loss_explains_everything_else() -> None:
    obj = condition(pod(phase="Failed"), "DisruptionTarget", "DeletionByTaintManager")
    failure = detect(obj, make_node(taints=("node.kubernetes.io/unreachable",)))
    assert failure is not None
    assert failure.failure_class is FailureClass.NODE_LOST
    assert failure.detail.endswith("; also Disruption, ProcessExit, PodFailed")


# --- the node guards ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "allowed"),
    [
        (None, True),
        (make_node(taints=("node.kubernetes.io/unreachable",)), True),
        (make_node(ready="False", taints=("node.kubernetes.io/out-of-service",)), True),
        (make_node(ready="False"), False),  # the kubelet may still be running the pod
        (make_node(ready="False", taints=("node.kubernetes.io/not-ready",)), False),
        (make_node(taints=("node.kubernetes.io/out-of-service",)), False),  # Ready
        (make_node(), False),
    ],
)
def test_may_force_delete_on(node: dict[str, Any] | None, allowed: bool) -> None:
    view = None if node is None else NodeView.from_node(node)
    assert classify.may_force_delete_on(view) is allowed


# --- the policy -----------------------------------------------------------------------------


def failure(cls: FailureClass, **facts: Any) -> Failure:
    return Failure(worker=1, failure_class=cls, detail="x", **facts)


@pytest.mark.parametrize(
    ("cls", "action", "counted"),
    [
        (FailureClass.PROCESS_EXIT, FailureAction.RESTART_GANG, True),
        (FailureClass.OOM_KILLED, FailureAction.RESTART_GANG, True),
        (FailureClass.POD_FAILED, FailureAction.RECREATE_WORKER, True),
        (FailureClass.NODE_LOST, FailureAction.RECREATE_WORKER, False),
        (FailureClass.DEVICE_UNHEALTHY, FailureAction.RECREATE_WORKER, False),
        (FailureClass.DISRUPTION, FailureAction.RECREATE_WORKER, False),
        (FailureClass.EVICTED, FailureAction.RECREATE_WORKER, False),
        (FailureClass.PREEMPTED, FailureAction.RECREATE_WORKER, False),
        (FailureClass.POD_DELETED, FailureAction.RECREATE_WORKER, False),
        (FailureClass.BARRIER_TIMEOUT, FailureAction.RECREATE_WORKER, False),
    ],
)
def test_defaults(cls: FailureClass, action: FailureAction, counted: bool) -> None:
    decision = classify.decide(make_job(), failure(cls))
    assert (decision.action, decision.counted, decision.rule) == (action, counted, None)


RULES: list[dict[str, Any]] = [
    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3, 4]}},
    {
        "action": "Ignore",
        "onExitCodes": {"containerName": "logger", "operator": "In", "values": [1]},
    },
    {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "reason": "PreemptionByScheduler"}],
    },
    {
        "action": "RestartGang",
        "onPodConditions": [{"type": "DisruptionTarget"}],
        "countsTowardsMaxRestarts": True,
    },
    {"action": "RecreateWorker", "onDeviceHealth": "Unhealthy", "countsTowardsMaxRestarts": True},
    {"action": "Ignore", "onNodeConditions": [{"type": "GpuXidError", "status": "True"}]},
    {"action": "RecreateWorker", "onExitCodes": {"operator": "NotIn", "values": [1]}},
]
DISRUPTED = ("True", "EvictionByEvictionAPI")
PREEMPTED = ("True", "PreemptionByScheduler")


@pytest.mark.parametrize(
    ("facts", "rule", "action", "counted"),
    [
        ({"exit_codes": {"trainer": 3}}, 0, FailureAction.FAIL_JOB, True),
        # First match wins: the exit code comes before the condition.
        (
            {"exit_codes": {"trainer": 4}, "pod_conditions": {"DisruptionTarget": PREEMPTED}},
            0,
            FailureAction.FAIL_JOB,
            True,
        ),
        ({"exit_codes": {"logger": 1}}, 1, FailureAction.IGNORE, True),
        ({"pod_conditions": {"DisruptionTarget": PREEMPTED}}, 2, FailureAction.FAIL_JOB, False),
        # Without a reason the matcher takes any; the rule's counting overrides the default.
        ({"pod_conditions": {"DisruptionTarget": DISRUPTED}}, 3, FailureAction.RESTART_GANG, True),
        # Status defaults to True.
        ({"pod_conditions": {"DisruptionTarget": ("False", None)}}, None, None, None),
        ({"device_health": frozenset({"Unhealthy"})}, 4, FailureAction.RECREATE_WORKER, True),
        ({"device_health": frozenset({"Unknown"})}, None, None, None),
        ({"node_conditions": {"GpuXidError": "True"}}, 5, FailureAction.IGNORE, False),
        ({"node_conditions": {"GpuXidError": "False"}}, None, None, None),
        # NotIn: neither the values nor 0.
        ({"exit_codes": {"trainer": 2}}, 6, FailureAction.RECREATE_WORKER, True),
        ({"exit_codes": {"trainer": 1}}, None, None, None),
        ({"exit_codes": {"trainer": 0}}, None, None, None),
    ],
)
def test_rules_first_match_wins(
    facts: dict[str, Any], rule: int | None, action: FailureAction | None, counted: bool | None
) -> None:
    job = make_job(failurePolicy={"rules": RULES})
    cls = FailureClass.EVICTED if "pod_conditions" in facts else FailureClass.NODE_LOST
    if "exit_codes" in facts:
        cls = FailureClass.PROCESS_EXIT
    decision = classify.decide(job, failure(cls, **facts))
    if rule is None:
        assert decision.rule is None
        assert (decision.action, decision.counted) == classify.default_decision(cls)
    else:
        assert (decision.rule, decision.action, decision.counted) == (rule, action, counted)
        assert decision.by_exit_code == ("exit_codes" in facts)


def test_an_unknown_exit_code_matches_no_exit_code_rule() -> None:
    """AllContainersRestarting: the kubelet restarted for a retriable code, by construction."""
    job = make_job(failurePolicy={"rules": RULES})
    decision = classify.decide(job, failure(FailureClass.PROCESS_EXIT))
    assert (decision.action, decision.counted, decision.rule) == (
        FailureAction.RESTART_GANG,
        True,
        None,
    )


# --- retriable exit codes -------------------------------------------------------------------


def test_retriable_exit_codes_default_is_every_failure() -> None:
    assert classify.retriable_exit_codes(make_job()) == (ExitCodeOperator.NOT_IN, [0])


def test_retriable_exit_codes_leave_out_what_the_policy_sends_elsewhere() -> None:
    job = make_job(failurePolicy={"rules": RULES})
    # 3, 4 FailJob; every code but 1 RecreateWorker (rule 6); the logger's rule is not the
    # trainer's; conditions/devices/nodes cannot be known when the container exits.
    assert classify.retriable_exit_codes(job) == (ExitCodeOperator.IN, [1])


def test_retriable_exit_codes_none_when_no_code_restarts() -> None:
    rules = [
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [7]}},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [7]}},
    ]
    job = make_job(failurePolicy={"rules": rules})
    assert classify.retriable_exit_codes(job) is None


EXIT_CODE_RULES = st.lists(
    st.fixed_dictionaries(
        {
            "action": st.sampled_from([a.value for a in FailureAction]),
            "onExitCodes": st.fixed_dictionaries(
                {
                    "operator": st.sampled_from(["In", "NotIn"]),
                    "values": st.sets(st.integers(1, 255), min_size=1, max_size=6).map(sorted),
                }
            ),
        }
    ),
    max_size=4,
)


@given(EXIT_CODE_RULES)
def test_retriable_exit_codes_are_exactly_the_restart_gang_codes(
    rules: list[dict[str, Any]],
) -> None:
    job = make_job(failurePolicy={"rules": rules})
    result = classify.retriable_exit_codes(job)
    decided = {
        code
        for code in range(1, 256)
        if classify.decide(
            job, failure(FailureClass.PROCESS_EXIT, exit_codes={"trainer": code})
        ).action
        is FailureAction.RESTART_GANG
    }
    if result is None:
        assert decided == set()
        return
    operator, values = result
    assert len(values) <= 255
    matched = {
        code for code in range(0, 256) if (code in values) == (operator is ExitCodeOperator.IN)
    }
    assert matched == decided
    # podspec builds the kubelet's rule the same way.
    rule = podspec.trainer_restart_rule(job)
    assert rule is not None
    assert rule["exitCodes"] == {"operator": operator.value, "values": values}


def test_a_node_with_no_ready_condition_yet_is_not_lost() -> None:
    """A node just registered (or the cache's copy from before its kubelet's first status):
    the scheduler bound a pod to it, so it is Ready by now; a failure it does not show. Its
    loss comes once the node lifecycle controller marks it Unknown, or with a taint."""
    bare = make_node()
    bare["status"]["conditions"] = []
    obj = pod()
    assert detect(obj, bare) is None
    assert NodeView.from_node(bare).ready == "Unreported"
    bare["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    failure = detect(obj, bare)
    assert failure is not None
    assert failure.failure_class is FailureClass.NODE_LOST
