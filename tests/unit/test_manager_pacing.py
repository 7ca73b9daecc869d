"""The manager paces the passes of a large gang: events during a pass queue the gang again only
as long after the pass as its planning took, so that back-to-back passes over thousands of pods
do not take the CPU the apiserver needs while they restart. Small gangs are never held."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import cast

import pytest

from api.constants import ANNOTATION_EPOCH, ANNOTATION_RESTART_MODE, LABEL_NAME
from controller.arrivals.book import Report
from controller.k8s import Kube
from controller.k8s.store import StoreEvent
from controller.manager import (
    PACE_MAX,
    REPORT_BUDGET,
    REPORT_COALESCE,
    REPORT_COALESCE_MAX,
    RESTART_EVENT_BUDGET,
    RESTART_EVENT_MAX,
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


def _restart_manager(planning: float) -> Manager:
    """A gang of 2 at epoch 5 whose barrier is shut (it restarts), planned for `planning` s."""
    manager = Manager(cast(Kube, object()), Settings(metrics_address=None, health_address=None))
    manager.jobs._items[KEY] = {
        "metadata": {"namespace": "ml", "name": "llama"},
        "spec": {"replicas": 2},
        "status": {"epoch": 5, "barrierEpoch": 4},
    }
    manager._planning[KEY] = planning
    return manager


def _pod(mode: str = "Pod", **status: object) -> StoreEvent:
    pod = {
        "metadata": {
            "namespace": "ml",
            "name": "llama-1",
            "uid": "u1",
            "labels": {LABEL_NAME: "llama"},
            "annotations": {ANNOTATION_RESTART_MODE: mode},
        },
        "status": {"phase": "Running", **status},
    }
    return StoreEvent("MODIFIED", pod, old=copy.deepcopy(pod))


def _queued_in(manager: Manager) -> float | None:
    """Seconds until the gang's pass, 0 if ready now, None if not queued."""
    if len(manager.queue):
        return 0.0
    at = manager.queue._waiting_at.get(KEY)
    return None if at is None else at - time.monotonic()


async def test_the_kubelets_writes_of_an_in_place_restart_wait_for_a_budgeted_pass() -> None:
    # A Pod-mode restart at N=5000 is ~15,000 pod changes, none of them a failure until the
    # worker arrives: at the pace alone they ran passes back to back, holding every report.
    manager = _restart_manager(0.1)
    manager._on_pod(_pod())
    wait = _queued_in(manager)
    assert wait is not None
    assert wait == pytest.approx(manager._restart_event_wait(KEY), abs=0.1)
    assert wait == pytest.approx(0.1 / RESTART_EVENT_BUDGET, abs=0.1)
    assert RESTART_EVENT_MAX == PACE_MAX  # never later than the pace would have it
    manager._planning[KEY] = 30.0
    assert manager._restart_event_wait(KEY) == RESTART_EVENT_MAX
    # A small gang's pass is cheap: never held.
    small = _restart_manager(0.005)
    small._on_pod(_pod())
    assert _queued_in(small) == 0.0


@pytest.mark.parametrize(
    "case",
    ["arrived-by-report", "arrived-by-annotation", "process-mode", "failed", "deleted",
     "barrier-open", "no-status"],
)  # fmt: skip
async def test_a_change_that_may_be_a_failure_is_looked_at_now(case: str) -> None:
    # Once a worker arrived at the epoch, or where its restart is no kubelet's in-place one, a
    # change of its pod may be a failure of the gang: its pass is not held.
    manager = _restart_manager(0.3)
    event = _pod("Process" if case == "process-mode" else "Pod")
    meta = event.obj["metadata"]
    if case == "arrived-by-report":
        manager.arrivals.record("ml", "llama-1", Report("u1", 5), job=KEY)
    elif case == "arrived-by-annotation":
        meta["annotations"][ANNOTATION_EPOCH] = "5"
        event = StoreEvent("MODIFIED", event.obj, old=copy.deepcopy(event.obj))
    elif case == "failed":
        event.obj["status"]["phase"] = "Failed"
    elif case == "deleted":
        meta["deletionTimestamp"] = "2026-11-28T18:00:00Z"
    elif case == "barrier-open":
        manager.jobs._items[KEY]["status"]["barrierEpoch"] = 5
    elif case == "no-status":
        del manager.jobs._items[KEY]["status"]
    manager._on_pod(event)
    assert _queued_in(manager) == 0.0


async def test_a_report_of_an_older_pod_of_the_name_does_not_count_as_arrived() -> None:
    manager = _restart_manager(0.3)
    manager.arrivals.record("ml", "llama-1", Report("u0", 5), job=KEY)  # the replaced pod's
    assert manager._restarting_in_place(KEY, _pod().obj)
    manager.arrivals.record("ml", "llama-1", Report("u1", 4), job=KEY)  # below the epoch
    assert manager._restarting_in_place(KEY, _pod().obj)
