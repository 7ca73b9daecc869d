"""Unit tests of `controller.policy.deadline` through `plan`: `spec.activeDeadlineSeconds`
fails the job with reason `DeadlineExceeded`, counting from `status.startTime` whatever the
gang was doing, and asks to be woken when it falls."""

from __future__ import annotations

from datetime import timedelta

from api.constants import ConditionType
from api.v1alpha1 import GangJobStatus, Phase
from controller.policy.plan import PodStop, plan
from tests.unit.builders import T0
from tests.unit.gangs import (
    GANG_NOW,
    condition,
    crashed,
    gang,
    replan,
    restarting_status,
    worker,
)


def test_no_deadline_no_wake_up() -> None:
    result = plan(gang())
    assert result.status.phase is Phase.RUNNING
    assert result.requeue_after is None


def test_before_the_deadline_the_pass_wakes_when_it_falls() -> None:
    # `gang` is 10 minutes after T0, its start.
    result = plan(gang(activeDeadlineSeconds=900))
    assert result.status.phase is Phase.RUNNING
    assert result.requeue_after == 300.0


def test_at_the_deadline_a_running_job_fails_and_its_workers_stop() -> None:
    observed = gang(replicas=2, activeDeadlineSeconds=600)
    result = plan(observed)
    assert result.status.phase is Phase.FAILED
    assert condition(result, ConditionType.FAILED) == (
        "True",
        "DeadlineExceeded",
        "The job ran for longer than spec.activeDeadlineSeconds (600s) since 2026-05-01T10:00:00Z",
    )
    assert result.status.completion_time == GANG_NOW
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "Failed")]
    # cleanPodPolicy None: running workers are stopped in place, not deleted.
    assert result.stop_pods == [
        PodStop("llama-0", "uid-0", "JobFinished"),
        PodStop("llama-1", "uid-1", "JobFinished"),
    ]
    assert result.delete_pods == []
    assert result.requeue_after is None


def test_time_spent_restarting_counts() -> None:
    """A gang in the middle of a restart (barrier shut) still fails at its deadline."""
    observed = gang(status=restarting_status(), activeDeadlineSeconds=599)
    result = plan(observed)
    assert result.status.phase is Phase.FAILED
    failed = condition(result, ConditionType.FAILED)
    assert failed is not None
    assert failed[1] == "DeadlineExceeded"
    restarting = condition(result, ConditionType.RESTARTING)
    assert restarting is None or restarting[0] == "False"


def test_a_failure_at_the_deadline_restarts_nothing() -> None:
    pods = [worker(0, 0), crashed(worker(1, 0))]
    result = plan(gang(replicas=2, pods=pods, activeDeadlineSeconds=60))
    assert result.status.phase is Phase.FAILED
    assert result.status.epoch == 0
    assert result.restart_started is None


def test_a_job_not_started_has_no_clock() -> None:
    result = plan(gang(status=GangJobStatus(), pods=[], activeDeadlineSeconds=1))
    assert result.status.phase is Phase.PENDING
    assert result.status.start_time == GANG_NOW
    assert len(result.create_pods) == 3


def test_the_deadline_counts_from_the_start_not_the_last_restart() -> None:
    status = restarting_status().model_copy(update={"start_time": T0 - timedelta(hours=1)})
    result = plan(gang(status=status, activeDeadlineSeconds=3600))
    assert result.status.phase is Phase.FAILED


def test_the_failed_job_replans_to_nothing_new() -> None:
    observed = gang(replicas=2, activeDeadlineSeconds=600)
    replan(observed, plan(observed))
