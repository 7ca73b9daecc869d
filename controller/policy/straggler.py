"""Stragglers (docs/design.md section 4.9): a worker whose own compute per step has run at least
`spec.progress.straggler.ratio` times its role's median for `forSeconds`. Pure: the judgement
(`judge`) over what the agents summarised, and the pass's step (`find`) that hands it to the
failure policy (class `Straggler`, report-only by default) and the status.

In synchronous training every worker shows the same step time (each waits for the slowest), so
the signal is each worker's own compute (the trainer's `compute=`). It is read robustly, three
times over:

- each agent summarises a *window* of samples (one per poll, since its previous summary) by
  their median: a checkpoint step or a data-loader hiccup is one sample and moves no median;
- the role's baseline is the median of its workers' latest windows, its spread their median
  absolute deviation (MAD): a slow minority moves neither, and a worker is slow only past
  `ratio` x the baseline *and* past 3 MADs of it, so a gang whose workers naturally differ
  widely is not a gang of stragglers;
- a worker is a straggler only when every window it sent over the last `forSeconds` was slow:
  one slow window is not enough.

A straggler stays one while its latest window is at least halfway from the baseline to the
entry threshold (hysteresis: a worker hovering at the threshold does not come and go).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from api.constants import (
    REASON_NO_STRAGGLERS,
    REASON_STRAGGLER,
    REASON_STRAGGLERS_FOUND,
    STRAGGLERS_LIMIT,
    ConditionType,
)
from api.v1alpha1 import ConditionStatus, StragglerSpec
from controller.policy.passstate import EventSpec, Pass, worker_text
from controller.policy.podspec import summary_seconds
from controller.policy.recreate import RANKS_SHOWN
from controller.policy.views import WorkerProgress

MIN_WORKERS: Final = 3
"""A role's workers are judged only when at least this many report compute: the median of two
is their mean, and one of two cannot be told slow."""
SPREAD_MADS: Final = 3.0
"""A slow worker is also this many (scaled) MADs past its role's median."""
MAD_SCALE: Final = 1.4826
"""MAD x this estimates the standard deviation of normally distributed computes."""
STAY_SHARE: Final = 0.5
"""A straggler stays one while its compute is at least this share of the way from the median
to the entry threshold."""
RUNS_KEPT: Final = 32
"""At most this many (start, floor) pairs per worker: past it the oldest goes, which can only
make a straggler's run start later (found later, never sooner)."""
STALE_MARGIN_SECONDS: Final = 10.0
"""A worker's latest summary older than two summary periods and this is not judged (its agent
is out of reach, or its trainer stopped stepping: a hang, if anything)."""


def fold(
    runs: tuple[tuple[float, float], ...], start: float, median: float
) -> tuple[tuple[float, float], ...]:
    """`runs` with a new window (its start, its median) folded in: a stack of (start, floor),
    oldest first, where floor is the lowest median of the windows from `start` to the latest
    (suffix minima). The floors rise toward the latest; windows whose floor the new median
    lowers merge into one, so a window that was slow stays slow only if every later one is.
    For any threshold, the first pair whose floor reaches it starts the trailing run of
    windows all at or above it: `run_start`."""
    kept = list(runs)
    earliest = start
    while kept and kept[-1][1] >= median:
        earliest = min(earliest, kept.pop()[0])
    kept.append((earliest, median))
    return tuple(kept[-RUNS_KEPT:])


def run_start(runs: tuple[tuple[float, float], ...], threshold: float) -> float | None:
    """When the trailing run of windows whose medians all reach `threshold` began; None if
    the latest window does not."""
    for start, floor in runs:
        if floor >= threshold:
            return start
    return None


@dataclass(frozen=True)
class Straggler:
    """A worker found straggling."""

    worker: int
    compute_seconds: float
    """The median of its compute over its latest window."""
    median_seconds: float
    """Its role's median compute."""
    since: datetime
    """When the run of slow windows that made it a straggler began."""

    @property
    def ratio(self) -> float:
        return self.compute_seconds / self.median_seconds

    def detail(self, now: datetime) -> str:
        slow = max(0.0, (now - self.since).total_seconds())
        return (
            f"compute {self.compute_seconds:.3g}s per step, {self.ratio:.2f}x its role's "
            f"median {self.median_seconds:.3g}s, for {slow:.0f}s"
        )


@dataclass(frozen=True)
class Judgement:
    stragglers: list[Straggler]
    """By worker."""
    due_at: datetime | None = None
    """The earliest a slow worker that is no straggler yet becomes one if it stays slow: when
    to look again."""


def judge(
    roles: Sequence[Sequence[tuple[int, WorkerProgress]]],
    spec: StragglerSpec,
    now: datetime,
    current: frozenset[int] = frozenset(),
    fresh_seconds: float = 70.0,
) -> Judgement:
    """The stragglers among each role's workers (worker number, its latest progress at the
    epoch), `current` the ones already found (they stay while half as slow), `fresh_seconds`
    how old a worker's latest summary may be to be read."""
    found: list[Straggler] = []
    due: datetime | None = None
    at = now.timestamp()
    for workers in roles:
        computes = {
            worker: p
            for worker, p in workers
            if p.compute_median_seconds is not None
            and p.reported_at is not None
            and not p.stalled
            and (now - p.reported_at).total_seconds() <= fresh_seconds
        }
        if len(computes) < MIN_WORKERS:
            continue
        medians = [p.compute_median_seconds for p in computes.values()]
        baseline = statistics.median(m for m in medians if m is not None)
        if baseline <= 0:
            continue
        spread = MAD_SCALE * statistics.median(abs(m - baseline) for m in medians if m is not None)
        enter = max(spec.ratio * baseline, baseline + SPREAD_MADS * spread)
        stay = baseline + STAY_SHARE * (enter - baseline)
        for worker in sorted(computes):
            p = computes[worker]
            compute = p.compute_median_seconds
            assert compute is not None
            threshold = stay if worker in current else enter
            start = run_start(p.compute_runs, threshold)
            if start is None:
                continue
            since = datetime.fromtimestamp(start, UTC)
            if worker not in current and at - start < spec.for_seconds:
                turns = since + timedelta(seconds=spec.for_seconds)
                due = turns if due is None else min(due, turns)
                continue
            found.append(Straggler(worker, compute, baseline, since))
    return Judgement(sorted(found, key=lambda s: s.worker), due)


def find(p: Pass) -> bool:
    """The pass's stragglers (`Pass.stragglers`): None when the job does not look for any;
    none while the barrier of the epoch is shut (nobody trains, and a new epoch's compute is
    judged afresh). The failure policy then reads them as class `Straggler`, and
    `progress.account` records them."""
    spec = p.job.spec.progress.straggler
    if spec is None:
        return False
    p.stragglers = []
    if p.status.barrier_epoch != p.status.epoch or p.is_finished():
        return False
    by_role: dict[str, list[tuple[int, WorkerProgress]]] = {}
    for worker in p.active():
        pod = p.gang.live.get(worker)
        progress = pod.progress if pod is not None else None
        if progress is None or progress.epoch != p.status.epoch:
            continue
        by_role.setdefault(p.job.spec.workers[worker].role.name, []).append((worker, progress))
    recorded = p.status.progress.stragglers if p.status.progress is not None else None
    judgement = judge(
        list(by_role.values()),
        spec,
        p.now,
        frozenset(recorded or ()),
        fresh_seconds=fresh_seconds(len(p.job.spec.workers)),
    )
    p.stragglers = judgement.stragglers
    if judgement.due_at is not None:
        p.requeue(max(0.0, (judgement.due_at - p.now).total_seconds()) + 0.05)
    return False


def fresh_seconds(workers: int) -> float:
    """How old a worker's latest summary may be to be judged: two of its agent's summary
    periods (`podspec.summary_seconds`), and a margin."""
    return 2 * summary_seconds(workers) + STALE_MARGIN_SECONDS


def details(p: Pass) -> Mapping[int, str]:
    """The pass's stragglers as the failure policy reads them: worker -> what was found."""
    return {s.worker: s.detail(p.now) for s in p.stragglers or ()}


def ranks(stragglers: Sequence[Straggler]) -> list[int] | None:
    """`status.progress.stragglers`: the workers' numbers, the lowest `STRAGGLERS_LIMIT`."""
    return sorted(s.worker for s in stragglers)[:STRAGGLERS_LIMIT] or None


def announce(p: Pass, before: Sequence[int], after: Sequence[int]) -> None:
    """What the status write that records `after` (was `before`) says: a Warning Event
    `Straggler` for each worker newly found, naming its pod and node, and the condition
    `Stragglers`."""
    if list(before) == list(after):
        return
    found = {s.worker: s for s in p.stragglers or ()}
    for worker in after:
        if worker not in before:
            p.events.append(EventSpec("Warning", REASON_STRAGGLER, f"{_named(p, worker, found)}"))
    if not after:
        p.set_condition(
            ConditionType.STRAGGLERS,
            ConditionStatus.FALSE,
            REASON_NO_STRAGGLERS,
            f"no worker straggles at epoch {p.status.epoch}",
        )
        return
    count = max(len(found), len(after))
    shown = "; ".join(_named(p, w, found) for w in after[:RANKS_SHOWN])
    more = count - min(len(after), RANKS_SHOWN)
    message = f"{count} straggling at epoch {p.status.epoch}: {shown}" + (
        f"; and {more} more" if more > 0 else ""
    )
    p.set_condition(
        ConditionType.STRAGGLERS, ConditionStatus.TRUE, REASON_STRAGGLERS_FOUND, message
    )


def _named(p: Pass, worker: int, found: Mapping[int, Straggler]) -> str:
    pod = p.gang.workers.get(worker)
    node = pod.node_name if pod is not None else None
    where = worker_text(p, worker) + (f" on node {node}" if node else "")
    s = found.get(worker)
    return f"{where}: {s.detail(p.now)}" if s is not None else where
