"""Unit tests of `controller.policy.manual` through `plan`: the annotation `gangjob.io/restart`
restarts the gang at the epoch it names once, in place, as a manual restart in the history."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from api.constants import ConditionType
from api.v1alpha1 import FailureAction, RestartCounts, RestartRecord, RestartTrigger
from controller.policy.manual import requested_epoch
from controller.policy.plan import Observed, plan
from tests.unit.gangs import (
    GANG_NOW,
    condition,
    crashed,
    gang,
    record,
    replan,
    running_status,
    worker,
)


def asked(observed: Observed, value: str) -> Observed:
    meta = observed.job.metadata.model_copy(update={"annotations": {"gangjob.io/restart": value}})
    return dataclasses.replace(observed, job=observed.job.model_copy(update={"metadata": meta}))


def test_a_request_at_the_gangs_epoch_restarts_it_once_in_place() -> None:
    observed = asked(gang(status=running_status(2), pods=[worker(r, 2) for r in range(3)]), "2")
    result = plan(observed)
    assert result.status.epoch == 3
    assert result.status.restarts == RestartCounts(total=1, counted=0, in_place=1)
    assert record(result) == RestartRecord(
        epoch=3,
        trigger=RestartTrigger(
            worker=None,
            failure_class="ManualRestart",
            detail="requested by the annotation gangjob.io/restart=2",
            action=FailureAction.RESTART_GANG,
        ),
        detected_at=GANG_NOW,
        onset_at=GANG_NOW,
        recreated=[],
    )
    assert result.delete_pods == []
    restarting = condition(result, ConditionType.RESTARTING)
    assert restarting is not None
    assert restarting[:2] == ("True", "ManualRestart")
    assert [e.reason for e in result.events] == ["GangRestarting"]
    # The request names epoch 2: once the gang is at 3 it is satisfied, nothing repeats.
    replan(observed, result)


def test_a_request_for_another_epoch_does_nothing() -> None:
    for value in ("1", "3", "", "x", "-2"):
        result = plan(
            asked(gang(status=running_status(2), pods=[worker(r, 2) for r in range(3)]), value)
        )
        assert result.status.epoch == 2, value
        assert result.status.last_restart is None


def test_a_failure_in_the_same_pass_makes_the_one_restart() -> None:
    pods = [worker(0, 0), crashed(worker(1, 0), 7), worker(2, 0)]
    result = plan(asked(gang(pods=pods), "0"))
    assert result.status.epoch == 1
    assert record(result).trigger.failure_class == "ProcessExit"
    assert result.status.restarts.total == 1


def test_a_request_does_not_cut_a_backoff_short() -> None:
    opened = GANG_NOW - timedelta(seconds=1)
    trigger = RestartTrigger(
        worker=1, failure_class="ProcessExit", detail="x", action=FailureAction.RESTART_GANG
    )
    last = RestartRecord(
        epoch=1, trigger=trigger, detected_at=opened - timedelta(seconds=2),
        barrier_open_at=opened, duration_seconds=2.0, counted=True,
    )  # fmt: skip
    status = running_status(
        1, last_restart=last, restarts=RestartCounts(total=1, counted=1, in_place=1)
    ).model_copy(update={"barrier_opened_at": opened})
    pods = [worker(0, 1), crashed(worker(1, 1), 7), worker(2, 1)]
    result = plan(asked(gang(status=status, pods=pods, restart={"backoffSeconds": 30}), "1"))
    # The crash waits out its backoff; the request must not restart the gang meanwhile.
    assert result.status.epoch == 1
    assert result.requeue_after is not None


def test_requested_epoch() -> None:
    assert requested_epoch({"gangjob.io/restart": "4"}) == 4
    assert requested_epoch({"gangjob.io/restart": " 4 "}) == 4
    assert requested_epoch({"gangjob.io/restart": "-1"}) is None
    assert requested_epoch({}) is None
