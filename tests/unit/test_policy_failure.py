"""Unit tests of `controller.policy.failure` through `plan` (docs/design.md sections 3.6 and
4.1-4.4): only a worker at `status.epoch` fails the gang, and the failure policy's `FailJob`
rules and restart budget fail the job. Scenarios are replanned over their own outcome:
nothing repeats."""

from __future__ import annotations

from api.constants import ConditionType
from api.v1alpha1 import (
    FailureAction,
    Phase,
    RestartCounts,
)
from controller.policy.plan import EventSpec, PodStop, plan
from tests.unit.builders import make_job, make_node, make_pod
from tests.unit.gangs import (
    STAMP,
    condition,
    crashed,
    gang,
    observe,
    record,
    replan,
    running_status,
    worker,
)

# --- which failures count -------------------------------------------------------------------


def test_workers_below_the_epoch_are_restarting_not_failing() -> None:
    """After the bump to 1, the others' restarts (and the first crash itself) are expected."""
    status = running_status(1, last_restart=None).model_copy(update={"barrier_epoch": 0})
    pods = [
        crashed(worker(0, 0), 137),
        worker(1, 0, phase="Pending"),
        worker(2, 1),
    ]
    pods[1]["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
    result = plan(gang(status=status, pods=pods))
    assert result.status.epoch == 1
    # Ten minutes at a shut barrier is a stalled one (controller.policy.stuck); no failure.
    assert [e.reason for e in result.events] == ["BarrierStalled"]
    assert result.status.workers.arrived == 1


def test_a_fresh_pod_at_the_epoch_can_fail_it() -> None:
    status = running_status(2).model_copy(update={"barrier_epoch": 1})
    pods = [worker(0, 2), worker(1, None, created=2, phase="Failed", exit_code=4)]
    result = plan(gang(replicas=2, status=status, pods=pods))
    assert result.status.epoch == 3
    assert record(result).recreated == [1]  # a Failed pod cannot restart in place


def test_a_worker_above_the_epoch_is_not_counted_arrived_and_causes_nothing() -> None:
    pods = [worker(0, 0), crashed(worker(1, 1))]
    result = plan(gang(replicas=2, pods=pods))
    assert result.status.epoch == 0
    assert result.status.workers.arrived == 1


def test_a_worker_failing_while_deleted_is_no_failure() -> None:
    """Pods deleted (e.g. by suspend) end Failed; that is not the job failing."""
    result = plan(
        observe(make_job(replicas=2), [make_pod(0), make_pod(1, phase="Failed", terminating=True)])
    )
    assert result.status.phase is Phase.PENDING


# --- failing the job ------------------------------------------------------------------------


FAIL_ON_3 = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}


def test_a_non_retriable_exit_fails_the_job() -> None:
    pods = [make_pod(0), make_pod(1, phase="Failed", exit_code=3), make_pod(2, phase="Pending")]
    result = plan(observe(make_job(replicas=3, failurePolicy=FAIL_ON_3), pods))
    message = (
        "worker 1 (pod llama-1): container trainer exited with code 3 (Error); also PodFailed; "
        "spec.failurePolicy.rules[0] fails the job"
    )
    assert result.status.phase is Phase.FAILED
    assert result.status.completion_time == STAMP
    assert result.status.epoch == 0
    assert condition(result, ConditionType.FAILED) == ("True", "NonRetriableExitCode", message)
    assert result.events == [EventSpec("Warning", "Failed", message)]
    assert result.delete_pods == []
    assert result.stop_pods == [
        PodStop(name="llama-0", uid="uid-0", reason="JobFinished"),
        PodStop(name="llama-2", uid="uid-2", reason="JobFinished"),
    ]
    assert [(d.worker, d.action) for d in result.failures] == [(1, FailureAction.FAIL_JOB)]


def test_a_fail_job_rule_fails_the_job_whatever_else_failed() -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    pods = [crashed(worker(0, 0), 1), crashed(worker(1, 0), 42), worker(2, 0)]
    observed = gang(pods=pods, failurePolicy={"rules": rules})
    result = plan(observed)
    assert result.status.phase is Phase.FAILED
    assert result.status.epoch == 0
    assert condition(result, ConditionType.FAILED) == (
        "True",
        "NonRetriableExitCode",
        "worker 1 (pod llama-1): container trainer exited with code 42 (Error); "
        "spec.failurePolicy.rules[0] fails the job",
    )
    # The workers whose trainer ended end on their own; the one still running is stopped.
    assert [d.name for d in result.stop_pods] == ["llama-2"]
    assert result.delete_pods == []
    replan(observed, result)


def test_an_ignored_failure_changes_nothing() -> None:
    rules = [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [5]}}]
    observed = gang(
        pods=[worker(0, 0), crashed(worker(1, 0), 5)], replicas=2, failurePolicy={"rules": rules}
    )
    result = plan(observed)
    assert (result.status.epoch, result.status.phase, result.events) == (0, Phase.RUNNING, [])
    assert result.failures == []


def test_budget_exhausted() -> None:
    status = running_status(3, restarts=RestartCounts(total=3, counted=2))
    pods = [worker(0, 3), crashed(worker(1, 3))]
    observed = gang(replicas=2, status=status, pods=pods, restart={"maxRestarts": 2})
    result = plan(observed)
    assert result.status.phase is Phase.FAILED
    assert result.status.epoch == 3
    assert condition(result, ConditionType.FAILED) == (
        "True",
        "MaxRestartsExceeded",
        "2 counted restarts reached spec.restart.maxRestarts (2); last failure: "
        "worker 1 (pod llama-1): container trainer exited with code 1 (Error)",
    )
    replan(observed, result)


def test_an_uncounted_failure_restarts_past_the_budget() -> None:
    status = running_status(3, restarts=RestartCounts(total=3, counted=2))
    nodes = [make_node(), make_node("gone-soon", taints=("node.kubernetes.io/unreachable",))]
    pods = [worker(0, 3), worker(1, 3, node="gone-soon")]
    result = plan(
        gang(replicas=2, status=status, pods=pods, nodes=nodes, restart={"maxRestarts": 2})
    )
    assert (result.status.phase, result.status.epoch) == (Phase.RESTARTING, 4)
    assert result.status.restarts.counted == 2


def test_max_restarts_zero_fails_on_the_first_counted_failure() -> None:
    result = plan(gang(replicas=1, pods=[crashed(worker(0, 0))], restart={"maxRestarts": 0}))
    assert result.status.phase is Phase.FAILED
