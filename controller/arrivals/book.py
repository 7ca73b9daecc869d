"""The book of arrivals (docs/design.md section 3): what each worker's agent reported to the
controller directly, by pod, and how a report joins the pod's view for `plan`. Domain only: no
HTTP, no tokens.

A report is `(pod UID, epoch, optional trainer exit)`, the same facts as the pod annotations
`gangjob.io/epoch` and `gangjob.io/exit`, and `plan` reads both channels alike: whichever says
the later epoch wins.

Reports live in memory only, and that is safe: an agent holds its report's stream open and
sends the report again when it breaks (a restarted or new leader), or falls back to the
annotation; once the barrier of an epoch is open `plan` knows from the status alone that every
worker present arrived at it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from controller.policy.classify import all_containers_restarting
from controller.policy.views import PodView


@dataclass(frozen=True)
class Report:
    """What an agent said last: it arrived at `epoch`; `exit` = (epoch, code or None)."""

    uid: str
    epoch: int
    exit: tuple[int, int | None] | None = None

    def supersedes(self, other: Report) -> bool:
        """Whether this report replaces `other` (same pod): a later epoch, or at the same epoch
        an exit where there was none."""
        if self.uid != other.uid:
            return True
        return (self.epoch, self.exit is not None) >= (other.epoch, other.exit is not None)


def with_report(view: PodView, report: Report | None) -> PodView:
    """The pod's view with an agent's direct report merged in: the later of the annotation's
    epoch and the report's, and the exit report at the later epoch."""
    if report is None or report.uid != view.uid:
        return view
    if all_containers_restarting(view):
        # The report came the fast way and can overtake the kubelet's status write in our pod
        # cache: the condition may be the restart the agent has already come back from. Until
        # the cache catches up, the pod counts where its own status puts it; a real failure
        # after arriving is not lost, its agent reports it (`exit`) once restarted.
        return view
    arrived = view.arrived_epoch
    if arrived is None or report.epoch > arrived:
        arrived = report.epoch
    exit = view.reported_exit
    if report.exit is not None and (exit is None or report.exit[0] >= exit[0]):
        exit = report.exit
    if (arrived, exit) == (view.arrived_epoch, view.reported_exit):
        return view
    return dataclasses.replace(view, arrived_epoch=arrived, reported_exit=exit)


class ArrivalBook:
    """The reports the agents hold, by pod, and a wake-up per GangJob for their streams."""

    def __init__(self) -> None:
        self._reports: dict[tuple[str, str], Report] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self.closing = False
        """The server is stopping: streams end now (their agents report to the next leader)."""

    def close(self) -> None:
        self.closing = True
        for key in list(self._changed):
            self.job_changed(key)

    def record(self, namespace: str, pod: str, report: Report) -> bool:
        """Keeps `report` unless the pod said something later already; True if kept."""
        key = (namespace, pod)
        held = self._reports.get(key)
        if held is not None and not report.supersedes(held):
            return False
        self._reports[key] = report
        return True

    def get(self, namespace: str, pod: str) -> Report | None:
        return self._reports.get((namespace, pod))

    def forget(self, namespace: str, pod: str, uid: str) -> None:
        """The pod is gone: its reports go with it (a new pod of that name reports anew)."""
        held = self._reports.get((namespace, pod))
        if held is not None and held.uid == uid:
            del self._reports[(namespace, pod)]

    def apply(self, view: PodView) -> PodView:
        return with_report(view, self._reports.get((view.namespace, view.name)))

    def job_changed(self, key: str) -> None:
        """Wakes the streams of GangJob `key` (namespace/name)."""
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    def changed(self, key: str) -> asyncio.Event:
        event = self._changed.get(key)
        if event is None:
            event = self._changed[key] = asyncio.Event()
        return event
