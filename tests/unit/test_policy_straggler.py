"""Stragglers (controller/policy/straggler.py): the robust judgement of each worker's compute
against its role's median (the windows' suffix minima, median and MAD, forSeconds over every
window, hysteresis), on jitter, checkpoint steps and hiccups that must not count; and in the
pass, report-only by default (the Event naming pod and node, the condition, the status list)
and a rule that recreates the straggler off its node while the rest restart in place."""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from api.constants import ConditionType
from api.v1alpha1 import FailureAction, ProgressStatus, StragglerSpec
from controller.policy.plan import Observed, plan
from controller.policy.straggler import (
    MIN_WORKERS,
    RUNS_KEPT,
    fold,
    judge,
    run_start,
)
from controller.policy.views import WorkerProgress
from tests.unit.builders import make_node
from tests.unit.gangs import GANG_NOW, carry_out, condition, gang, record, running_status, worker

SPEC = StragglerSpec(ratio=1.5, for_seconds=60)
PERIOD = 30.0
NOW = GANG_NOW


def progress(
    windows: Sequence[tuple[float, float]], epoch: int = 2, reported: float = 0.0
) -> WorkerProgress:
    """A worker's progress after summaries of these windows (seconds before NOW at which each
    began, its median), in order; its latest summary came `reported` seconds before NOW."""
    runs: tuple[tuple[float, float], ...] = ()
    at = NOW.timestamp()
    for ago, median in windows:
        runs = fold(runs, at - ago, median)
    return WorkerProgress(
        epoch=epoch,
        step=100,
        compute_median_seconds=windows[-1][1] if windows else None,
        compute_runs=runs,
        reported_at=NOW - timedelta(seconds=reported),
    )


def steady(median: float, seconds: float = 300.0) -> WorkerProgress:
    """Summaries every PERIOD for `seconds`, each window at `median`."""
    starts = [seconds - i * PERIOD for i in range(int(seconds // PERIOD))]
    return progress([(ago, median) for ago in starts])


def slowed(
    after: float, factor: float, base: float = 1.0, seconds: float = 300.0
) -> WorkerProgress:
    """Steady at `base`, and `factor` times it in the windows of the last `after` seconds."""
    starts = [seconds - i * PERIOD for i in range(int(seconds // PERIOD))]
    return progress([(ago, base * factor if ago <= after else base) for ago in starts])


def stragglers(workers: dict[int, WorkerProgress], **kw: Any) -> list[int]:
    return [s.worker for s in judge([list(workers.items())], SPEC, NOW, **kw).stragglers]


# -- the windows ---------------------------------------------------------------------------


def test_fold_keeps_the_suffix_minima_of_every_window() -> None:
    rng = random.Random(7)
    for _ in range(200):
        medians = [rng.choice([0.5, 1.0, 1.4, 1.6, 2.0, 3.0]) for _ in range(rng.randint(1, 20))]
        runs: tuple[tuple[float, float], ...] = ()
        for i, m in enumerate(medians):
            runs = fold(runs, float(i), m)
        for threshold in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5):
            # The trailing run of windows all at or above the threshold, by brute force.
            start = None
            for i in range(len(medians) - 1, -1, -1):
                if medians[i] < threshold:
                    break
                start = float(i)
            assert run_start(runs, threshold) == start


def test_fold_keeps_a_bounded_stack_and_drops_only_the_oldest() -> None:
    runs: tuple[tuple[float, float], ...] = ()
    for i in range(1000):
        runs = fold(runs, float(i), float(i))  # rising: nothing merges
    assert len(runs) == RUNS_KEPT
    assert runs[-1] == (999.0, 999.0)
    # Dropped from the bottom: a run can only start later than it did, never sooner.
    assert run_start(runs, 0.0) == 1000.0 - RUNS_KEPT


# -- the judgement ---------------------------------------------------------------------------


def test_a_worker_slow_in_every_window_for_for_seconds_is_a_straggler() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    workers[3] = slowed(after=90, factor=2.0)
    judged = judge([list(workers.items())], SPEC, NOW)
    assert [s.worker for s in judged.stragglers] == [3]
    found = judged.stragglers[0]
    assert (found.compute_seconds, found.median_seconds, found.ratio) == (2.0, 1.0, 2.0)
    assert found.since == NOW - timedelta(seconds=90)
    assert found.detail(NOW) == "compute 2s per step, 2.00x its role's median 1s, for 90s"


def test_a_worker_slow_for_less_than_for_seconds_is_not_yet_and_the_pass_looks_again() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    workers[3] = slowed(after=30, factor=2.0)
    judged = judge([list(workers.items())], SPEC, NOW)
    assert judged.stragglers == []
    assert judged.due_at == NOW + timedelta(seconds=SPEC.for_seconds - 30)


def test_one_fast_window_inside_the_run_starts_it_again() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    # Slow for 150 s, but one window 60 s ago was healthy: slow for only 30 s since.
    workers[3] = progress([(150, 2.0), (120, 2.0), (90, 2.0), (60, 1.0), (30, 2.0)])
    assert stragglers(workers) == []


def test_a_checkpoint_window_or_a_hiccup_is_no_straggler() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    # Rank 0 checkpoints: one window in five is slow (a window's median is robust to a slow
    # step; a window of mostly checkpoint steps is not, and it still is one window).
    workers[0] = progress([(150, 1.0), (120, 4.0), (90, 1.0), (60, 1.0), (30, 4.0)])
    # Rank 5's data loader hiccupped for 40 s and recovered.
    workers[5] = progress([(150, 1.0), (120, 3.0), (90, 3.0), (60, 1.0), (30, 1.0)])
    assert stragglers(workers) == []


def test_jitter_of_ten_percent_over_an_hour_finds_no_straggler() -> None:
    # 1000 workers, a window every 30 s for an hour: each window the median of 30 steps with
    # +-10% uniform jitter, every worker judged after every window.
    rng = random.Random(20250528)
    n, windows = 1000, 120
    medians = [
        [statistics.median(1.0 + rng.uniform(-0.1, 0.1) for _ in range(30)) for _ in range(n)]
        for _ in range(windows)
    ]
    runs: list[tuple[tuple[float, float], ...]] = [() for _ in range(n)]
    found = 0
    for k in range(windows):
        at = NOW + timedelta(seconds=(k - windows) * PERIOD)
        for r in range(n):
            runs[r] = fold(runs[r], at.timestamp() - PERIOD, medians[k][r])
        workers = [
            (r, WorkerProgress(2, 1, compute_median_seconds=medians[k][r],
                               compute_runs=runs[r], reported_at=at))
            for r in range(n)
        ]  # fmt: skip
        found += len(judge([workers], SPEC, at).stragglers)
    assert found == 0


def test_single_samples_of_jitter_from_an_old_agent_find_none_either() -> None:
    # An agent that sends no window: its latest step's compute stands for one. +-10% never
    # reaches 1.5x, and a 10% spread keeps the MAD bar below it.
    rng = random.Random(3)
    workers = {
        r: progress([(ago, 1.0 + rng.uniform(-0.1, 0.1)) for ago in range(300, 0, -30)])
        for r in range(200)
    }
    assert stragglers(workers) == []


def test_a_gang_wide_slowdown_is_no_straggler() -> None:
    workers = {r: slowed(after=200, factor=2.0) for r in range(8)}
    assert stragglers(workers) == []
    # Nor is a slow half: the median is a majority's.
    workers = {r: slowed(after=200, factor=2.0 if r % 2 else 1.0) for r in range(8)}
    assert stragglers(workers) == []


def test_too_few_workers_are_not_judged() -> None:
    workers = {r: steady(1.0) for r in range(MIN_WORKERS - 1)}
    workers[MIN_WORKERS - 1] = slowed(after=200, factor=3.0)
    assert stragglers(workers) == [MIN_WORKERS - 1]
    del workers[0]
    assert stragglers(workers) == []


def test_a_role_whose_workers_differ_widely_needs_more_than_the_ratio() -> None:
    # Computes spread over 0.6-1.4 s (uneven shards): 1.6 s is past 1.5x the median, but
    # within 3 MADs of it.
    spread = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4]
    workers = {r: steady(m) for r, m in enumerate(spread)}
    workers[9] = steady(1.6)
    assert stragglers(workers) == []
    workers[9] = steady(2.5)
    assert stragglers(workers) == [9]


def test_a_straggler_stays_one_until_it_is_half_as_slow() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    workers[3] = steady(1.3)  # below 1.5x: a newcomer would not be one
    assert stragglers(workers) == []
    assert stragglers(workers, current=frozenset({3})) == [3]  # above 1.25x: it stays
    workers[3] = steady(1.2)
    assert stragglers(workers, current=frozenset({3})) == []


def test_stale_and_stalled_workers_are_not_judged() -> None:
    workers = {r: steady(1.0) for r in range(8)}
    workers[3] = dataclasses.replace(
        slowed(after=200, factor=2.0), reported_at=NOW - timedelta(seconds=200)
    )
    assert stragglers(workers) == []
    workers[3] = dataclasses.replace(slowed(after=200, factor=2.0), stalled=True)
    assert stragglers(workers) == []


def test_each_role_is_judged_against_its_own_median() -> None:
    workers = [(r, steady(1.0)) for r in range(4)]
    launchers = [(4 + r, steady(5.0)) for r in range(4)]  # another role, slower by design
    assert judge([workers, launchers], SPEC, NOW).stragglers == []


# -- in the pass -----------------------------------------------------------------------------

NODES = [make_node(f"node-{i}") for i in range(4)]


def slow_gang(
    progress_of: dict[int, WorkerProgress], *, rules: list[dict[str, Any]] | None = None,
    status: Any = None, **spec: Any,
) -> Observed:  # fmt: skip
    spec.setdefault("progress", {"straggler": {"ratio": 1.5, "forSeconds": 60}})
    if rules is not None:
        spec["failure_policy"] = {"rules": rules}
    base = gang(
        replicas=4,
        status=status or running_status(2),
        pods=[worker(r, 2, node=f"node-{r}") for r in range(4)],
        nodes=NODES,
        **spec,
    )
    pods = [dataclasses.replace(p, progress=progress_of.get(p.rank or 0)) for p in base.pods]
    return dataclasses.replace(base, pods=pods)


SLOW = {0: steady(1.0), 1: slowed(after=90, factor=2.0), 2: steady(1.0), 3: steady(1.0)}


def test_by_default_a_straggler_is_reported_and_nothing_restarts() -> None:
    observed = slow_gang(SLOW)
    result = plan(observed)
    assert result.status.epoch == 2  # report only
    assert result.delete_pods == []
    assert result.failures == []
    assert result.status.progress is not None
    assert result.status.progress.stragglers == [1]
    [event] = [e for e in result.events if e.reason == "Straggler"]
    assert event.type == "Warning"
    assert event.message.startswith("worker 1 (pod llama-1) on node node-1: compute 2s per step")
    found = condition(result, ConditionType.STRAGGLERS)
    assert found is not None
    assert found[:2] == ("True", "StragglersFound")
    assert "worker 1 (pod llama-1) on node node-1" in found[2]
    # Planned again over its outcome: recorded once, said once.
    again = plan(carry_out(observed, result))
    assert again.events == []
    assert again.status.progress is not None
    assert again.status.progress.stragglers == [1]


def test_without_the_spec_nothing_is_judged() -> None:
    result = plan(slow_gang(SLOW, progress={}))
    assert result.status.progress is not None
    assert result.status.progress.stragglers is None
    assert condition(result, ConditionType.STRAGGLERS) is None


def test_a_rule_recreates_the_straggler_off_its_node_and_restarts_the_rest_in_place() -> None:
    rules = [{"action": "RecreateWorker", "onFailureClasses": ["Straggler"]}]
    result = plan(slow_gang(SLOW, rules=rules))
    r = record(result)
    assert result.status.epoch == 3
    assert (r.trigger.worker, r.trigger.failure_class) == (1, "Straggler")
    assert r.trigger.action is FailureAction.RECREATE_WORKER
    assert "2.00x its role's median" in (r.trigger.detail or "")
    assert r.recreated == [1]
    assert not r.counted  # as the class's row says, unless the rule does
    assert [d.name for d in result.delete_pods] == ["llama-1"]
    assert result.status.avoid_nodes == ["node-1"]
    assert [e.reason for e in result.events if e.reason == "Straggler"] == ["Straggler"]
    counted = [{"action": "RestartGang", "onFailureClasses": ["Straggler"],
                "countsTowardsMaxRestarts": True}]  # fmt: skip
    r = record(plan(slow_gang(SLOW, rules=counted)))
    assert (r.recreated, r.counted) == ([], True)


def test_a_change_is_written_at_once_but_not_twice_within_seconds() -> None:
    written = ProgressStatus(step=90, reporting=4, updated_at=GANG_NOW - timedelta(seconds=2))
    result = plan(slow_gang(SLOW, status=running_status(2, progress=written)))
    assert result.status.progress is not None
    assert result.status.progress.stragglers is None  # not yet
    assert [e for e in result.events if e.reason == "Straggler"] == []
    assert result.requeue_after is not None
    assert result.requeue_after <= 3.0
    written = written.model_copy(update={"updated_at": GANG_NOW - timedelta(seconds=6)})
    result = plan(slow_gang(SLOW, status=running_status(2, progress=written)))
    assert result.status.progress is not None
    assert result.status.progress.stragglers == [1]


def test_a_straggler_that_caught_up_is_no_longer_one() -> None:
    observed = slow_gang(SLOW)
    found = carry_out(observed, plan(observed))
    caught_up = {**SLOW, 1: progress([(90, 2.0), (60, 2.0), (30, 1.0)])}
    pods = [dataclasses.replace(p, progress=caught_up.get(p.rank or 0)) for p in found.pods]
    later = dataclasses.replace(found, pods=pods, now=NOW + timedelta(seconds=10))
    result = plan(later)
    assert result.status.progress is not None
    assert result.status.progress.stragglers is None
    assert condition(result, ConditionType.STRAGGLERS) == (
        "False", "NoStragglers", "no worker straggles at epoch 2",
    )  # fmt: skip


@pytest.mark.parametrize("epoch", [1, 3])
def test_compute_of_another_epoch_is_not_judged(epoch: int) -> None:
    old = {r: dataclasses.replace(p, epoch=epoch) for r, p in SLOW.items()}
    result = plan(slow_gang(old))
    assert [e for e in result.events if e.reason == "Straggler"] == []


def test_while_the_barrier_is_shut_nobody_is_judged() -> None:
    status = running_status(2).model_copy(update={"barrier_epoch": 1})
    result = plan(slow_gang(SLOW, status=status))
    assert [e for e in result.events if e.reason == "Straggler"] == []
