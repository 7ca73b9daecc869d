"""Pure helpers over `status.conditions` that follow the Kubernetes API conventions (those of
apimachinery's `meta.SetStatusCondition`): one condition per type, and a `lastTransitionTime`
that moves only when the status does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from api.v1alpha1 import Condition, ConditionStatus


def get_condition(conditions: Sequence[Condition], type: str) -> Condition | None:
    """The condition of this type, if any."""
    return next((c for c in conditions if c.type == type), None)


def is_true(conditions: Sequence[Condition], type: str) -> bool:
    """The condition of this type exists and is True."""
    condition = get_condition(conditions, type)
    return condition is not None and condition.status == ConditionStatus.TRUE


def set_condition(
    conditions: Sequence[Condition],
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """The conditions with the one of this type set; the others keep their order and values.

    A condition whose status does not change keeps its `lastTransitionTime` (only reason,
    message and observedGeneration are updated): the time says when the status changed, and
    keeping it lets a reconcile that changed nothing write nothing. A new type is appended.
    """
    existing = get_condition(conditions, type)
    transition_time = (
        existing.last_transition_time if existing is not None and existing.status == status else now
    )
    condition = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=transition_time,
        observed_generation=observed_generation,
    )
    if existing is None:
        return [*conditions, condition]
    return [condition if c.type == type else c for c in conditions]


def remove_condition(conditions: Sequence[Condition], type: str) -> list[Condition]:
    """The conditions without the one of this type."""
    return [c for c in conditions if c.type != type]
