"""Hangs (controller/policy/hang.py): a worker whose agent reports its trainer stalled is a
`Hang` failure at the epoch, held for the gang's other stalls to arrive, and the restart names
the worker that hung, not one that waited for it, or says it cannot tell."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from api.v1alpha1 import FailureAction
from controller.policy.hang import HANG_SETTLE_SECONDS
from controller.policy.plan import Observed, plan
from controller.policy.views import WorkerProgress
from tests.unit.gangs import GANG_NOW, gang, record, running_status, worker

HANG = 30


def stalled(step: int, last_step_at: datetime, state: str | None = "S") -> WorkerProgress:
    return WorkerProgress(
        epoch=2, step=step, last_step_at=last_step_at, stalled=True, trainer_state=state
    )


def running(step: int) -> WorkerProgress:
    return WorkerProgress(epoch=2, step=step, last_step_at=GANG_NOW - timedelta(seconds=1))


def with_progress(observed: Observed, progress: dict[int, WorkerProgress]) -> Observed:
    pods = [dataclasses.replace(pod, progress=progress.get(pod.rank or 0)) for pod in observed.pods]
    return dataclasses.replace(observed, pods=pods)


def hung_gang(
    progress: dict[int, WorkerProgress], hang_seconds: int | None = HANG, **spec: Any
) -> Observed:
    base = gang(
        replicas=4,
        status=running_status(2),
        pods=[worker(r, 2) for r in range(4)],
        progress={"hangSeconds": hang_seconds} if hang_seconds else {},
        **spec,
    )
    return with_progress(base, progress)


# Past its report (hangSeconds after the last step) and the settle time.
LONG_AGO = GANG_NOW - timedelta(seconds=HANG + HANG_SETTLE_SECONDS + 1)


def test_a_stalled_worker_restarts_the_gang_in_place_as_a_hang_naming_it() -> None:
    result = plan(hung_gang({0: running(50), 1: stalled(41, LONG_AGO), 2: running(50)}))
    r = record(result)
    assert result.status.epoch == 3
    assert (r.trigger.worker, r.trigger.failure_class) == (1, "Hang")
    assert r.trigger.action is FailureAction.RESTART_GANG
    assert r.counted is True
    assert r.recreated == []
    assert r.onset_at == LONG_AGO
    assert "no step past 41" in (r.trigger.detail or "")


def test_a_trainer_that_never_reports_is_never_hung() -> None:
    result = plan(hung_gang({}))
    assert result.status.epoch == 2
    result = plan(hung_gang({1: WorkerProgress(epoch=2, step=None)}))
    assert result.status.epoch == 2


def test_without_hang_seconds_a_stall_is_no_failure() -> None:
    result = plan(hung_gang({1: stalled(41, LONG_AGO)}, hang_seconds=None))
    assert result.status.epoch == 2


def test_a_stall_of_an_older_epoch_is_no_failure() -> None:
    old = dataclasses.replace(stalled(41, LONG_AGO), epoch=1)
    assert plan(hung_gang({1: old})).status.epoch == 2


def test_the_first_stall_waits_for_the_others_to_be_reported() -> None:
    just = GANG_NOW - timedelta(seconds=HANG + 0.2)
    result = plan(hung_gang({1: stalled(41, just)}))
    assert result.status.epoch == 2
    assert result.requeue_after is not None
    assert result.requeue_after <= HANG_SETTLE_SECONDS


def test_a_stopped_trainer_is_blamed_not_the_ranks_waiting_for_it() -> None:
    # Rank 2 was stopped (SIGSTOP, a wedged device): every rank stalled at the same step, and
    # rank 0's waiting collective even stalled first.
    progress = {
        0: stalled(73, LONG_AGO - timedelta(seconds=0.5)),
        1: stalled(73, LONG_AGO),
        2: stalled(73, LONG_AGO, state="T"),
        3: stalled(73, LONG_AGO),
    }
    r = record(plan(hung_gang(progress)))
    assert r.trigger.worker == 2
    assert "its trainer is stopped" in (r.trigger.detail or "")
    assert "3 other workers stalled or failed behind it" in (r.trigger.detail or "")


def test_the_worker_that_stalled_first_is_blamed() -> None:
    progress = {
        0: stalled(73, LONG_AGO),
        3: stalled(72, LONG_AGO - timedelta(seconds=5)),
    }
    assert record(plan(hung_gang(progress))).trigger.worker == 3


def test_workers_that_cannot_be_told_apart_are_named_together() -> None:
    progress = {r: stalled(73, LONG_AGO + timedelta(seconds=r * 0.1)) for r in range(4)}
    r = record(plan(hung_gang(progress)))
    assert r.trigger.worker is None
    assert r.trigger.failure_class == "Hang"
    assert "workers 0, 1, 2, 3 stalled within 1s" in (r.trigger.detail or "")
    assert "cannot be told" in (r.trigger.detail or "")


def test_a_rule_can_recreate_a_hung_worker() -> None:
    rules = [{"action": "RecreateWorker", "onFailureClasses": ["Hang"]}]
    observed = hung_gang({1: stalled(41, LONG_AGO)}, failurePolicy={"rules": rules})
    result = plan(observed)
    assert record(result).recreated == [1]
    assert [d.name for d in result.delete_pods] == ["llama-1"]
