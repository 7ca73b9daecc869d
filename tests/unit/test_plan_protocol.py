"""Unit tests of the restart protocol in controller.policy.plan (DESIGN.md sections 3-4), as tables:
the epoch bump and its record, the barrier, recreated workers and avoided nodes, the failure
policy's FailJob and budget, backoff timing, history cap, force-delete guards, barrier timeout,
and the mode fallback. Every scenario is also replanned over its own outcome: nothing repeats."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from api.constants import HISTORY_LIMIT, ConditionType
from api.v1alpha1 import (
    FailureAction,
    GangJobStatus,
    Phase,
    RestartCounts,
    RestartMode,
    RestartRecord,
    RestartTrigger,
    dump_status,
)
from controller.policy.lifecycle import finish_pod
from controller.policy.plan import (
    EventSpec,
    Observed,
    Plan,
    PodDelete,
    plan,
)
from controller.policy.recreate import ranks_text
from controller.policy.views import NodeView
from tests.unit.builders import T0, TEMPLATE, make_job, make_node, make_pod, with_status
from tests.unit.test_plan import carry_out, condition, names, observe

NOW = T0 + timedelta(minutes=10)


def worker(rank: int, epoch: int | None, *, created: int = 0, **kw: Any) -> dict[str, Any]:
    """A worker pod arrived at `epoch` (None: not yet), created at `created`."""
    pod = make_pod(rank, epoch=epoch, **kw)
    pod["metadata"]["annotations"]["gangjob.io/created-epoch"] = str(created)
    return pod


def crashed(pod: dict[str, Any], code: int = 1) -> dict[str, Any]:
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": code, "reason": "Error"}
    }
    return pod


def running_status(epoch: int = 0, **update: Any) -> GangJobStatus:
    """A gang running at `epoch`, its barrier open since T0."""
    return GangJobStatus(
        phase=Phase.RUNNING,
        epoch=epoch,
        barrier_epoch=epoch,
        barrier_opened_at=T0,
        start_time=T0,
        mode=RestartMode.POD,
        **update,
    )


def gang(
    replicas: int = 3,
    status: GangJobStatus | None = None,
    pods: Sequence[dict[str, Any]] | None = None,
    *,
    now: datetime = NOW,
    nodes: Sequence[dict[str, Any]] = (make_node(),),
    **spec: Any,
) -> Observed:
    status = status or running_status()
    job = with_status(make_job(replicas=replicas, **spec), status)
    if pods is None:
        pods = [worker(r, status.epoch) for r in range(replicas)]
    return observe(job, pods, now=now, nodes=nodes)


def replan(observed: Observed, result: Plan) -> Plan:
    """Plan again over the outcome: it must repeat nothing."""
    again = plan(carry_out(observed, result))
    assert again.status == result.status
    assert again.events == []
    assert again.create_pods == []
    assert again.restart_started is None
    assert again.restart_finished is None
    assert again.failures == []
    return again


def record(result: Plan) -> RestartRecord:
    assert result.status.last_restart is not None
    return result.status.last_restart


# --- a restart ------------------------------------------------------------------------------


def test_a_crash_restarts_the_gang_in_place_at_the_next_epoch() -> None:
    pods = [worker(0, 0), crashed(worker(1, 0), 7), worker(2, 0)]
    observed = gang(pods=pods)
    result = plan(observed)
    status = result.status
    assert status.epoch == 1
    assert status.barrier_epoch == 0
    assert status.phase is Phase.RESTARTING
    assert status.restarts == RestartCounts(total=1, counted=1, in_place=1, recreated_workers=0)
    assert record(result) == RestartRecord(
        epoch=1,
        trigger=RestartTrigger(
            worker=1,
            failure_class="ProcessExit",
            detail="container trainer exited with code 7 (Error)",
            action=FailureAction.RESTART_GANG,
        ),
        detected_at=NOW,
        recreated=[],
        counted=True,
    )
    assert result.restart_started == record(result)
    message = (
        "Restarting the gang at epoch 1: worker 1 (pod llama-1) ProcessExit: "
        "container trainer exited with code 7 (Error)"
    )
    assert condition(result, ConditionType.RESTARTING) == ("True", "ProcessExit", message)
    assert result.events == [EventSpec("Warning", "GangRestarting", message)]
    assert result.delete_pods == []
    assert result.create_pods == []
    assert [(d.worker, d.failure_class, d.action, d.counted) for d in result.failures] == [
        (1, "ProcessExit", FailureAction.RESTART_GANG, True)
    ]
    assert status.workers.arrived == 0  # nobody is at epoch 1 yet
    replan(observed, result)


def test_three_workers_crashing_at_once_make_one_bump_named_after_the_lowest_rank() -> None:
    pods = [worker(0, 0), crashed(worker(1, 0), 3), crashed(worker(2, 0), 9)]
    pods[0]["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
    observed = gang(pods=pods)
    result = plan(observed)
    assert result.status.epoch == 1
    assert result.status.restarts.total == 1
    trigger = record(result).trigger
    assert (trigger.worker, trigger.detail) == (
        0,
        "pod condition AllContainersRestarting (exit code unknown) (3 workers failed)",
    )
    assert len(result.failures) == 3
    replan(observed, result)


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
    assert result.events == []
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


# --- the barrier ----------------------------------------------------------------------------


def restarting_status(
    epoch: int = 1, detected: datetime = NOW - timedelta(seconds=3)
) -> GangJobStatus:
    trigger = RestartTrigger(
        worker=1, failure_class="ProcessExit", detail="x", action=FailureAction.RESTART_GANG
    )
    last = RestartRecord(epoch=epoch, trigger=trigger, detected_at=detected, counted=True)
    return running_status(epoch).model_copy(
        update={
            "phase": Phase.RESTARTING,
            "barrier_epoch": epoch - 1,
            "last_restart": last,
            "restarts": RestartCounts(total=epoch, counted=epoch, in_place=epoch),
        }
    )


def test_the_barrier_opens_when_every_worker_has_arrived() -> None:
    observed = gang(status=restarting_status(), pods=[worker(r, 1) for r in range(3)])
    result = plan(observed)
    status = result.status
    assert (status.epoch, status.barrier_epoch, status.barrier_opened_at) == (1, 1, NOW)
    done = record(result)
    assert (done.barrier_open_at, done.duration_seconds) == (NOW, 3.0)
    assert status.history == [done]
    assert result.restart_finished == done
    assert status.phase is Phase.RUNNING
    message = (
        "Every worker arrived at epoch 1: the gang restarted in 3.00s "
        "(trigger: worker 1 (pod llama-1) ProcessExit)"
    )
    assert condition(result, ConditionType.RESTARTING) == ("False", "BarrierOpen", message)
    assert result.events == [EventSpec("Normal", "GangRestarted", message)]
    assert status.workers.arrived == 3
    replan(observed, result)


def test_the_first_barrier_opens_without_a_restart_record() -> None:
    status = GangJobStatus(start_time=T0, mode=RestartMode.POD)
    result = plan(gang(status=status, pods=[worker(r, 0) for r in range(3)]))
    assert (result.status.barrier_epoch, result.status.barrier_opened_at) == (0, NOW)
    assert result.status.last_restart is None
    assert result.events == []


@pytest.mark.parametrize(
    "pods",
    [
        [worker(0, 1), worker(1, 1)],  # rank 2 missing
        [worker(0, 1), worker(1, 1), worker(2, 0)],  # rank 2 below
        [worker(0, 1), worker(1, 1), worker(2, None, created=1)],  # rank 2 not arrived
        [worker(0, 1), worker(1, 1), worker(2, 1, terminating=True)],  # rank 2 going
        [worker(0, 1), worker(1, 1), worker(2, 1, name="llama-x")],  # a stray is no worker
    ],
)
def test_the_barrier_never_opens_with_a_worker_missing_or_below(pods: list[dict[str, Any]]) -> None:
    result = plan(gang(status=restarting_status(), pods=pods))
    assert result.status.barrier_epoch == 0
    assert result.status.phase is Phase.RESTARTING
    assert result.restart_finished is None


def test_a_missing_worker_before_the_barrier_is_just_created() -> None:
    result = plan(gang(status=restarting_status(), pods=[worker(0, 1), worker(1, 1)]))
    assert result.status.epoch == 1
    assert names(result) == ["llama-2"]
    assert result.create_pods[0]["metadata"]["annotations"]["gangjob.io/created-epoch"] == "1"


def test_a_missing_worker_after_the_barrier_restarts_the_gang_and_is_recreated() -> None:
    observed = gang(pods=[worker(0, 0), worker(1, 0)])
    result = plan(observed)
    assert result.status.epoch == 1
    assert record(result).trigger.failure_class == "PodDeleted"
    assert record(result).recreated == [2]
    assert result.status.restarts == RestartCounts(total=1, recreated_workers=1)
    assert names(result) == ["llama-2"]
    assert result.create_pods[0]["metadata"]["annotations"]["gangjob.io/created-epoch"] == "1"
    replan(observed, result)


# --- recreating workers ---------------------------------------------------------------------


def test_a_lost_node_recreates_its_worker_and_restarts_the_others_in_place() -> None:
    pods = [worker(0, 0), worker(1, 0, node="node-1"), worker(2, 0)]
    nodes = [
        make_node(),
        make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",)),
    ]
    observed = gang(pods=pods, nodes=nodes)
    result = plan(observed)
    assert result.status.epoch == 1
    assert record(result).trigger.failure_class == "NodeLost"
    assert record(result).counted is None  # infrastructure: not against the budget
    assert result.status.restarts == RestartCounts(total=1, recreated_workers=1)
    assert result.delete_pods == [PodDelete(name="llama-1", uid="uid-1", reason="WorkerRecreated")]
    replan(observed, result)


def test_an_unhealthy_device_recreates_its_worker_off_that_node() -> None:
    pods = [worker(0, 0), worker(1, 0, node="gpu-7")]
    pods[1]["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g", "health": "Unhealthy"}]}
    ]
    observed = gang(replicas=2, pods=pods, nodes=[make_node(), make_node("gpu-7")])
    result = plan(observed)
    assert result.status.avoid_nodes == ["gpu-7"]
    assert record(result).recreated == [1]
    # Once the old pod is gone, the new one is created at the new epoch, off gpu-7.
    after = carry_out(observed, result)
    after = Observed(
        job=after.job,
        pods=[p for p in after.pods if p.name != "llama-1"],
        nodes=after.nodes,
        service_exists=True,
        now=after.now,
    )
    created = plan(after).create_pods
    assert [p["metadata"]["name"] for p in created] == ["llama-1"]
    terms = created[0]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-7"]}
            ]
        }
    ]
    assert created[0]["metadata"]["annotations"]["gangjob.io/created-epoch"] == "1"


def test_the_avoided_nodes_join_every_node_selector_term_of_the_template() -> None:
    pod = {
        "metadata": {},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["n"]}
                                ]
                            },
                        ]
                    }
                }
            }
        },
    }
    finished = finish_pod(pod, RestartMode.PROCESS, ["bad"])
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad"]}
    terms = finished["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1] for t in terms] == [avoid, avoid]
    assert "matchFields" in terms[1]
    assert finished["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Process"


def test_recreate_mode_recreates_every_worker() -> None:
    pods = [worker(0, 0), crashed(worker(1, 0)), worker(2, 0)]
    status = running_status().model_copy(update={"mode": RestartMode.RECREATE})
    observed = gang(pods=pods, status=status, restart={"mode": "Recreate"})
    result = plan(observed)
    assert record(result).recreated_all
    assert record(result).recreated_ranks(3) == [0, 1, 2]
    assert [d.name for d in result.delete_pods] == ["llama-0", "llama-1", "llama-2"]
    assert result.status.restarts == RestartCounts(total=1, counted=1, recreated_workers=3)
    replan(observed, result)


def test_a_recreate_of_a_large_gang_keeps_the_status_small() -> None:
    # Every agent watches the GangJob and receives the whole object on every write: 5000 ranks
    # listed in the record and in the condition made it ~58 KB, decoded 5000 times per write.
    n = 5000
    pods = [worker(r, 0) for r in range(n)]
    crashed(pods[7])
    status = running_status().model_copy(update={"mode": RestartMode.RECREATE})
    observed = gang(n, pods=pods, status=status, restart={"mode": "Recreate"})
    result = plan(observed)

    assert len(result.delete_pods) == n
    assert record(result).recreated_ranks(n) == list(range(n))
    restarting = condition(result, ConditionType.RESTARTING)
    assert restarting is not None
    assert "recreating all 5000 workers" in restarting[2]
    assert len(json.dumps(dump_status(result.status))) < 2048
    # A delete not yet seen is asked again, from the status alone.
    assert len(plan(carry_out(observed, result, deletions=False)).delete_pods) == n


def test_a_message_names_the_first_recreated_ranks_and_counts_the_rest() -> None:
    assert ranks_text({3}, 8) == "worker(s) [3]"
    assert ranks_text(set(range(2, 20)), 40) == (
        "worker(s) [2, 3, 4, 5, 6, 7, 8, 9, 10, 11] and 8 more"
    )
    assert ranks_text(set(range(40)), 40) == "all 40 workers"


def test_a_worker_below_the_epoch_that_cannot_restart_in_place_is_recreated_without_a_bump() -> (
    None
):
    pods = [worker(0, 1), worker(1, 1), worker(2, 0, node="node-1")]
    nodes = [make_node(), make_node("node-1", ready="False")]
    observed = gang(status=restarting_status(), pods=pods, nodes=nodes)
    result = plan(observed)
    assert result.status.epoch == 1
    assert record(result).recreated == [2]
    assert result.status.restarts.recreated_workers == 1
    assert [d.name for d in result.delete_pods] == ["llama-2"]
    assert result.events[0].reason == "WorkerRecreated"
    replan(observed, result)


def test_barrier_timeout_recreates_the_laggard_without_a_bump() -> None:
    status = restarting_status(detected=NOW - timedelta(seconds=100))
    pods = [worker(0, 1), worker(1, 1), worker(2, 0)]
    waiting = plan(gang(status=status, pods=pods, restart={"barrierTimeoutSeconds": 130}))
    assert waiting.delete_pods == []
    assert waiting.requeue_after == 30
    observed = gang(status=status, pods=pods, restart={"barrierTimeoutSeconds": 100})
    result = plan(observed)
    assert result.status.epoch == 1
    assert [d.name for d in result.delete_pods] == ["llama-2"]
    assert [(d.worker, d.failure_class, d.action, d.counted) for d in result.failures] == [
        (2, "BarrierTimeout", FailureAction.RECREATE_WORKER, False)
    ]
    replan(observed, result)


# --- failing the job ------------------------------------------------------------------------


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
    assert [d.name for d in result.delete_pods] == ["llama-0", "llama-1", "llama-2"]
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


# --- backoff --------------------------------------------------------------------------------


def finished_record(
    epoch: int, detected: datetime, opened: datetime, counted: bool = True
) -> RestartRecord:
    trigger = RestartTrigger(failure_class="ProcessExit", action=FailureAction.RESTART_GANG)
    return RestartRecord(
        epoch=epoch,
        trigger=trigger,
        detected_at=detected,
        barrier_open_at=opened,
        duration_seconds=(opened - detected).total_seconds(),
        counted=counted or None,
    )


@pytest.mark.parametrize(
    ("history", "since_open", "wait"),
    [
        ([], 5, 5.0),  # first restart: 10 s after the start
        ([(True, 20)], 5, 15.0),  # second in a row: 20 s after the barrier opened
        ([(True, 20), (True, 20)], 5, 35.0),  # third: 40 s
        ([(True, 20)] * 9, 5, 295.0),  # capped at 300 s
        ([(False, 20), (True, 20)], 5, 15.0),
        ([(True, 20), (False, 20)], 5, 5.0),  # an uncounted restart ends the run
        ([(True, 20)], 700, 0.0),  # ran undisturbed long enough: the run starts afresh
    ],
)
def test_backoff(history: list[tuple[bool, int]], since_open: int, wait: float) -> None:
    records = []
    t = T0
    for epoch, (counted, gap) in enumerate(history, start=1):
        detected = t + timedelta(seconds=gap)
        t = detected + timedelta(seconds=1)
        records.append(finished_record(epoch, detected, t, counted))
    epoch = len(records)
    status = running_status(
        epoch, history=records[-HISTORY_LIMIT:], last_restart=records[-1] if records else None
    ).model_copy(update={"barrier_opened_at": t})
    now = t + timedelta(seconds=since_open)
    pods = [worker(0, epoch), crashed(worker(1, epoch))]
    if not records:
        status = status.model_copy(update={"start_time": t, "barrier_opened_at": t})
    observed = gang(replicas=2, status=status, pods=pods, now=now, restart={"backoffSeconds": 10})
    result = plan(observed)
    if wait:
        assert result.status.epoch == epoch
        assert result.requeue_after == pytest.approx(wait)
        assert result.events == []
        assert result.status == plan(carry_out(observed, result)).status
    else:
        assert result.status.epoch == epoch + 1


def test_backoff_holds_the_barrier_over_a_waiting_failure() -> None:
    """A worker that restarted before the barrier of its epoch opened does not rejoin it."""
    status = restarting_status(detected=NOW - timedelta(seconds=1))
    pods = [worker(0, 1), worker(1, 1)]
    pods[1]["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
    result = plan(gang(replicas=2, status=status, pods=pods, restart={"backoffSeconds": 30}))
    assert result.status.epoch == 1
    assert result.status.barrier_epoch == 0
    assert result.requeue_after is not None
    assert result.requeue_after > 0


# --- history --------------------------------------------------------------------------------


def test_history_keeps_the_last_restarts_oldest_dropped() -> None:
    records = [
        finished_record(e, T0 + timedelta(seconds=e), T0 + timedelta(seconds=e, milliseconds=500))
        for e in range(1, HISTORY_LIMIT + 1)
    ]
    status = restarting_status(HISTORY_LIMIT + 1).model_copy(update={"history": records})
    result = plan(gang(status=status, pods=[worker(r, HISTORY_LIMIT + 1) for r in range(3)]))
    history = result.status.history
    assert len(history) == HISTORY_LIMIT
    assert [r.epoch for r in history] == list(range(2, HISTORY_LIMIT + 2))
    assert history[-1] == record(result)


def test_a_restart_superseded_before_its_barrier_stays_in_the_history() -> None:
    status = restarting_status()
    pods = [worker(0, 1), crashed(worker(1, 1)), worker(2, 0)]
    result = plan(gang(status=status, pods=pods))
    assert result.status.epoch == 2
    assert [(r.epoch, r.barrier_open_at) for r in result.status.history] == [(1, None)]


# --- force delete ---------------------------------------------------------------------------


UNREACHABLE = make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",))


@pytest.mark.parametrize(
    ("node", "age", "spec", "forced", "requeue"),
    [
        (UNREACHABLE, 60, {}, True, None),
        (UNREACHABLE, 59, {}, False, 1),
        (None, 60, {}, True, None),  # node gone
        (
            make_node("node-1", ready="False", taints=("node.kubernetes.io/out-of-service",)),
            60,
            {},
            True,
            None,
        ),
        (make_node("node-1", ready="False"), 600, {}, False, None),
        (make_node("node-1"), 600, {}, False, None),
        (UNREACHABLE, 600, {"nodeLoss": {"forceDelete": False}}, False, None),
        (UNREACHABLE, 10, {"nodeLoss": {"forceDeleteAfterSeconds": 10}}, True, None),
    ],
)
def test_force_delete_guards(
    node: dict[str, Any] | None, age: int, spec: dict[str, Any], forced: bool, requeue: float | None
) -> None:
    status = restarting_status()
    doomed = worker(1, 0, node="node-1", terminating=True)
    now = T0 + timedelta(seconds=age)  # the pod's deletionTimestamp is T0
    nodes = [make_node()] + ([node] if node is not None else [])
    observed = gang(
        replicas=2, status=status, pods=[worker(0, 1), doomed], nodes=nodes, now=now, **spec
    )
    result = plan(observed)
    force = PodDelete(
        name="llama-1", uid="uid-1", grace_seconds=0, mark_failed=True, reason="ForceDeleted"
    )
    assert result.delete_pods == ([force] if forced else [])
    if requeue is not None:
        assert result.requeue_after == requeue


def test_a_worker_on_a_lost_node_is_deleted_normally_first() -> None:
    pods = [worker(0, 0), worker(1, 0, node="node-1")]
    result = plan(gang(replicas=2, pods=pods, nodes=[make_node(), UNREACHABLE]))
    assert result.delete_pods == [PodDelete(name="llama-1", uid="uid-1", reason="WorkerRecreated")]


# --- mode fallback --------------------------------------------------------------------------


def new_gang(nodes: Sequence[dict[str, Any]], **spec: Any) -> Observed:
    return gang(replicas=2, status=GangJobStatus(), pods=[], nodes=nodes, **spec)


def test_pod_mode_when_a_ready_node_declares_the_feature() -> None:
    result = plan(new_gang([make_node("old", features=()), make_node()]))
    assert result.status.mode is RestartMode.POD
    assert condition(result, ConditionType.MODE_DEGRADED) is None
    assert result.create_pods[0]["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Pod"


def test_only_the_nodes_the_template_selects_decide_the_mode() -> None:
    # A mixed cluster: the declaring node is not one the template's nodeSelector allows.
    other = make_node("cpu-pool", labels={"pool": "cpu"})
    result = plan(new_gang([other, make_node("gpu-old", features=())]))
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[1] == "NodesLackRestartAllContainers"
    # ... and a selected node that declares it keeps Pod mode.
    result = plan(new_gang([other, make_node("gpu-new")]))
    assert result.status.mode is RestartMode.POD


def test_process_mode_when_no_ready_node_declares_the_feature() -> None:
    observed = new_gang([make_node("old", features=()), make_node(ready="False")])
    result = plan(observed)
    message = (
        "No Ready node the workers may run on declares RestartAllContainersOnContainerExits "
        "(KEP-5532): a Pod-mode worker could not be scheduled: restart mode Pod falls back to "
        "Process"
    )
    assert result.status.mode is RestartMode.PROCESS
    assert condition(result, ConditionType.MODE_DEGRADED) == (
        "True",
        "NodesLackRestartAllContainers",
        message,
    )
    assert EventSpec("Warning", "NodesLackRestartAllContainers", message) in result.events
    pod = result.create_pods[0]
    assert pod["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Process"
    assert pod["spec"]["containers"][0]["command"][:4] == [
        "python3",
        "/gangjob/agent.pyz",
        "wrap",
        "--",
    ]
    # The fallback holds while the gang exists, even once a node declares the feature.
    after = carry_out(observed, result)
    nodes = {"n": NodeView.from_node(make_node("n"))}
    later = plan(Observed(after.job, after.pods, nodes, True, after.now))
    assert later.status.mode is RestartMode.PROCESS
    assert later.events == []
    assert later.delete_pods == []


def test_recreate_mode_when_process_mode_cannot_wrap_the_trainer() -> None:
    observed = new_gang([make_node(features=())])
    job = observed.job
    template = job.spec.template
    del template["spec"]["containers"][0]["command"]
    result = plan(observed)
    assert result.status.mode is RestartMode.RECREATE
    degraded = condition(result, ConditionType.MODE_DEGRADED)
    assert degraded is not None
    assert degraded[2].endswith("falls back to Recreate")


def test_rules_dropped_by_the_apiserver_fall_back_and_replace_the_pods() -> None:
    observed = new_gang([make_node()])
    created = plan(observed)
    assert created.status.mode is RestartMode.POD
    # The apiserver stripped every restartPolicyRules from what was created.
    for pod in created.create_pods:
        for key in ("initContainers", "containers"):
            for container in pod["spec"].get(key, []):
                container.pop("restartPolicyRules", None)
    after = carry_out(observed, created)
    result = plan(after)
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[:2] == ("True", "RestartRulesDropped")
    assert sorted(d.name for d in result.delete_pods) == ["llama-0", "llama-1"]
    assert {d.reason for d in result.delete_pods} == {"RestartModeChanged"}
    # Sticky: with the pods gone and nodes that declare the feature, Process it stays.
    gone = plan(Observed(with_status(after.job, result.status), [], after.nodes, True, after.now))
    assert gone.status.mode is RestartMode.PROCESS
    assert [p["metadata"]["annotations"]["gangjob.io/restart-mode"] for p in gone.create_pods] == [
        "Process",
        "Process",
    ]


def test_modes_other_than_pod_need_no_feature() -> None:
    for mode in ("Process", "Recreate"):
        result = plan(new_gang([make_node(features=())], restart={"mode": mode}))
        assert result.status.mode == mode
        assert condition(result, ConditionType.MODE_DEGRADED) is None


def test_an_invalid_template_is_reported_once_and_creates_nothing() -> None:
    observed = new_gang([make_node()], restart={"mode": "Process"})
    del observed.job.spec.template["spec"]["containers"][0]["command"]
    result = plan(observed)
    assert result.create_pods == []
    ready = condition(result, ConditionType.READY)
    assert ready is not None
    assert ready[:2] == ("False", "TrainerCommandRequired")
    assert [e.reason for e in result.events] == ["TrainerCommandRequired"]
    assert plan(carry_out(observed, result)).events == []


def test_the_required_node_affinity_of_the_template_decides_the_mode_too() -> None:
    # Only the old pool may take the workers (affinity, no nodeSelector): Pod mode cannot be
    # scheduled even though another node declares the feature.
    old = make_node("gpu-old", features=(), labels={"pool": "old"})
    new = make_node("gpu-new", labels={"pool": "new"})
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["old"]}]}
                ]
            }
        }
    }
    template = copy.deepcopy(TEMPLATE)
    template["spec"].pop("nodeSelector")
    template["spec"]["affinity"] = affinity
    result = plan(new_gang([old, new], template=template))
    assert result.status.mode is RestartMode.PROCESS
    reason = condition(result, ConditionType.MODE_DEGRADED)
    assert reason is not None
    assert reason[1] == "NodesLackRestartAllContainers"
    # Allow the new pool as well: it declares the feature, so Pod mode holds.
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["old", "new"]
    result = plan(new_gang([old, new], template=template))
    assert result.status.mode is RestartMode.POD
