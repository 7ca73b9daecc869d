"""Unit tests of `controller.policy.success` through `plan` (docs/design.md sections 3b and
5.2): the success policies `All` and `Rank0`."""

from __future__ import annotations

from api.constants import ConditionType
from api.v1alpha1 import (
    Phase,
)
from controller.policy.plan import EventSpec, PodStop, plan
from tests.unit.builders import make_job, make_pod
from tests.unit.gangs import (
    STAMP,
    condition,
    names,
    observe,
)


def test_all_succeeded() -> None:
    pods = [make_pod(r, phase="Succeeded") for r in range(3)]
    result = plan(observe(make_job(replicas=3), pods))
    assert result.status.phase is Phase.SUCCEEDED
    assert result.status.completion_time == STAMP
    assert condition(result, ConditionType.SUCCEEDED) == (
        "True",
        "AllWorkersSucceeded",
        "All 3 workers succeeded",
    )
    assert condition(result, ConditionType.READY) == (
        "False",
        "JobFinished",
        "All 3 workers succeeded",
    )
    assert result.events == [EventSpec("Normal", "Succeeded", "All 3 workers succeeded")]
    assert result.delete_pods == []


def test_all_policy_waits_for_every_worker() -> None:
    pods = [make_pod(0, phase="Succeeded"), make_pod(1)]
    result = plan(observe(make_job(replicas=2), pods))
    assert result.status.phase is Phase.PENDING
    assert names(result) == []  # a succeeded worker is not recreated


def test_rank0_policy_succeeds_with_rank_0_and_frees_the_rest() -> None:
    pods = [make_pod(0, phase="Succeeded"), make_pod(1), make_pod(2, phase="Succeeded")]
    result = plan(observe(make_job(replicas=4, successPolicy="Rank0"), pods))
    assert result.status.phase is Phase.SUCCEEDED
    assert condition(result, ConditionType.SUCCEEDED) == (
        "True",
        "Rank0Succeeded",
        "Rank 0 succeeded",
    )
    # The running worker is stopped, every pod kept for its logs, rank 3 not created.
    assert result.delete_pods == []
    assert result.stop_pods == [PodStop(name="llama-1", uid="uid-1", reason="JobFinished")]
    assert names(result) == []
