"""Whole-gang preemption through `plan` (docs/scheduling.md): where the cluster keeps a
PodGroup's `disruptionMode`, the gang's PodGroup asks to be preempted only whole, with the
template's priority class; a gang the scheduler preempted is one restart of class `Preempted`,
not counted, every worker recreated to wait, and start, whole."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api.constants import ConditionType
from controller.policy.plan import PlanConfig, plan
from tests.unit.builders import TEMPLATE, make_job
from tests.unit.gangs import (
    GANG_NOW,
    condition,
    gang,
    observe,
    record,
    replan,
    restarting_status,
    worker,
)

WHOLE = PlanConfig(pod_groups_served=True, pod_group_disruption_served=True)
PARTIAL = PlanConfig(pod_groups_served=True, pod_group_disruption_served=False)
LOW = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "priorityClassName": "low"}}


def test_the_pod_group_asks_for_whole_disruption_with_the_priority_class() -> None:
    result = plan(observe(make_job(replicas=3, template=LOW)), WHOLE)
    assert result.create_pod_group is not None
    assert result.create_workload is not None
    for spec in (
        result.create_pod_group["spec"],
        result.create_workload["spec"]["podGroupTemplates"][0],
    ):
        assert spec["disruptionMode"] == "PodGroup"
        assert spec["priorityClassName"] == "low"
    found = condition(result, ConditionType.GANG_SCHEDULING)
    assert found is not None
    assert found[2].endswith("; preempted only whole (priority class low)")


def test_without_a_priority_class_the_group_is_still_disrupted_whole() -> None:
    result = plan(observe(make_job(replicas=3)), WHOLE)
    assert result.create_pod_group is not None
    assert result.create_pod_group["spec"]["disruptionMode"] == "PodGroup"
    assert "priorityClassName" not in result.create_pod_group["spec"]


def test_where_the_cluster_drops_the_mode_the_condition_says_so() -> None:
    result = plan(observe(make_job(replicas=3, template=LOW)), PARTIAL)
    assert result.create_pod_group is not None
    assert "disruptionMode" not in result.create_pod_group["spec"]
    found = condition(result, ConditionType.GANG_SCHEDULING)
    assert found is not None
    assert found[0] == "True"
    assert "feature gate WorkloadAwarePreemption" in found[2]


def preempted(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-05-01T10:09:00Z"
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    return pod


def test_a_gang_preempted_whole_is_one_uncounted_restart_recreating_every_worker() -> None:
    observed = gang(replicas=3, pods=[preempted(worker(r, 0)) for r in range(3)], template=LOW)
    result = plan(observed, WHOLE)
    last = record(result)
    assert last.trigger.failure_class == "Preempted"
    assert "PreemptionByScheduler" in (last.trigger.detail or "")
    assert not last.counted
    assert result.status.restarts.counted == 0
    assert last.recreated_all  # every worker, said once
    # Their pods are still terminating: the new ones wait for the names, then for the gang.
    assert result.create_pods == []
    replan(observed, result)


def pending_in_group(rank: int, epoch: int) -> dict[str, Any]:
    pod = worker(rank, None, created=epoch, phase="Pending")
    pod["spec"].pop("nodeName", None)
    pod["spec"]["schedulingGroup"] = {"podGroupName": "llama-of-3"}
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]
    return pod


def test_workers_waiting_unbound_in_their_pod_group_are_not_recreated_at_the_timeout() -> None:
    """A gang preempted whole waits whole: past barrierTimeoutSeconds its unbound workers stay
    (a new pod would wait the same), and `Stuck` says they are unschedulable."""
    status = restarting_status(1, detected=GANG_NOW - timedelta(hours=1))
    pods = [pending_in_group(r, 1) for r in range(3)]
    result = plan(gang(replicas=3, status=status, pods=pods), WHOLE)
    assert result.delete_pods == []
    assert result.status.epoch == 1
    stuck = condition(result, ConditionType.STUCK)
    assert stuck is not None
    assert stuck[1] == "BarrierStalled"
    assert "Pending, Unschedulable" in stuck[2]


def test_an_unbound_worker_outside_a_pod_group_is_still_recreated() -> None:
    status = restarting_status(1, detected=GANG_NOW - timedelta(hours=1))
    pods = [pending_in_group(r, 1) for r in range(3)]
    del pods[2]["spec"]["schedulingGroup"]
    result = plan(gang(replicas=3, status=status, pods=pods), WHOLE)
    assert [d.name for d in result.delete_pods] == ["llama-2"]
