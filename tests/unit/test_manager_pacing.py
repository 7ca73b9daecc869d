"""The manager paces the passes of a large gang: events during a pass queue the gang again only
as long after the pass as its planning took, so that back-to-back passes over thousands of pods
do not take the CPU the apiserver needs while they restart. Small gangs are never held."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from controller.arrivals.book import Report
from controller.k8s import Kube
from controller.manager import (
    PACE_MAX,
    REPORT_BUDGET,
    REPORT_COALESCE,
    REPORT_COALESCE_MAX,
    Manager,
    Settings,
)
from controller.reconcile import Outcome

KEY = "ml/llama"


class ScriptedReconciler:
    """Each pass takes the next planning time; the first pass also sees a watch event."""

    def __init__(self, manager: Manager, planning: list[float]) -> None:
        self.manager = manager
        self.planning = planning
        self.ended: list[float] = []
        self.started: list[float] = []
        self.all_ran = asyncio.Event()

    async def reconcile(self, key: str) -> Outcome:
        self.started.append(time.monotonic())
        if len(self.started) == 1:
            self.manager._enqueue(key)  # a pod changed while the gang is planned
        outcome = Outcome(planning_seconds=self.planning[len(self.started) - 1])
        self.ended.append(time.monotonic())
        if len(self.ended) == len(self.planning):
            self.all_ran.set()
        return outcome


async def passes(planning: list[float]) -> ScriptedReconciler:
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    script = ScriptedReconciler(manager, planning)
    manager.reconciler = script  # type: ignore[assignment]
    worker = asyncio.create_task(manager._worker())
    try:
        manager._enqueue(KEY)
        async with asyncio.timeout(10):
            await script.all_ran.wait()
    finally:
        worker.cancel()
    return script


async def test_a_large_gang_is_planned_again_only_its_planning_time_after_a_pass() -> None:
    script = await passes([0.3, 0.001])
    assert len(script.started) == 2
    assert script.started[1] - script.ended[0] >= 0.3


async def test_a_small_gang_is_planned_again_at_once() -> None:
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    assert manager._paced(KEY, 0.005) == 0.0
    manager._enqueue(KEY)
    assert (len(manager.queue), manager.queue.waiting) == (1, 0)


async def test_events_after_a_pass_wait_for_the_pace_too_and_it_is_capped() -> None:
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    assert manager._paced(KEY, 30.0) == PACE_MAX
    manager._enqueue(KEY)
    manager._enqueue_arrival(KEY)
    assert (len(manager.queue), manager.queue.waiting) == (0, 1)


async def test_a_report_short_of_the_barrier_waits_a_second_and_the_last_one_none() -> None:
    # The endpoint counts the reports: only the one that completes the barrier needs its pass
    # at once; those before it would each plan the whole gang to refresh a count.
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    due = False
    manager._barrier_due = lambda key: due  # type: ignore[method-assign]
    manager._on_report(KEY)
    assert (len(manager.queue), manager.queue.waiting) == (0, 1)
    ready_at = manager.queue._waiting_at[KEY]
    assert ready_at - time.monotonic() > REPORT_COALESCE - 0.5
    due = True
    manager._on_report(KEY)
    assert len(manager.queue) == 1


async def test_a_gang_that_plans_long_refreshes_its_arrived_counts_less_often() -> None:
    # At N=5000 a pass plans for ~0.15 s, the event loop held (every other report waiting):
    # the passes that only refresh counts keep to REPORT_BUDGET of a core.
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    assert manager._report_coalesce(KEY) == REPORT_COALESCE  # never planned: as small gangs
    manager._paced(KEY, 0.01)
    assert manager._report_coalesce(KEY) == REPORT_COALESCE
    manager._paced(KEY, 0.15)
    assert REPORT_COALESCE < manager._report_coalesce(KEY) < REPORT_COALESCE_MAX
    assert manager._report_coalesce(KEY) == pytest.approx(0.15 / REPORT_BUDGET)
    manager._paced(KEY, 30.0)
    assert manager._report_coalesce(KEY) == REPORT_COALESCE_MAX
    manager._barrier_due = lambda key: False  # type: ignore[method-assign]
    manager._next_pass_at.pop(KEY)
    manager._on_report(KEY)
    assert manager.queue._waiting_at[KEY] - time.monotonic() > REPORT_COALESCE_MAX - 0.5


async def test_a_reported_exit_is_planned_at_once() -> None:
    # In Process mode the kubelet writes nothing for a trainer's exit: the agent's report is
    # the failure, and waiting a second for it was a second added to every restart.
    def manager_told(report: Report) -> Manager:
        manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
        manager._barrier_due = lambda key: False  # type: ignore[method-assign]
        manager.arrivals.record("ml", "llama-3", report, job=KEY)
        manager._on_report(KEY)
        return manager

    arrived = manager_told(Report("u3", 4))
    assert (len(arrived.queue), arrived.queue.waiting) == (0, 1)  # coalesced
    failed = manager_told(Report("u3", 4, exit=(4, 1)))
    assert len(failed.queue) == 1
    assert not failed.arrivals.take_failed(KEY)  # told once


async def test_a_changed_access_review_plans_the_namespaces_gangs() -> None:
    # A review past its ttl answers in the background (the pass used the last answer): when
    # the answer changed, the gangs of that namespace are planned again to say so.
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    for ns, name in (("ml", "a"), ("ml", "b"), ("other", "c")):
        manager.jobs._items[f"{ns}/{name}"] = {"metadata": {"namespace": ns, "name": name}}
    manager._on_access_change("ml")
    assert len(manager.queue) == 2
    assert {await manager.queue.get(), await manager.queue.get()} == {"ml/a", "ml/b"}
