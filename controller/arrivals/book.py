"""The book of arrivals (docs/design.md section 3): what each worker's agent reported to the
controller directly, by pod, and how a report joins the pod's view for `plan`. Domain only: no
HTTP, no tokens.

A report is `(pod UID, epoch, optional trainer exit)`, the same facts as the pod annotations
`gangjob.io/epoch` and `gangjob.io/exit`, and `plan` reads both channels alike: whichever says
the later epoch wins.

The book also keeps each worker's latest training progress, as its agent summarised it to
`/v1/progress` (docs/progress.md): `ProgressReport`, read by `progress` and `progress_of`.

Reports live in memory only, and that is safe: an agent holds its report's stream open and
sends the report again when it breaks (a restarted or new leader), or falls back to the
annotation; once the barrier of an epoch is open `plan` knows from the status alone that every
worker present arrived at it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType

from api.constants import COMPUTE_SHIFT_RATIO
from controller.policy.classify import all_containers_restarting
from controller.policy.straggler import fold
from controller.policy.views import PodView, WorkerProgress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """What an agent said last: it arrived at `epoch`; `exit` = (epoch, code or None).

    `incarnation` is the id the agent drew when it started (None from agents that send none).
    `restarted` is the book's finding, not the agent's claim: the pod's previous report was at
    a lower epoch from another incarnation, so this agent started after the pod's restart to
    `epoch` (docs/design.md section 3.5, the arrival proof)."""

    uid: str
    epoch: int
    exit: tuple[int, int | None] | None = None
    incarnation: str | None = None
    restarted: bool = False

    def supersedes(self, other: Report) -> bool:
        """Whether this report replaces `other` (same pod): a later epoch, or at the same epoch
        an exit where there was none."""
        if self.uid != other.uid:
            return True
        return (self.epoch, self.exit is not None) >= (other.epoch, other.exit is not None)

    @property
    def waiting(self) -> bool:
        """Arrived at `epoch` and not failed there: one of the barrier's expected arrivals."""
        return self.exit is None or self.exit[0] < self.epoch


@dataclass(frozen=True)
class ProgressReport:
    """A worker's training progress at an epoch, as its agent last summarised it (docs/progress.md).
    Times are the controller's wall clock (seconds since the epoch), from when the summary came
    in: the agent sends durations, so that no clock of another machine is read."""

    uid: str
    epoch: int
    step: int
    """The worker's step (the lowest of its trainer's local processes)."""
    steps_per_second: float | None
    """Over the time since the agent's previous summary (None in its first)."""
    checkpoint: int | None
    """The latest step durably checkpointed, as the trainer said."""
    compute_seconds: float | None
    """The trainer's own compute time in its latest step (the slowest local process)."""
    step_changed_at: float
    """When the step last changed (or was first reported at this epoch)."""
    stalled_since: float | None
    """`step_changed_at` while the agent finds the worker stalled: its step has not changed for
    the job's hangSeconds while its trainer runs. None: not stalled."""
    malformed: int
    """Malformed progress lines the agent read at this epoch."""
    received_at: float
    trainer_state: str | None = None
    """The state of the trainer's processes (/proc's letter, the most telling: `T` stopped,
    `D` in the kernel, `R`, `S`) where the agent sees them; None where it does not (a sidecar
    outside the trainer's process namespace)."""
    trainer_cpu_seconds: float | None = None
    """Their CPU time together, where the agent sees them (its growth between two summaries
    says they ran)."""
    compute_median_seconds: float | None = None
    """The median of the trainer's compute over the summary's window (docs/progress.md); from
    an agent that sends none, `compute_seconds` stands for it."""
    compute_samples: int = 0
    """How many samples that median is of."""
    compute_since: float | None = None
    """When the window's first sample was taken."""
    compute_runs: tuple[tuple[float, float], ...] = ()
    """The windows of this run (pod UID and epoch) so far, as the straggler judgement reads
    them (`straggler.fold`); the book folds each summary's window in."""

    def view(self) -> WorkerProgress:
        """What the policy reads of it (`PodView.progress`), its times as datetimes."""
        return WorkerProgress(
            epoch=self.epoch,
            step=self.step,
            steps_per_second=self.steps_per_second,
            checkpoint=self.checkpoint,
            compute_seconds=self.compute_seconds,
            last_step_at=datetime.fromtimestamp(self.step_changed_at, UTC),
            stalled=self.stalled_since is not None,
            trainer_state=self.trainer_state,
            malformed=self.malformed,
            compute_median_seconds=self.compute_median_seconds,
            compute_runs=self.compute_runs,
            reported_at=datetime.fromtimestamp(self.received_at, UTC),
        )

    def folded(self, held: ProgressReport | None) -> ProgressReport:
        """This summary with its compute window folded into the windows of `held` (the
        previous summary of the same run; else its own alone). From an agent that sends no
        window, the latest step's compute stands for one since the previous summary."""
        same_run = held is not None and (held.uid, held.epoch) == (self.uid, self.epoch)
        runs = held.compute_runs if held is not None and same_run else ()
        median, since = self.compute_median_seconds, self.compute_since
        if median is None and self.compute_seconds is not None:
            median = self.compute_seconds
            since = held.received_at if held is not None and same_run else self.received_at
        if median is None or since is None:
            return dataclasses.replace(self, compute_runs=runs)
        return dataclasses.replace(
            self, compute_median_seconds=median, compute_runs=fold(runs, since, median)
        )

    def shifted(self, held: ProgressReport | None) -> bool:
        """The compute moved by `COMPUTE_SHIFT_RATIO` since `held`, the previous summary of
        the same run: a straggler may begin or end."""
        if held is None or (held.uid, held.epoch) != (self.uid, self.epoch):
            return False
        a, b = held.compute_median_seconds, self.compute_median_seconds
        if a is None or b is None:
            return False
        low, high = sorted((a, b))
        return high > 0 and high >= COMPUTE_SHIFT_RATIO * low

    def supersedes(self, other: ProgressReport) -> bool:
        """Whether this summary replaces `other` (same pod): another pod's, or not an older
        epoch's."""
        return self.uid != other.uid or self.epoch >= other.epoch


def proven(report: Report, held: Report | None) -> Report:
    """`report` with `restarted` decided against the report the book held for the pod.

    The agent that held the previous epoch's report is gone once another incarnation reports
    a later epoch: in `Pod` mode the kubelet restarted every container of the pod, the agent
    with them, and only then did this incarnation start. Without a previous report from a known
    incarnation (a controller that restarted and lost its book, a fresh pod, an old agent) the
    report proves nothing, and the pod's own status decides as before."""
    if held is None or held.uid != report.uid or report.incarnation is None:
        restarted = False
    elif held.incarnation == report.incarnation:
        # The same agent: still proven at the same epoch (it sent its report again), and at a
        # later one if at its own it only said that the pod restarted under it (exit code
        # unknown) and waited: it started after that restart and has run nothing since.
        came_back = held.exit == (held.epoch, None) and held.epoch < report.epoch
        restarted = held.restarted and (held.epoch == report.epoch or came_back)
    else:
        restarted = held.incarnation is not None and held.epoch <= report.epoch
    return dataclasses.replace(report, restarted=restarted)


def with_report(view: PodView, report: Report | None) -> PodView:
    """The pod's view with an agent's direct report merged in: the later of the annotation's
    epoch and the report's, and the exit report at the later epoch."""
    if report is None or report.uid != view.uid:
        return view
    if all_containers_restarting(view) and not report.restarted:
        # The report came the fast way and can overtake the kubelet's status write in our pod
        # cache: the condition may be the restart the agent has already come back from. Unless
        # the book proves the agent started after that restart, the pod counts where its own
        # status puts it until the cache catches up; a real failure after arriving is not lost,
        # its agent reports it (`exit`) once restarted.
        return view
    arrived = view.arrived_epoch
    if arrived is None or report.epoch > arrived:
        arrived = report.epoch
    exit = view.reported_exit
    if report.exit is not None and (exit is None or report.exit[0] >= exit[0]):
        exit = report.exit
    # Restart signals in the status are the proven restart's only while the pod stands at the
    # report's epoch (an annotation of a later one is a later story).
    restarted = report.restarted and arrived == report.epoch
    if (arrived, exit, restarted) == (view.arrived_epoch, view.reported_exit, view.restarted):
        return view
    return view.evolve(arrived_epoch=arrived, reported_exit=exit, restarted=restarted)


class ArrivalBook:
    """The reports the agents hold, by pod; per GangJob, how many wait at each epoch (so the
    last expected arrival is known the moment it comes); `job_changed` tells the endpoint's
    streams."""

    def __init__(self) -> None:
        self._reports: dict[tuple[str, str], Report] = {}
        # Per pod, the last join of `apply`: (view, report, progress, joined). A pass over a
        # gang of N joins N views, nearly all the same objects as in the last pass (views are
        # cached per pod version, reports and progress kept until superseded): only changed
        # pods are joined again.
        self._joined: dict[
            tuple[str, str],
            tuple[PodView, Report | None, ProgressReport | None, PodView],
        ] = {}
        self._job_of: dict[tuple[str, str], str] = {}
        self._waiting: dict[str, Counter[int]] = {}
        self._failed: set[str] = set()
        """GangJobs a worker of which reported its trainer's exit since `take_failed` last
        looked: a failure, for a pass at once rather than coalesced with arrivals."""
        self._listeners: list[Callable[[str, bool], None]] = []
        self._progress: dict[str, dict[str, ProgressReport]] = {}
        """Per GangJob (namespace/name), per pod name: the latest progress."""
        self._progress_job: dict[tuple[str, str], str] = {}
        self._progress_epoch: dict[str, int] = {}
        """Per GangJob, the latest epoch a summary came for: the first of an epoch is news."""
        self.closing = False
        """The server is stopping: streams end now (their agents report to the next leader)."""

    def close(self) -> None:
        self.closing = True
        self._tell("", True)

    def record(self, namespace: str, pod: str, report: Report, job: str = "") -> bool:
        """Keeps `report` (of a worker of GangJob `job`, namespace/name) unless the pod said
        something later already; True if kept."""
        key = (namespace, pod)
        held = self._reports.get(key)
        if held is not None and not report.supersedes(held):
            return False
        self._drop(key)
        report = proven(report, held)
        self._reports[key] = report
        if job:
            self._job_of[key] = job
            if report.waiting:
                self._waiting.setdefault(job, Counter())[report.epoch] += 1
            else:
                self._failed.add(job)
        return True

    def take_failed(self, job: str) -> bool:
        """Whether a worker of GangJob `job` reported an exit since the last call."""
        if job not in self._failed:
            return False
        self._failed.discard(job)
        return True

    def waiting(self, job: str, epoch: int) -> int:
        """How many workers of GangJob `job` reported arriving at `epoch` and wait there."""
        counts = self._waiting.get(job)
        return counts[epoch] if counts is not None else 0

    def _drop(self, key: tuple[str, str]) -> None:
        self._joined.pop(key, None)
        held, job = self._reports.pop(key, None), self._job_of.pop(key, None)
        if held is None or job is None or not held.waiting:
            return
        counts = self._waiting[job]
        counts[held.epoch] -= 1
        if counts[held.epoch] <= 0:
            del counts[held.epoch]
            if not counts:
                del self._waiting[job]

    def get(self, namespace: str, pod: str) -> Report | None:
        return self._reports.get((namespace, pod))

    def forget(self, namespace: str, pod: str, uid: str) -> None:
        """The pod is gone: its reports go with it (a new pod of that name reports anew)."""
        held = self._reports.get((namespace, pod))
        if held is not None and held.uid == uid:
            self._drop((namespace, pod))
        job = self._progress_job.get((namespace, pod))
        if job is not None:
            of_job = self._progress[job]
            if of_job[pod].uid == uid:
                del of_job[pod], self._progress_job[(namespace, pod)]
                if not of_job:
                    del self._progress[job]
                    self._progress_epoch.pop(job, None)

    def record_progress(self, job: str, pod: str, progress: ProgressReport) -> bool:
        """Keeps `progress` of pod `pod` (a worker of GangJob `job`, namespace/name) unless it
        is older than the one held, its compute window folded into the run's. True if the job's
        pass should look now: it is the job's first summary of its epoch (a summary queues no
        pass, and the pass looks again at the status's period only once it has some), the
        worker's stall began or ended with it, or its compute shifted (a straggler may begin or
        end)."""
        namespace = job.partition("/")[0]
        key = (namespace, pod)
        held_job = self._progress_job.get(key)
        held = self._progress[held_job].get(pod) if held_job is not None else None
        if held is not None and not progress.supersedes(held):
            return False
        if held_job is not None and held_job != job:
            del self._progress[held_job][pod]
        progress = progress.folded(held)
        self._progress.setdefault(job, {})[pod] = progress
        self._progress_job[key] = job
        first = progress.epoch > self._progress_epoch.get(job, -1)
        if first:
            self._progress_epoch[job] = progress.epoch
        # A stall of an earlier epoch (or of another pod of the name) is no stall of this run:
        # the same worker hanging again at the next epoch is news.
        same_run = held is not None and (held.uid, held.epoch) == (progress.uid, progress.epoch)
        was_stalled = same_run and held is not None and held.stalled_since is not None
        stalled = progress.stalled_since is not None
        return first or was_stalled != stalled or progress.shifted(held)

    def progress(self, namespace: str, pod: str) -> ProgressReport | None:
        """The pod's latest progress, if its agent sent any."""
        job = self._progress_job.get((namespace, pod))
        return self._progress[job].get(pod) if job is not None else None

    def progress_of(self, job: str) -> Mapping[str, ProgressReport]:
        """The latest progress of each worker of GangJob `job` (namespace/name), by pod name.
        Of any epoch: the reader compares `epoch` (and `uid`) with the pod it judges."""
        return MappingProxyType(self._progress.get(job, {}))

    def apply(self, view: PodView) -> PodView:
        """`with_report` of the pod's view and the report held for it, and the progress its
        agent last sent (of this pod: same UID)."""
        key = (view.namespace, view.name)
        report = self._reports.get(key)
        progress = self.progress(view.namespace, view.name)
        if progress is not None and progress.uid != view.uid:
            progress = None
        if report is None and progress is None:
            return view
        hit = self._joined.get(key)
        if hit is not None and hit[0] is view and hit[1] is report and hit[2] is progress:
            return hit[3]
        joined = with_report(view, report) if report is not None else view
        if progress is not None:
            joined = joined.evolve(progress=progress.view())
        self._joined[key] = (view, report, progress, joined)
        return joined

    def job_changed(self, key: str) -> None:
        """Tells the streams of GangJob `key` (namespace/name) that it changed. Called from the
        job cache's event handler: a listener's failure is logged, never raised into it."""
        self._tell(key, False)

    def _tell(self, key: str, closing: bool) -> None:
        for listener in self._listeners:
            try:
                listener(key, closing)
            except Exception:
                log.exception("telling the streams of %r of a change failed", key or "every job")

    def subscribe(self, listener: Callable[[str, bool], None]) -> None:
        """`listener(key, False)` is called at each `job_changed(key)`, `listener("", True)`
        at `close()` (the endpoint's streams: `arrivals/server.py`)."""
        self._listeners.append(listener)
