"""Unit tests of `controller.policy.recreate` through `plan` (docs/design.md sections 3.8, 4.5
and 4.6): workers recreated for a lost node or device (and that node avoided), `Recreate`
mode, laggards past the barrier timeout, and the force-delete guards. Every scenario is also
replanned over its own outcome: nothing repeats."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest

from api.constants import KUEUE_QUEUE_NAME_LABEL, PLACEMENT_GATE, ConditionType
from api.v1alpha1 import (
    FailureAction,
    RestartCounts,
    RestartMode,
    dump_status,
)
from controller.policy import recreate
from controller.policy.plan import Observed, PlanConfig, PodDelete, plan
from controller.policy.recreate import ranks_text
from controller.policy.views import NodeView, PodView
from tests.unit.builders import T0, make_node
from tests.unit.gangs import (
    GANG_NOW,
    carry_out,
    condition,
    crashed,
    gang,
    record,
    replan,
    restarting_status,
    running_status,
    worker,
)

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


def _kept_off(pod: dict[str, Any]) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    [values] = [e["values"] for e in terms[0]["matchExpressions"] if e["operator"] == "NotIn"]
    return list(values)


def test_a_recreated_worker_is_kept_off_every_node_lost_right_now() -> None:
    # An overloaded apiserver delays the node controller's NoSchedule taints: the scheduler
    # put the fault campaign's recreated workers on other lost nodes, eight bumps in a row.
    lost = make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",))
    also_lost = make_node("node-2", ready="Unknown")
    observed = gang(pods=[worker(0, 0), worker(1, 0, node="node-1"), worker(2, 0)],
                    nodes=[make_node(), lost, also_lost])  # fmt: skip
    result = plan(observed)
    assert record(result).recreated == [1]
    after = carry_out(observed, result)
    after = dataclasses.replace(after, pods=[p for p in after.pods if p.name != "llama-1"])
    [created] = plan(after).create_pods
    assert _kept_off(created) == ["node-1", "node-2"]
    assert not result.status.avoid_nodes  # not for good: a node that comes back is used
    back = dataclasses.replace(
        after, nodes={**after.nodes, "node-2": NodeView.from_node(make_node("node-2"))}
    )
    [created] = plan(back).create_pods
    assert _kept_off(created) == ["node-1"]


def test_a_kueue_workers_replacement_keeps_its_groups_shape() -> None:
    # Kueue's role hash covers the affinity: a replacement of another shape than its group's
    # would stay gated, no member of the admitted Workload.
    lost = make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",))
    observed = gang(pods=[worker(0, 0), worker(1, 0, node="node-1"), worker(2, 0)],
                    nodes=[make_node(), lost])  # fmt: skip
    observed.job.metadata.labels[KUEUE_QUEUE_NAME_LABEL] = "team-a"
    after = carry_out(observed, plan(observed))
    after = dataclasses.replace(after, pods=[p for p in after.pods if p.name != "llama-1"])
    [created] = plan(after).create_pods
    assert created["metadata"]["labels"][KUEUE_QUEUE_NAME_LABEL] == "team-a"
    assert "affinity" not in created["spec"]
    assert created["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]


def _queued_device_loss() -> tuple[Observed, dict[str, Any]]:
    """A queued gang whose worker 1 lost its device on gpu-7: the observation once the old pod
    is gone, and the replacement the next pass creates."""
    pods = [worker(0, 0), worker(1, 0, node="gpu-7")]
    pods[1]["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g", "health": "Unhealthy"}]}
    ]
    observed = gang(replicas=2, pods=pods, nodes=[make_node(), make_node("gpu-7")])
    observed.job.metadata.labels[KUEUE_QUEUE_NAME_LABEL] = "team-a"
    result = plan(observed)
    assert result.status.avoid_nodes == ["gpu-7"]
    after = carry_out(observed, result)
    after = dataclasses.replace(after, pods=[p for p in after.pods if p.name != "llama-1"])
    [created] = plan(after).create_pods
    return after, created


def test_a_kueue_worker_recreated_for_its_device_is_created_in_its_groups_shape() -> None:
    # avoidNodes in its affinity at creation would give it another role hash than its group's:
    # no member of the admitted Workload, it would stay gated.
    _, created = _queued_device_loss()
    assert "affinity" not in created["spec"]
    assert created["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]


def test_a_gated_kueue_worker_is_kept_off_the_nodes_then_ungated_in_one_write() -> None:
    after, created = _queued_device_loss()
    created["metadata"]["uid"], created["metadata"]["resourceVersion"] = "new-1", "17"
    # Kueue's webhook added its gate; the pod is in the cache.
    created["spec"]["schedulingGates"].insert(0, {"name": "kueue.x-k8s.io/admission"})
    seen = dataclasses.replace(after, pods=[*after.pods, PodView.from_pod(created)])
    result = plan(seen)
    assert result.create_pods == []
    [placement] = result.place_pods
    assert (placement.name, placement.resource_version) == ("llama-1", "17")
    assert placement.gates == ("kueue.x-k8s.io/admission",)
    assert placement.affinity is not None
    assert _kept_off({"spec": {"affinity": placement.affinity}}) == ["gpu-7"]
    # Once our gate is gone, nothing more.
    created["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    placed = dataclasses.replace(after, pods=[*after.pods, PodView.from_pod(created)])
    assert plan(placed).place_pods == []


def test_a_worker_not_queued_is_never_gated_by_the_controller() -> None:
    pods = [worker(0, 0), worker(1, 0, node="gpu-7")]
    pods[1]["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g", "health": "Unhealthy"}]}
    ]
    observed = gang(replicas=2, pods=pods, nodes=[make_node(), make_node("gpu-7")])
    after = carry_out(observed, plan(observed))
    after = dataclasses.replace(after, pods=[p for p in after.pods if p.name != "llama-1"])
    [created] = plan(after).create_pods
    assert "schedulingGates" not in created["spec"]
    assert _kept_off(created) == ["gpu-7"]


@pytest.mark.parametrize("seen_deleted", [True, False])
def test_the_old_pod_of_a_recreated_worker_arriving_at_the_epoch_is_no_new_failure(
    seen_deleted: bool,
) -> None:
    # `Process` mode: the old pod's agent sees the bump and arrives at the new epoch before its
    # deletion reaches it, its device still Unhealthy. The fault campaign saw it bump twice.
    pods = [worker(0, 0), worker(1, 0, node="gpu-7")]
    pods[1]["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "g", "health": "Unhealthy"}]}
    ]
    status = running_status().model_copy(update={"mode": RestartMode.PROCESS})
    observed = gang(
        replicas=2, pods=pods, status=status, nodes=[make_node(), make_node("gpu-7")],
        restart={"mode": "Process"},
    )  # fmt: skip
    result = plan(observed)
    assert result.status.epoch == 1
    assert record(result).recreated == [1]
    after = carry_out(observed, result, deletions=seen_deleted)
    old = next(p for p in after.pods if p.name == "llama-1")
    arrived = dataclasses.replace(old, arrived_epoch=1)
    after = dataclasses.replace(
        after, pods=[arrived if p.name == "llama-1" else p for p in after.pods]
    )
    again = plan(after)
    assert again.status.epoch == 1
    assert again.restart_started is None
    assert again.status.restarts == result.status.restarts
    # Its deletion is asked again while the cache has not seen it.
    assert [d.name for d in again.delete_pods] == ([] if seen_deleted else ["llama-1"])


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


def test_a_restart_asks_once_per_pass_which_workers_cannot_restart_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bump's pass asks it of every worker twice (which the restart recreates, then which
    # laggards below the new epoch are stuck): at N=5000, a walk over every worker each time.
    asked: list[str] = []
    real = recreate._stuck

    def counted(p: Any, pod: PodView, wrapped: bool) -> Any:
        asked.append(pod.name)
        return real(p, pod, wrapped)

    monkeypatch.setattr(recreate, "_stuck", counted)
    pods = [worker(0, 0), worker(1, 0, node="node-1"), worker(2, 0)]
    nodes = [make_node(), make_node("node-1", ready="False")]
    observed = gang(pods=[*pods[:2], crashed(pods[2])], nodes=nodes)
    result = plan(observed)
    assert result.status.epoch == 1
    assert record(result).recreated == [1]
    assert [d.name for d in result.delete_pods] == ["llama-1"]
    assert sorted(asked) == ["llama-0", "llama-1", "llama-2"]
    # And a pass of the restart where they have all arrived (the barrier's) asks no one.
    asked.clear()
    arrived = gang(status=restarting_status(), pods=[worker(r, 1) for r in range(3)])
    assert plan(arrived).status.barrier_epoch == 1
    assert asked == []


# --- laggards -------------------------------------------------------------------------------


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
    status = restarting_status(detected=GANG_NOW - timedelta(seconds=100))
    pods = [worker(0, 1), worker(1, 1), worker(2, 0)]
    waiting = plan(
        gang(status=status, pods=pods, restart={"barrierTimeoutSeconds": 130}),
        PlanConfig(barrier_stall_seconds=600),  # the timeout, not the stall, looks again
    )
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
