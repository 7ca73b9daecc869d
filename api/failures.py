"""What each class of failure means, in one table (docs/design.md section 4.2-4.3): its place in
the order that explains a worker showing several signals, the failure policy's default action
and counting when no rule matches, and whether it is the infrastructure's failure rather than
the user's code's. A new class is one row here plus the function that detects its signal
(`controller.policy.classify`).

The controller and the fault campaign's observer both read this table, so the campaign checks
the controller against the same meaning the controller was built to (and nothing else of the
controller's decisions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from api.constants import FailureAction


class FailureClass(StrEnum):
    """What kind of failure a worker had, or what else restarted the gang
    (`status.lastRestart.trigger.class`)."""

    NODE_LOST = "NodeLost"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    DISRUPTION = "Disruption"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    HANG = "Hang"
    OOM_KILLED = "OOMKilled"
    PROCESS_EXIT = "ProcessExit"
    POD_FAILED = "PodFailed"
    POD_DELETED = "PodDeleted"
    BARRIER_TIMEOUT = "BarrierTimeout"
    STRAGGLER = "Straggler"
    MANUAL_RESTART = "ManualRestart"
    RESIZED = "Resized"


@dataclass(frozen=True)
class ClassMeaning:
    """What one failure class implies."""

    action: FailureAction
    """The failure policy's action when no rule matches."""
    counted: bool
    """Whether a restart for it counts against `spec.restart.maxRestarts` when no rule says
    otherwise (a rule's `countsTowardsMaxRestarts` overrides it)."""
    infrastructure: bool
    """A failure of the node, device or cluster rather than of the user's code: never the
    user's budget by default, and a process that died with it is explained by it."""
    summary: str
    """The signal, for the docs and for humans."""
    avoids_node: bool = False
    """A worker recreated for it keeps off its node from then on (`status.avoidNodes`): the
    node's device failed, or runs slow, and would fail or slow the new worker too."""


FAILURE_CLASSES: Final[Mapping[FailureClass, ClassMeaning]] = {
    # In priority order: when one worker shows several signals, the first class here explains
    # it (a process that died because its node or device did is an infrastructure failure).
    FailureClass.NODE_LOST: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="the worker's Node is gone, NotReady or tainted unreachable/not-ready/"
        "out-of-service",
    ),
    FailureClass.DEVICE_UNHEALTHY: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="a device of the worker is Unhealthy, its node's allocatable is below "
        "capacity, a listed node condition holds, or the device taint manager evicted it",
        avoids_node=True,
    ),
    FailureClass.DISRUPTION: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="pod condition DisruptionTarget (taint manager, pod GC, kubelet)",
    ),
    FailureClass.EVICTED: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="pod condition DisruptionTarget, reason EvictionByEvictionAPI",
    ),
    FailureClass.PREEMPTED: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="pod condition DisruptionTarget, reason PreemptionByScheduler",
    ),
    FailureClass.HANG: ClassMeaning(
        FailureAction.RESTART_GANG,
        counted=True,
        infrastructure=False,
        summary="the trainer runs but its reported step has not advanced for "
        "spec.progress.hangSeconds",
    ),
    FailureClass.OOM_KILLED: ClassMeaning(
        FailureAction.RESTART_GANG,
        counted=True,
        infrastructure=False,
        summary="the trainer was killed for memory (reason OOMKilled)",
    ),
    FailureClass.PROCESS_EXIT: ClassMeaning(
        FailureAction.RESTART_GANG,
        counted=True,
        infrastructure=False,
        summary="the trainer exited non-zero, or its pod restarted in place",
    ),
    FailureClass.POD_FAILED: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=True,
        infrastructure=False,
        summary="pod phase Failed",
    ),
    FailureClass.POD_DELETED: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="the pod is being deleted, or gone, while the barrier is open",
    ),
    FailureClass.BARRIER_TIMEOUT: ClassMeaning(
        FailureAction.RECREATE_WORKER,
        counted=False,
        infrastructure=True,
        summary="the worker did not arrive within spec.restart.barrierTimeoutSeconds",
    ),
    # After every class a pod or node shows: a slow worker that also crashed or lost its node
    # is explained by that. Report-only unless a rule acts: the Event, the `Stragglers`
    # condition and status.progress.stragglers say it whatever the action.
    FailureClass.STRAGGLER: ClassMeaning(
        FailureAction.IGNORE,
        counted=False,
        infrastructure=False,
        summary="the worker's compute per step has been at least spec.progress.straggler.ratio "
        "times its role's median for forSeconds (reported only, unless a rule acts on it)",
        avoids_node=True,
    ),
    FailureClass.MANUAL_RESTART: ClassMeaning(
        FailureAction.RESTART_GANG,
        counted=False,
        infrastructure=False,
        summary="the user asked for a restart (annotation gangjob.io/restart); no worker failed",
    ),
    FailureClass.RESIZED: ClassMeaning(
        FailureAction.RESTART_GANG,
        counted=False,
        infrastructure=False,
        summary="an elastic gang's spec.replicas changed: it restarts in place at its new "
        "size; no worker failed",
    ),
}

PRIORITY: Final[tuple[FailureClass, ...]] = tuple(FAILURE_CLASSES)
"""The classes in the order that explains a worker showing several signals."""

UNCOUNTED: Final[frozenset[FailureClass]] = frozenset(
    c for c, meaning in FAILURE_CLASSES.items() if not meaning.counted
)
"""The classes whose restarts do not count against `maxRestarts` unless a rule says so."""


def meaning(failure_class: FailureClass) -> ClassMeaning:
    """The row of a class."""
    return FAILURE_CLASSES[failure_class]
