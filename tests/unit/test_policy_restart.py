"""Unit tests of `controller.policy.restart` through `plan` (docs/design.md sections 3.1, 3.3
and 3.8): the epoch bump and its record, the barrier, backoff timing, and the history. Every
scenario is also replanned over its own outcome: nothing repeats."""

from __future__ import annotations

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
)
from controller.policy.plan import EventSpec, plan
from tests.unit.builders import T0, make_job, make_pod, with_status
from tests.unit.gangs import (
    GANG_NOW,
    carry_out,
    condition,
    crashed,
    gang,
    names,
    observe,
    record,
    replan,
    restarting_status,
    running_status,
    worker,
)

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
        detected_at=GANG_NOW,
        onset_at=GANG_NOW,
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


# --- the barrier ----------------------------------------------------------------------------


def test_the_barrier_opens_when_every_worker_has_arrived() -> None:
    observed = gang(status=restarting_status(), pods=[worker(r, 1) for r in range(3)])
    result = plan(observed)
    status = result.status
    assert (status.epoch, status.barrier_epoch, status.barrier_opened_at) == (1, 1, GANG_NOW)
    done = record(result)
    assert (done.barrier_open_at, done.duration_seconds) == (GANG_NOW, 3.0)
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
    assert (result.status.barrier_epoch, result.status.barrier_opened_at) == (0, GANG_NOW)
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
    status = restarting_status(detected=GANG_NOW - timedelta(seconds=1))
    pods = [worker(0, 1), worker(1, 1)]
    pods[1]["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
    # Its agent, restarted with the pod, says so: the status alone could be the restart that
    # brought it to epoch 1, which the kubelet may not have rewritten yet.
    pods[1]["metadata"]["annotations"]["gangjob.io/exit"] = "1:-1"
    result = plan(gang(replicas=2, status=status, pods=pods, restart={"backoffSeconds": 30}))
    assert result.status.epoch == 1
    assert result.status.barrier_epoch == 0
    assert result.requeue_after is not None
    assert result.requeue_after > 0


# --- history --------------------------------------------------------------------------------


def test_history_and_restarts_are_kept() -> None:
    record = RestartRecord(
        epoch=1,
        trigger=RestartTrigger(failure_class="ProcessExit", action=FailureAction.RESTART_GANG),
        detected_at=T0,
    )
    status = GangJobStatus(epoch=1, history=[record] * HISTORY_LIMIT, last_restart=record)
    result = plan(observe(with_status(make_job(replicas=1), status), [make_pod(0)]))
    assert result.status.history == [record] * HISTORY_LIMIT
    assert result.status.last_restart == record


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
    pods[1]["metadata"]["annotations"]["gangjob.io/exit"] = "1:-1"  # its restarted agent's word
    result = plan(gang(status=status, pods=pods))
    assert result.status.epoch == 2
    assert [(r.epoch, r.barrier_open_at) for r in result.status.history] == [(1, None)]
