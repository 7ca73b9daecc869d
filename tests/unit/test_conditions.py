"""Unit tests of controller.policy.conditions: Kubernetes condition conventions, as table tests."""

from datetime import UTC, datetime, timedelta

import pytest

from api.v1alpha1 import Condition, ConditionStatus
from controller.policy.conditions import get_condition, is_true, remove_condition, set_condition

T0 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def cond(
    type_: str,
    status: ConditionStatus,
    reason: str = "R",
    message: str = "",
    at: datetime = T0,
    generation: int | None = 1,
) -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=at,
        observed_generation=generation,
    )


@pytest.mark.parametrize(
    ("before", "set_args", "after"),
    [
        pytest.param(
            [],
            ("Ready", TRUE, "AllWorkersReady", "4/4"),
            [cond("Ready", TRUE, "AllWorkersReady", "4/4", at=T1, generation=2)],
            id="new type appended with now",
        ),
        pytest.param(
            [cond("Ready", FALSE, "WorkersNotReady", "1/4")],
            ("Ready", TRUE, "AllWorkersReady", "4/4"),
            [cond("Ready", TRUE, "AllWorkersReady", "4/4", at=T1, generation=2)],
            id="status change moves the transition time",
        ),
        pytest.param(
            [cond("Ready", FALSE, "WorkersNotReady", "1/4")],
            ("Ready", FALSE, "WorkersNotReady", "3/4"),
            [cond("Ready", FALSE, "WorkersNotReady", "3/4", at=T0, generation=2)],
            id="same status keeps the transition time, updates the message",
        ),
        pytest.param(
            [cond("Ready", FALSE, "WorkersNotReady", "1/4")],
            ("Ready", FALSE, "Suspended", "Job suspended"),
            [cond("Ready", FALSE, "Suspended", "Job suspended", at=T0, generation=2)],
            id="same status keeps the transition time, updates the reason",
        ),
        pytest.param(
            [cond("Ready", UNKNOWN)],
            ("Ready", FALSE, "R", ""),
            [cond("Ready", FALSE, at=T1, generation=2)],
            id="Unknown to False is a transition",
        ),
        pytest.param(
            [cond("Ready", TRUE), cond("Suspended", FALSE), cond("Failed", FALSE)],
            ("Suspended", TRUE, "Suspended", "s"),
            [
                cond("Ready", TRUE),
                cond("Suspended", TRUE, "Suspended", "s", at=T1, generation=2),
                cond("Failed", FALSE),
            ],
            id="others keep their order and values",
        ),
    ],
)
def test_set_condition(
    before: list[Condition],
    set_args: tuple[str, ConditionStatus, str, str],
    after: list[Condition],
) -> None:
    type_, status, reason, message = set_args
    result = set_condition(before, type_, status, reason, message, T1, 2)
    assert result == after


def test_set_condition_does_not_mutate_its_input() -> None:
    before = [cond("Ready", FALSE)]
    set_condition(before, "Ready", TRUE, "R", "", T1)
    set_condition(before, "Suspended", TRUE, "R", "", T1)
    assert before == [cond("Ready", FALSE)]


def test_set_condition_twice_is_set_once() -> None:
    once = set_condition([], "Ready", TRUE, "R", "m", T0, 1)
    assert set_condition(once, "Ready", TRUE, "R", "m", T1, 1) == once


def test_set_condition_stores_whole_seconds() -> None:
    """metav1.Time has whole seconds: a time read back equals the time written."""
    (condition,) = set_condition([], "Ready", TRUE, "R", "", T0.replace(microsecond=999), None)
    assert condition.last_transition_time == T0


@pytest.mark.parametrize(
    ("conditions", "type_", "found", "true"),
    [
        ([], "Ready", None, False),
        ([cond("Ready", TRUE)], "Ready", cond("Ready", TRUE), True),
        ([cond("Ready", FALSE)], "Ready", cond("Ready", FALSE), False),
        ([cond("Ready", UNKNOWN)], "Ready", cond("Ready", UNKNOWN), False),
        ([cond("Failed", TRUE)], "Ready", None, False),
    ],
)
def test_get_condition_and_is_true(
    conditions: list[Condition], type_: str, found: Condition | None, true: bool
) -> None:
    assert get_condition(conditions, type_) == found
    assert is_true(conditions, type_) is true


def test_remove_condition() -> None:
    conditions = [cond("Ready", TRUE), cond("Failed", TRUE)]
    assert remove_condition(conditions, "Ready") == [cond("Failed", TRUE)]
    assert remove_condition(conditions, "Suspended") == conditions
