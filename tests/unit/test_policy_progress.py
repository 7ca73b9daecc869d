"""The gang's progress and goodput (controller/policy/progress.py): `status.progress` from the
agents' reports at a bounded rate, what a failure lost on its restart record, and the lost
time by cause against wall time."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta

import pytest

from api.v1alpha1 import BadputSeconds, GangJobStatus, ProgressStatus
from controller.policy.plan import Observed, plan
from controller.policy.podspec import summary_seconds
from controller.policy.progress import (
    PROGRESS_WRITE_SECONDS,
    gang_progress,
    step_at,
    write_seconds,
)
from controller.policy.views import WorkerProgress
from tests.unit.builders import T0
from tests.unit.gangs import GANG_NOW, carry_out, crashed, gang, record, running_status, worker

Steps = Mapping[int, tuple[int, float, int | None]]


def reporting(observed: Observed, epoch: int, steps: Steps) -> Observed:
    """Each rank's (step, steps/s, checkpoint) reported at `epoch`."""
    pods = []
    for pod in observed.pods:
        step, rate, checkpoint = steps[pod.rank or 0]
        progress = WorkerProgress(
            epoch=epoch, step=step, steps_per_second=rate, checkpoint=checkpoint
        )
        pods.append(dataclasses.replace(pod, progress=progress))
    return dataclasses.replace(observed, pods=pods)


def test_the_gangs_progress_is_its_slowest_worker_and_its_latest_checkpoint() -> None:
    observed = reporting(gang(), 0, {0: (120, 2.0, 100), 1: (119, 1.9, 100), 2: (121, 2.1, 90)})
    progress = plan(observed).status.progress
    assert progress == ProgressStatus(
        step=119,
        steps_per_second=2.0,
        checkpoint_step=100,
        reporting=3,
        updated_at=GANG_NOW.replace(microsecond=0),
    )


def test_the_checkpoint_is_the_latest_any_worker_reported() -> None:
    # A checkpoint is the gang's; a worker that died just after one may not have said so.
    observed = reporting(gang(), 0, {0: (5, 1.0, 4), 1: (5, 1.0, None), 2: (5, 1.0, 2)})
    progress = plan(observed).status.progress
    assert progress is not None
    assert progress.checkpoint_step == 4


def test_progress_is_written_at_most_every_30_seconds_while_the_gang_runs() -> None:
    first = reporting(gang(), 0, {r: (100, 2.0, None) for r in range(3)})
    result = plan(first)
    assert result.status.progress is not None
    assert result.status.progress.step == 100
    assert result.requeue_after == PROGRESS_WRITE_SECONDS
    written = carry_out(first, result)
    later_steps: Steps = {r: (160, 2.0, None) for r in range(3)}
    for later, expected in ((10, 100), (PROGRESS_WRITE_SECONDS, 160)):
        now = GANG_NOW + timedelta(seconds=later)
        moved = reporting(dataclasses.replace(written, now=now), 0, later_steps)
        progress = plan(moved).status.progress
        assert progress is not None
        assert progress.step == expected
    # Between writes the pass only asks to look again when the next write is due.
    ten_later = dataclasses.replace(written, now=GANG_NOW + timedelta(seconds=10))
    moved = reporting(ten_later, 0, later_steps)
    assert plan(moved).requeue_after == pytest.approx(PROGRESS_WRITE_SECONDS - 10)


def test_a_large_gang_refreshes_its_progress_once_per_summary_period() -> None:
    # Its agents summarise every N/50 s: a refresh sooner would extrapolate the same summaries
    # at the cost of a pass over every worker.
    n = 2000
    assert summary_seconds(n) == write_seconds(n) == 40.0
    assert write_seconds(3) == PROGRESS_WRITE_SECONDS
    first = reporting(gang(replicas=n), 0, {r: (100, 2.0, None) for r in range(n)})
    result = plan(first)
    assert result.requeue_after == 40.0
    written = carry_out(first, result)
    for later, expected in ((PROGRESS_WRITE_SECONDS, 100), (40, 180)):
        now = GANG_NOW + timedelta(seconds=later)
        moved = reporting(
            dataclasses.replace(written, now=now), 0, {r: (180, 2.0, None) for r in range(n)}
        )
        progress = plan(moved).status.progress
        assert progress is not None
        assert progress.step == expected


def test_a_restart_records_the_work_it_lost() -> None:
    pods = [crashed(worker(0, 0)), worker(1, 0), worker(2, 0)]
    observed = gang(status=running_status(0), pods=pods)
    observed = reporting(observed, 0, {0: (130, 2.0, 100), 1: (131, 2.0, 100), 2: (130, 2.0, 100)})
    r = record(plan(observed))
    assert (r.step, r.checkpoint_step, r.lost_steps, r.lost_seconds) == (130, 100, 30, 15.0)


def test_goodput_charges_scheduling_detection_restart_and_recompute() -> None:
    at_checkpoint_plus_30 = {r: (130, 2.0, 100) for r in range(3)}
    # Started at T0; every worker arrived and the first barrier opened 20 s later.
    first = gang(
        status=GangJobStatus(start_time=T0),
        pods=[worker(r, 0) for r in range(3)],
        now=T0 + timedelta(seconds=20),
    )
    opened = plan(first).status
    assert opened.barrier_epoch == 0
    assert opened.goodput is not None
    assert opened.goodput.lost_seconds == BadputSeconds(scheduling=20.0)
    # At T0+100 s a trainer crashes with 30 steps since its checkpoint, at 2 steps/s.
    crash_at = T0 + timedelta(seconds=100)
    crashed_gang = gang(
        status=opened,
        pods=[crashed(worker(0, 0)), worker(1, 0), worker(2, 0)],
        now=crash_at,
    )
    bumped = plan(reporting(crashed_gang, 0, at_checkpoint_plus_30)).status
    assert bumped.epoch == 1
    # Every worker is back at epoch 1 three seconds later: the barrier opens.
    back = gang(
        status=bumped, pods=[worker(r, 1) for r in range(3)], now=crash_at + timedelta(seconds=3)
    )
    goodput = plan(back).status.goodput
    assert goodput is not None
    assert goodput.lost_seconds == BadputSeconds(
        scheduling=20.0, detection=0.0, restart=3.0, recompute=15.0
    )
    assert goodput.wall_seconds == 103.0
    assert goodput.productive_seconds == 103.0 - 38.0
    assert goodput.ratio == round(65.0 / 103.0, 4)


def test_a_workers_step_at_the_failure_runs_on_at_its_rate_since_its_last_summary() -> None:
    at = GANG_NOW - timedelta(seconds=10)
    stepping = WorkerProgress(epoch=0, step=100, steps_per_second=2.0, last_step_at=at)
    assert step_at(stepping, GANG_NOW) == 120
    assert step_at(stepping, at - timedelta(seconds=5)) == 100  # never behind its report
    stalled = dataclasses.replace(stepping, stalled=True)
    assert step_at(stalled, GANG_NOW) == 100  # a stall is exact
    first = dataclasses.replace(stepping, steps_per_second=None)
    assert step_at(first, GANG_NOW) == 100  # no rate yet: as reported


def test_at_a_failure_a_stale_step_without_a_rate_is_no_bound_on_the_gang() -> None:
    at = GANG_NOW - timedelta(seconds=5)
    hung = WorkerProgress(epoch=0, step=5, last_step_at=at, stalled=True)
    stale = WorkerProgress(epoch=0, step=3, last_step_at=at - timedelta(seconds=2))
    progress = gang_progress([hung, stale], GANG_NOW, at=at)
    assert progress is not None
    assert progress.step == 5  # not the stale 3, the first summary of a worker still stepping
    alone = gang_progress([stale], GANG_NOW, at=at)
    assert alone is not None
    assert alone.step == 3  # alone, it is all there is to say


def test_at_a_failure_a_stalled_step_beats_an_estimate() -> None:
    # The other worker's last summary was a second old, its rate carrying it to 4.9: it was
    # at the hung worker's step 5 too, which holds the gang.
    at = GANG_NOW - timedelta(seconds=5)
    hung = WorkerProgress(epoch=0, step=5, last_step_at=at, stalled=True)
    stepping = WorkerProgress(
        epoch=0, step=4, steps_per_second=1.0, last_step_at=at - timedelta(seconds=0.9)
    )
    progress = gang_progress([hung, stepping], GANG_NOW, at=at)
    assert progress is not None
    assert progress.step == 5
