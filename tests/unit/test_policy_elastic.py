"""`controller.policy.elastic`: `status.worldSize`, and the in-place resize of an elastic gang
whose `replicas` changed (docs/design.md section 3.12)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from api.constants import (
    REASON_SPARE_TOOK_OVER,
    REASON_STRAY_POD,
    REASON_WORKER_REMOVED,
    ConditionType,
)
from api.failures import FailureClass
from api.v1alpha1 import (
    FailureAction,
    GangJobStatus,
    Phase,
    RestartMode,
    RestartRecord,
    RestartTrigger,
)
from controller.policy import scheduling
from controller.policy.plan import Observed, plan
from tests.unit.builders import make_job, make_node
from tests.unit.gangs import (
    GANG_NOW,
    condition,
    crashed,
    gang,
    record,
    replan,
    restarting_status,
    running_status,
    worker,
)

ELASTIC: dict[str, Any] = {"elastic": {"minReplicas": 2, "maxReplicas": 8}}


def test_first_pass_sets_the_world_size_without_a_restart() -> None:
    result = plan(gang(4, GangJobStatus(), pods=[]))
    assert result.status.world_size == 4
    assert result.status.epoch == 0
    assert result.restart_started is None


def test_a_running_gang_that_never_had_a_world_size_gets_one_without_a_restart() -> None:
    result = plan(gang(3, **ELASTIC))
    assert result.status.world_size == 3
    assert result.status.epoch == 0
    assert result.delete_pods == []


def test_shrink_bumps_once_deletes_the_highest_and_keeps_the_others() -> None:
    # Ran at 6; replicas is now 4: workers 4 and 5 go, 0..3 restart in place.
    pods = [worker(r, 0) for r in range(6)]
    observed = gang(4, running_status(0, world_size=6), pods=pods, **ELASTIC)
    result = plan(observed)
    assert result.status.epoch == 1
    assert result.status.world_size == 4
    assert sorted(d.name for d in result.delete_pods) == ["llama-4", "llama-5"]
    assert {d.reason for d in result.delete_pods} == {REASON_WORKER_REMOVED}
    assert result.create_pods == []
    trigger = record(result).trigger
    assert trigger.failure_class == FailureClass.RESIZED
    assert trigger.worker is None
    assert trigger.detail == "resized 6 -> 4 (replicas changed)"
    assert not record(result).counted
    assert record(result).recreated == []
    assert any("resized 6 -> 4" in e.message for e in result.events)
    replan(observed, result)


def test_grow_creates_the_next_numbers_behind_the_open_barrier_then_bumps_once() -> None:
    # The gang trains on while the new workers' pods are made: no bump yet.
    pods = [worker(r, 0) for r in range(3)]
    observed = gang(5, running_status(0, world_size=3), pods=pods, **ELASTIC)
    result = plan(observed)
    assert result.status.epoch == 0
    assert result.status.world_size == 3
    assert result.delete_pods == []
    created = {p["metadata"]["name"]: p for p in result.create_pods}
    assert sorted(created) == ["llama-3", "llama-4"]
    for pod in created.values():
        assert pod["metadata"]["annotations"]["gangjob.io/created-epoch"] == "0"
        trainer = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["WORLD_SIZE"] == "5"
    replan(observed, result)
    # One new agent arrived (holding outside the world), the other not yet: still no bump.
    pods += [worker(3, 0), worker(4, None)]
    result = plan(gang(5, running_status(0, world_size=3), pods=pods, **ELASTIC))
    assert result.status.epoch == 0
    # The gang trains: Running, its world ready; the joiners are said, not waited for.
    assert result.status.phase == "Running"
    ready = next(c for c in result.status.conditions if c.type == "Ready")
    assert (ready.status, ready.message) == (
        "True",
        "3/3 workers ready (2 more out of the world: spares, waiting for room or joining)",
    )
    # Both arrived: one bump takes them in, and every worker restarts in place.
    pods[4] = worker(4, 0)
    observed = gang(5, running_status(0, world_size=3), pods=pods, **ELASTIC)
    result = plan(observed)
    assert result.status.epoch == 1
    assert result.status.world_size == 5
    assert result.create_pods == []
    assert record(result).trigger.detail == "resized 3 -> 5 (replicas changed)"
    replan(observed, result)


def test_a_grow_while_the_barrier_is_shut_bumps_at_once() -> None:
    # Nobody trains during a restart: the new workers join the restart in progress.
    pods = [worker(r, 1) for r in range(3)]
    status = restarting_status(1).model_copy(update={"world_size": 3})
    result = plan(gang(5, status, pods=pods, **ELASTIC))
    assert result.status.epoch == 2
    assert result.status.world_size == 5
    assert sorted(p["metadata"]["name"] for p in result.create_pods) == ["llama-3", "llama-4"]


def test_a_grow_goes_on_without_a_new_worker_that_finds_no_node() -> None:
    since = GANG_NOW - timedelta(seconds=61)
    pods = [worker(r, 0) for r in range(3)] + [worker(3, 0), unschedulable(4, 0, since)]
    result = plan(gang(5, running_status(0, world_size=3), pods=pods, **WAITING))
    assert result.status.epoch == 1
    assert (result.status.world_size, result.status.dropped) == (4, [4])
    assert record(result).trigger.detail == (
        "resized 3 -> 4 (replicas changed; node lost, no capacity)"
    )
    # Before waitSeconds it waits for that pod, and looks again when they are up.
    pods[4] = unschedulable(4, 0, GANG_NOW - timedelta(seconds=20))
    result = plan(gang(5, running_status(0, world_size=3), pods=pods, **WAITING))
    assert result.status.epoch == 0
    assert result.requeue_after is not None
    assert result.requeue_after <= 40.0


def test_the_barrier_of_the_new_epoch_waits_for_the_new_size_only() -> None:
    # After a shrink 6 -> 4 every kept worker arrived at 1; the removed ones are gone.
    status = running_status(0, world_size=4).model_copy(update={"epoch": 1})
    result = plan(gang(4, status, pods=[worker(r, 1) for r in range(4)], **ELASTIC))
    assert result.status.barrier_epoch == 1


def test_a_failure_of_the_same_pass_takes_the_resize_with_its_bump() -> None:
    pods = [worker(r, 0) for r in range(6)]
    crashed(pods[1], code=1)
    observed = gang(4, running_status(0, world_size=6), pods=pods, **ELASTIC)
    result = plan(observed)
    assert result.status.epoch == 1  # one bump, not two
    assert result.status.world_size == 4
    trigger = record(result).trigger
    assert trigger.failure_class == FailureClass.PROCESS_EXIT
    assert trigger.worker == 1
    assert trigger.detail is not None
    assert trigger.detail.endswith("; resized 6 -> 4 (replicas changed)")
    assert {"llama-4", "llama-5"} <= {d.name for d in result.delete_pods}


def test_without_elastic_a_different_world_size_restarts_nothing() -> None:
    # `replicas` is immutable there; a status from before changes nothing but itself.
    pods = [worker(r, 0) for r in range(3)]
    result = plan(gang(3, running_status(0, world_size=3), pods=pods))
    assert result.status.epoch == 0
    assert result.restart_started is None


@pytest.mark.parametrize("elastic", [True, False])
def test_strays_above_the_size_go_as_strays_when_no_resize_is_pending(elastic: bool) -> None:
    # World already 3 (the resize happened): a pod numbered 5 is a stray, of any job.
    pods = [worker(r, 0) for r in range(3)] + [worker(5, 0)]
    spec: dict[str, Any] = ELASTIC if elastic else {}
    result = plan(gang(3, running_status(0, world_size=3), pods=pods, **spec))
    assert [(d.name, d.reason) for d in result.delete_pods] == [("llama-5", REASON_STRAY_POD)]
    assert result.status.epoch == 0


# --- shrink for want of capacity, and grow back -------------------------------------------

WAITING: dict[str, Any] = {
    "elastic": {"minReplicas": 2, "maxReplicas": 8, "waitSeconds": 60, "growAfterSeconds": 300}
}


def unschedulable(rank: int, created: int, since: datetime) -> dict[str, Any]:
    """Worker `rank`'s pod, recreated at epoch `created`, that no node can take since `since`."""
    pod = worker(rank, None, created=created)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
    }
    return pod


def waiting_for(rank: int, since: datetime, replicas: int = 4) -> list[dict[str, Any]]:
    """A gang restarting at epoch 1 after worker `rank`'s node was lost: the others arrived."""
    return [unschedulable(r, 1, since) if r == rank else worker(r, 1) for r in range(replicas)]


def lost_status(world: int = 4, **update: Any) -> GangJobStatus:
    return restarting_status(1).model_copy(update={"world_size": world, **update})


def test_a_worker_that_cannot_be_placed_for_wait_seconds_is_dropped() -> None:
    pods = waiting_for(2, GANG_NOW - timedelta(seconds=61))
    observed = gang(4, lost_status(), pods=pods, **WAITING)
    result = plan(observed)
    assert result.status.epoch == 2
    assert result.status.world_size == 3
    assert result.status.dropped == [2]
    assert record(result).trigger.detail == "resized 4 -> 3 (node lost, no capacity)"
    assert result.delete_pods == []  # its pod stays, pending, to grow back with
    assert result.create_pods == []
    # The others arrive at 2: the barrier opens without worker 2.
    after = gang(4, result.status, pods=[*(worker(r, 2) for r in (0, 1, 3)), pods[2]], **WAITING)
    assert plan(after).status.barrier_epoch == 2


def test_before_wait_seconds_the_gang_waits_and_looks_again_then() -> None:
    pods = waiting_for(2, GANG_NOW - timedelta(seconds=20))
    result = plan(gang(4, lost_status(), pods=pods, **WAITING))
    assert result.status.epoch == 1
    assert result.status.dropped == []
    assert result.requeue_after is not None
    assert result.requeue_after <= 40.0


def test_never_below_min_replicas_nor_without_worker_0() -> None:
    since = GANG_NOW - timedelta(seconds=61)
    pods = [unschedulable(r, 1, since) if r in (1, 2, 3) else worker(r, 1) for r in range(4)]
    result = plan(gang(4, lost_status(), pods=pods, **WAITING))
    assert result.status.world_size == 2  # minReplicas: only two of the three go
    assert result.status.dropped == [1, 2]
    pods = waiting_for(0, since)
    assert plan(gang(4, lost_status(), pods=pods, **WAITING)).status.dropped == []


def test_a_dropped_worker_placed_again_rejoins_after_grow_after_seconds() -> None:
    shrunk_at = GANG_NOW - timedelta(seconds=301)
    trigger = RestartTrigger(
        worker=None,
        failure_class="Resized",
        detail="resized 4 -> 3 (node lost, no capacity)",
        action=FailureAction.RESTART_GANG,
    )
    last = RestartRecord(epoch=2, trigger=trigger, detected_at=shrunk_at, barrier_open_at=shrunk_at)
    status = running_status(2, world_size=3, dropped=[2], last_restart=last, history=[last])
    pods = [worker(r, 2) for r in (0, 1, 3)] + [worker(2, None, created=1)]  # placed, running
    result = plan(gang(4, status, pods=pods, **WAITING))
    assert result.status.epoch == 3
    assert (result.status.world_size, result.status.dropped) == (4, [])
    assert record(result).trigger.detail == "resized 3 -> 4 (capacity returned)"
    # Sooner than growAfterSeconds after the shrink: not yet, and the pass looks again then.
    early = [last.model_copy(update={"detected_at": GANG_NOW - timedelta(seconds=100)})]
    status = status.model_copy(update={"last_restart": early[0], "history": early})
    result = plan(gang(4, status, pods=pods, **WAITING))
    assert result.status.epoch == 2
    assert result.requeue_after is not None
    assert 190 <= result.requeue_after <= 200


def test_a_dropped_workers_old_pod_still_on_its_lost_node_is_not_taken_back() -> None:
    # The cache a moment behind the force-delete: worker 2's old pod, still on its dead node.
    status = running_status(2, world_size=3, dropped=[2])
    pods = [worker(r, 2) for r in (0, 1, 3)] + [worker(2, 0, node="dead")]
    nodes = (make_node(), make_node("dead", ready="Unknown"))
    result = plan(gang(4, status, pods=pods, nodes=nodes, **WAITING))
    assert result.status.epoch == 2
    assert (result.status.world_size, result.status.dropped) == (3, [2])


def test_a_dropped_worker_is_no_failure_and_not_waited_for() -> None:
    since = GANG_NOW - timedelta(seconds=600)
    pods = [worker(r, 2) for r in (0, 1, 3)] + [unschedulable(2, 1, since)]
    status = running_status(2, world_size=3, dropped=[2])
    result = plan(gang(4, status, pods=pods, **WAITING))
    assert result.status.epoch == 2
    assert result.restart_started is None
    assert result.delete_pods == []


def test_at_min_replicas_the_gang_waits_and_stuck_says_why() -> None:
    since = GANG_NOW - timedelta(seconds=61)
    pods = [worker(0, 1), unschedulable(1, 1, since)]
    result = plan(gang(2, lost_status(world=2), pods=pods, **WAITING))
    assert result.status.epoch == 1
    assert result.status.dropped == []
    stuck = condition(result, ConditionType.STUCK)
    assert stuck is not None
    assert stuck[:2] == ("True", "ElasticAtMinimum")
    assert "spec.elastic.minReplicas (2)" in stuck[2]
    assert "worker 1 (pod llama-1): Pending, Unschedulable" in stuck[2]
    assert any(e.reason == "ElasticAtMinimum" for e in result.events)


def test_the_coordinator_is_never_dropped() -> None:
    since = GANG_NOW - timedelta(seconds=61)
    spec = {**WAITING, "coordinator": {"role": "worker", "index": 2}}
    result = plan(gang(4, lost_status(), pods=waiting_for(2, since), **spec))
    assert result.status.dropped == []
    stuck = condition(result, ConditionType.STUCK)
    assert stuck is not None
    assert "worker 2 holds MASTER_ADDR" in stuck[2]


# --- spares -------------------------------------------------------------------------------

SPARES: dict[str, Any] = {
    "elastic": {"minReplicas": 2, "maxReplicas": 8, "spares": 1, "waitSeconds": 60},
    "restart": {"mode": "Process"},
}
LOST = make_node("node-1", ready="Unknown", taints=("node.kubernetes.io/unreachable",))


def spare_gang(
    pods: list[dict[str, Any]], status: GangJobStatus | None = None, **spec: dict[str, Any]
) -> Observed:
    """4 workers and spare 4 at epoch 0 (`status.dropped` [4]), node-1 lost."""
    status = status or running_status(0, world_size=4, dropped=[4]).model_copy(
        update={"mode": RestartMode.PROCESS}
    )
    return gang(4, status, pods=pods, nodes=(make_node(), LOST), **{**SPARES, **spec})


def test_the_first_pass_puts_the_spares_out_of_the_world() -> None:
    result = plan(gang(4, GangJobStatus(), pods=[], **SPARES))
    assert (result.status.world_size, result.status.dropped) == (4, [4])
    assert sorted(p["metadata"]["name"] for p in result.create_pods) == [
        f"llama-{r}" for r in range(5)
    ]
    assert result.create_pod_group is None or result.create_pod_group["spec"]


def test_a_placed_arrived_spare_takes_a_lost_workers_place_in_the_same_bump() -> None:
    pods = [worker(r, 0, node="node-1" if r == 2 else "node-0") for r in range(5)]
    observed = spare_gang(pods)
    result = plan(observed)
    assert result.status.epoch == 1  # one bump: the loss and the swap
    assert (result.status.world_size, result.status.dropped) == (4, [2])
    trigger = record(result).trigger
    assert trigger.failure_class == FailureClass.NODE_LOST
    assert trigger.detail is not None
    assert trigger.detail.endswith("; spare 4 takes worker 2's place")
    assert [d.name for d in result.delete_pods] == ["llama-2"]  # the spare's pod is kept
    assert any(e.reason == REASON_SPARE_TOOK_OVER for e in result.events)
    (restarting,) = (e for e in result.events if e.reason == "GangRestarting")
    assert restarting.message.endswith("; spare 4 takes worker 2's place")
    # The barrier of 1 waits for 0, 1, 3 and the spare, not for worker 2's new pod, which is
    # made once the barrier opens: a pass while the agents arrive has no pod to create.
    arriving = [worker(r, 1) for r in (0, 1, 3)] + [worker(4, 0)]
    assert plan(spare_gang(arriving, result.status)).create_pods == []
    after = [worker(r, 1) for r in (0, 1, 3, 4)]
    opened = plan(spare_gang(after, result.status))
    assert opened.status.barrier_epoch == 1
    # Worker 2's new pod is created, out of the world: a spare once placed.
    assert [p["metadata"]["name"] for p in opened.create_pods] == ["llama-2"]


def test_a_grow_takes_a_ready_spare_at_once_and_the_new_pod_becomes_a_spare() -> None:
    # 4 workers and ready spare 4; replicas 4 -> 5: the spare joins in this pass's bump, in
    # place, and worker 5 (the new number) is out of the world: the next spare.
    pods = [worker(r, 0) for r in range(5)]
    status = running_status(0, world_size=4, dropped=[4]).model_copy(
        update={"mode": RestartMode.PROCESS}
    )
    result = plan(gang(5, status, pods=pods, **SPARES))
    assert (result.status.epoch, result.status.world_size) == (1, 5)
    assert result.status.dropped == [5]
    assert record(result).trigger.detail == "resized 4 -> 5 (replicas changed)"
    # The new pod is made in the background, once the barrier of the bump opened.
    assert result.create_pods == []
    opened = plan(gang(5, result.status, pods=[worker(r, 1) for r in range(5)], **SPARES))
    assert opened.status.barrier_epoch == 1
    assert [p["metadata"]["name"] for p in opened.create_pods] == ["llama-5"]
    # Without a ready spare the grow waits behind the open barrier for its new pod, as before.
    pods[4] = worker(4, None)
    waiting = plan(gang(5, status, pods=pods, **SPARES))
    assert (waiting.status.epoch, waiting.status.world_size) == (0, 4)


def test_a_spare_not_arrived_is_not_swapped_in() -> None:
    pods = [worker(r, 0, node="node-1" if r == 2 else "node-0") for r in range(4)]
    pods.append(worker(4, None))  # placed, its agent not arrived yet
    result = plan(spare_gang(pods))
    assert result.status.epoch == 1
    assert (result.status.world_size, result.status.dropped) == (4, [4])
    assert not any(e.reason == REASON_SPARE_TOOK_OVER for e in result.events)


def test_the_coordinator_is_never_replaced_by_a_spare() -> None:
    pods = [worker(r, 0, node="node-1" if r == 0 else "node-0") for r in range(5)]
    result = plan(spare_gang(pods))
    assert result.status.epoch == 1
    assert result.status.dropped == [4]
    assert [d.name for d in result.delete_pods] == ["llama-0"]


def test_with_wait_seconds_0_and_no_spare_the_lost_worker_goes_at_once() -> None:
    elastic = {"minReplicas": 2, "maxReplicas": 8, "waitSeconds": 0}
    pods = [worker(r, 0, node="node-1" if r == 2 else "node-0") for r in range(4)]
    status = running_status(0, world_size=4)
    result = plan(gang(4, status, pods=pods, nodes=(make_node(), LOST), elastic=elastic))
    assert result.status.epoch == 1
    assert (result.status.world_size, result.status.dropped) == (3, [2])
    assert (record(result).trigger.detail or "").endswith(
        "; resized 4 -> 3 (worker lost, no spare)"
    )
    after = [worker(r, 1) for r in (0, 1, 3)]
    status = result.status
    again = plan(gang(4, status, pods=after, nodes=(make_node(),), elastic=elastic))
    assert again.status.barrier_epoch == 1


def test_a_spare_on_a_lost_node_is_replaced_in_the_background() -> None:
    pods = [worker(r, 0, node="node-1" if r == 4 else "node-0") for r in range(5)]
    result = plan(spare_gang(pods))
    assert result.status.epoch == 0  # no restart: a spare is no member
    assert [d.name for d in result.delete_pods] == ["llama-4"]


def test_a_spare_is_no_failure() -> None:
    pods = [worker(r, 0) for r in range(5)]
    crashed(pods[4])
    assert plan(spare_gang(pods)).status.epoch == 0


def test_more_spares_need_no_restart() -> None:
    pods = [worker(r, 0) for r in range(5)]
    spec = {"elastic": {**SPARES["elastic"], "spares": 2}}
    result = plan(spare_gang(pods, None, **spec))
    assert result.restart_started is None
    assert result.status.dropped == [4, 5]
    assert [p["metadata"]["name"] for p in result.create_pods] == ["llama-5"]


def test_a_smaller_size_turns_the_highest_workers_into_spares() -> None:
    # 4 workers and spare 4; replicas 3: pods 0..3, worker 3 becomes the spare.
    pods = [worker(r, 0) for r in range(5)]
    status = running_status(0, world_size=4, dropped=[4]).model_copy(
        update={"mode": RestartMode.PROCESS}
    )
    result = plan(gang(3, status, pods=pods, **SPARES))
    assert result.status.epoch == 1
    assert (result.status.world_size, result.status.dropped) == (3, [3])
    assert [d.name for d in result.delete_pods] == ["llama-4"]


def test_the_pod_group_counts_the_spares() -> None:
    job = make_job(4, **SPARES)
    assert scheduling.gang_size(job) == 3


def test_spares_need_a_mode_that_keeps_the_pods() -> None:
    with pytest.raises(
        ValueError, match=r"elastic\.spares requires .* not spec\.restart\.mode Recreate"
    ):
        make_job(4, elastic=SPARES["elastic"], restart={"mode": "Recreate"})
    assert make_job(4, elastic=SPARES["elastic"], restart={"mode": "Pod"}).spec.elastic


def test_the_coordinator_is_never_a_spare_from_the_start() -> None:
    spec = {**SPARES, "coordinator": {"role": "worker", "index": 4}}
    result = plan(gang(4, GangJobStatus(), pods=[], **spec))
    assert (result.status.world_size, result.status.dropped) == (4, [3])


def test_the_world_succeeding_is_the_jobs_success_without_its_spare() -> None:
    """A spare runs nothing: it cannot succeed, and it does not keep the job from it."""
    pods = [crashed(worker(w, 0), 0) for w in range(4)] + [worker(4, 0)]
    status = running_status(0, world_size=4, dropped=[4])
    result = plan(gang(4, status, pods, **SPARES))
    assert result.status.phase is Phase.SUCCEEDED
    assert "All 4 workers succeeded" in [e.message for e in result.events]
    # One of the world still running: not yet.
    pods[3] = worker(3, 0)
    assert plan(gang(4, status, pods, **SPARES)).status.phase is Phase.RUNNING
