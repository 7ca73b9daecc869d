"""The failure-class table (api/failures.py) is complete and is what the policy's defaults and
its priority order read."""

from __future__ import annotations

import pytest

from api.failures import FAILURE_CLASSES, PRIORITY, UNCOUNTED, FailureClass, meaning
from api.v1alpha1 import FailureAction
from controller.policy import classify


def test_every_class_has_a_row() -> None:
    assert set(FAILURE_CLASSES) == set(FailureClass)


@pytest.mark.parametrize("cls", list(FailureClass))
def test_the_policys_default_is_the_row(cls: FailureClass) -> None:
    row = meaning(cls)
    assert classify.default_decision(cls) == (row.action, row.counted)


def test_infrastructure_never_counts_by_default() -> None:
    infrastructure = {c for c in FailureClass if meaning(c).infrastructure}
    assert infrastructure <= UNCOUNTED
    assert FailureClass.NODE_LOST in infrastructure
    assert FailureClass.PROCESS_EXIT not in UNCOUNTED


def test_the_infrastructure_explains_a_crash_beside_it() -> None:
    # A process that died because its node or device did is the node's or device's failure.
    # (A pod deleted or a barrier missed is judged only where no exit is read.)
    signalled_with_exits = [
        c
        for c in PRIORITY
        if meaning(c).infrastructure
        and c not in (FailureClass.POD_DELETED, FailureClass.BARRIER_TIMEOUT)
    ]
    first_exit = PRIORITY.index(FailureClass.OOM_KILLED)
    assert all(PRIORITY.index(c) < first_exit for c in signalled_with_exits)


def test_no_default_fails_the_job() -> None:
    # Only a rule the user wrote fails a job: no class does by default.
    assert all(meaning(c).action is not FailureAction.FAIL_JOB for c in FailureClass)
