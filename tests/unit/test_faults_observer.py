"""The fault campaign's invariant checks can fail: each one flags a violating history and lets
the matching good one pass (benchmarks/faults/observer.py `Checker`); and the schedule is the
seed's alone."""

from __future__ import annotations

from typing import Any

import pytest

from api.failures import FailureClass, meaning
from benchmarks.faults.observer import (
    FAIL_REASON_EXIT_CODE,
    INVARIANTS,
    Checker,
    FaultOutcome,
    JobFacts,
    LiveTrainer,
)
from benchmarks.faults.schedule import KINDS, schedule


def checker() -> Checker:
    return Checker(terminating_bound=60.0, recovery_bound=120.0)


def job(name: str = "a", uid: str = "j1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "spec": {"replicas": 2}, "status": status}


def flagged(c: Checker) -> list[str]:
    return [v.invariant for v in c.violations]


def running(epoch: int, total: int = 0, counted: int = 0) -> JobFacts:
    return JobFacts("Running", epoch, epoch, total, counted)


def outcome(before: JobFacts, after: JobFacts, **kw: Any) -> FaultOutcome:
    return FaultOutcome(
        "crash", ("a",), {"a": before}, {"a": after}, kw.pop("recovered", True), **kw
    )


# -- duplicate-rank ----------------------------------------------------------------------------


def test_two_live_trainers_of_one_rank_are_flagged() -> None:
    c = checker()
    c.trainers(1.0, [LiveTrainer("a", 0, "u1", 3), LiveTrainer("a", 0, "u2", 3)])
    assert flagged(c) == ["duplicate-rank"]
    # Seen again on the next sample: still one violation, not one per sample.
    c.trainers(1.1, [LiveTrainer("a", 0, "u1", 3), LiveTrainer("a", 0, "u2", 3)])
    assert flagged(c) == ["duplicate-rank"]


def test_one_trainer_per_rank_passes() -> None:
    c = checker()
    c.trainers(1.0, [LiveTrainer("a", 0, "u1", 3), LiveTrainer("a", 1, "u2", 3),
                     LiveTrainer("b", 0, "u3", 3)])  # fmt: skip
    assert flagged(c) == []


# -- stale-epoch -------------------------------------------------------------------------------


def test_a_trainer_behind_the_barrier_is_flagged() -> None:
    c = checker()
    c.job(0.0, "a", job(epoch=4, barrierEpoch=4))
    c.trainers(1.0, [LiveTrainer("a", 1, "u1", 3)])
    assert flagged(c) == ["stale-epoch"]


def test_a_trainer_at_the_barrier_passes() -> None:
    c = checker()
    c.job(0.0, "a", job(epoch=5, barrierEpoch=4))
    c.trainers(1.0, [LiveTrainer("a", 1, "u1", 4)])
    assert flagged(c) == []


# -- end-state ---------------------------------------------------------------------------------


def test_a_gang_not_back_at_an_open_barrier_is_flagged() -> None:
    c = checker()
    stuck = JobFacts("Running", 2, 1, 2, 2)
    c.fault_done(9.0, outcome(running(1, 1, 1), stuck, recovered=False, crashes={"a": 1}))
    assert "end-state" in flagged(c)


@pytest.mark.parametrize(
    "after", [running(0), JobFacts("Failed", 0, 0, 0, 0, "MaxRestartsExceeded")]
)
def test_a_fatal_exit_not_failing_with_the_policys_reason_is_flagged(after: JobFacts) -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(0), after, failing=frozenset({"a"})))
    assert flagged(c) == ["end-state"]


def test_recovered_gangs_pass() -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(1, 1, 1), running(2, 2, 2), crashes={"a": 1},
                              single=frozenset({"a"})))  # fmt: skip
    failed = JobFacts("Failed", 0, 0, 0, 0, FAIL_REASON_EXIT_CODE)
    c.fault_done(9.0, outcome(running(0), failed, failing=frozenset({"a"})))
    assert flagged(c) == []


# -- budget ------------------------------------------------------------------------------------


def test_an_infrastructure_fault_that_counts_is_flagged() -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(1, 1, 0), running(2, 2, 1), infra=True))
    assert flagged(c) == ["budget"]


def test_more_counted_restarts_than_crashes_are_flagged() -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(1, 1, 1), running(3, 3, 3), crashes={"a": 1}))
    assert flagged(c) == ["budget"]


@pytest.mark.parametrize("cls", sorted(c for c in FailureClass if not meaning(c).counted))
def test_a_counted_restart_of_an_uncounted_class_is_flagged(cls: FailureClass) -> None:
    c = checker()
    last = {"epoch": 1, "counted": True, "trigger": {"class": str(cls), "action": "RestartGang"}}
    c.job(1.0, "a", job(epoch=1, lastRestart=last))
    assert flagged(c) == ["budget"]
    c2 = checker()
    c2.job(1.0, "a", job(epoch=1, lastRestart={**last, "counted": False}))
    assert flagged(c2) == []


@pytest.mark.parametrize("cls", sorted(c for c in FailureClass if meaning(c).counted))
def test_a_counted_restart_of_a_counted_class_passes(cls: FailureClass) -> None:
    c = checker()
    last = {"epoch": 1, "counted": True, "trigger": {"class": str(cls), "action": "RestartGang"}}
    c.job(1.0, "a", job(epoch=1, lastRestart=last))
    assert flagged(c) == []


# -- lost-record -------------------------------------------------------------------------------


def test_a_gangjob_that_disappears_is_flagged_unless_the_campaign_deleted_it() -> None:
    c = checker()
    c.job(0.0, "a", job())
    c.job(0.0, "b", job("b", "j2"))
    c.expect_deleted("b")
    c.job(1.0, "a", None)
    c.job(1.0, "b", None)
    assert [(v.invariant, v.job) for v in c.violations] == [("lost-record", "a")]


@pytest.mark.parametrize(
    "later",
    [
        {"epoch": 2, "barrierEpoch": 1, "restarts": {"total": 3, "counted": 1}},
        {"epoch": 3, "barrierEpoch": 3, "restarts": {"total": 2, "counted": 1}},
        {"epoch": 3, "barrierEpoch": 3, "restarts": {"total": 3, "counted": 0}},
        {},
    ],
)
def test_a_status_going_back_is_flagged(later: dict[str, Any]) -> None:
    c = checker()
    c.job(0.0, "a", job(epoch=3, barrierEpoch=2, restarts={"total": 3, "counted": 1}))
    c.job(1.0, "a", job(**later))
    assert "lost-record" in flagged(c)


def test_a_status_moving_on_passes() -> None:
    c = checker()
    c.job(0.0, "a", job(epoch=3, barrierEpoch=2, restarts={"total": 3, "counted": 1}))
    c.job(1.0, "a", job(epoch=3, barrierEpoch=3, restarts={"total": 3, "counted": 1}))
    c.job(2.0, "a", job(uid="new", epoch=0))  # a new GangJob of the name starts again
    assert flagged(c) == []


def pod(rank: int, uid: str = "", terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"a-{rank}",
        "uid": uid or f"p{rank}",
        "labels": {"gangjob.io/name": "a", "gangjob.io/rank": str(rank)},
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_a_rank_without_its_pod_at_the_end_is_flagged() -> None:
    c = checker()
    c.end(9.0, {"a": job(epoch=1, barrierEpoch=1, phase="Running")},
          {"a": [pod(0), pod(1, terminating=True)]}, [])  # fmt: skip
    assert flagged(c) == ["lost-record"]
    c2 = checker()
    c2.end(9.0, {"a": job(epoch=1, barrierEpoch=1, phase="Running")}, {"a": [pod(0), pod(1)]}, [])
    assert flagged(c2) == []


# -- terminating -------------------------------------------------------------------------------


def test_a_pod_terminating_past_the_bound_is_flagged() -> None:
    c = checker()
    c.pod(0.0, pod(0, terminating=True))
    c.tick(59.0)
    assert flagged(c) == []
    c.tick(61.0)
    assert flagged(c) == ["terminating"]


def test_a_pod_gone_within_the_bound_passes() -> None:
    c = checker()
    c.pod(0.0, pod(0, terminating=True))
    c.pod(5.0, pod(0, terminating=True), gone=True)
    c.pod(6.0, pod(1, terminating=True))
    c.pods_listed(7.0, [])  # a relist without it: it went while the watch was down
    c.tick(100.0)
    assert flagged(c) == []


# -- restart-once ------------------------------------------------------------------------------


def test_a_bump_recorded_twice_is_flagged() -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(1, 1, 1), running(2, 3, 2), crashes={"a": 1}))
    assert flagged(c) == ["restart-once"]


def test_one_failure_bumping_twice_is_flagged() -> None:
    c = checker()
    c.fault_done(9.0, outcome(running(1, 1, 1), running(3, 3, 2), crashes={"a": 1},
                              single=frozenset({"a"})))  # fmt: skip
    assert flagged(c) == ["restart-once"]


def test_an_extra_bump_is_named_by_its_trigger() -> None:
    c = checker()
    for epoch, (cls, worker) in enumerate([("NodeLost", 3), ("PodDeleted", 3)], start=2):
        trigger = {"class": cls, "worker": worker, "detail": "seen"}
        c.job(1.0, "a", job(epoch=epoch, lastRestart={"epoch": epoch, "trigger": trigger}))
    c.fault_done(9.0, outcome(running(1, 1), running(3, 3), single=frozenset({"a"})))
    [v] = c.violations
    assert v.invariant == "restart-once"
    assert "2: NodeLost of worker 3 (seen); 3: PodDeleted of worker 3 (seen)" in v.detail


def _node_lost_bumps(c: Checker, nodes: dict[int, str]) -> None:
    """Bumps to epochs 2, 3, ... each for the loss of the node of worker 1, 2, ..."""
    for epoch, (worker, node) in enumerate(nodes.items(), start=2):
        on_node = pod(worker)
        on_node["spec"] = {"nodeName": node}
        c.pod(1.0, on_node)
        trigger = {"class": "NodeLost", "worker": worker, "detail": f"node {node} lost"}
        c.job(1.0, "a", job(epoch=epoch, lastRestart={"epoch": epoch, "trigger": trigger}))


def test_a_bump_for_a_node_the_campaign_did_not_lose_is_a_failure_of_its_own() -> None:
    # The apiserver restarts kept node heartbeats out past the node controller's grace:
    # n2 went NotReady too, and the gang restarted for it as well.
    c = checker()
    c.lost_nodes.add("n1")
    _node_lost_bumps(c, {1: "n1", 2: "n2"})
    c.fault_done(9.0, outcome(running(1, 1), running(3, 3), single=frozenset({"a"})))
    assert c.violations == []
    assert c.collateral == [("a", 3, "n2")]


def test_two_bumps_for_the_one_node_the_campaign_lost_are_flagged() -> None:
    c = checker()
    c.lost_nodes.add("n1")
    _node_lost_bumps(c, {1: "n1", 2: "n1"})
    c.fault_done(9.0, outcome(running(1, 1), running(3, 3), single=frozenset({"a"})))
    assert flagged(c) == ["restart-once"]
    assert c.collateral == []


def test_two_events_for_one_restart_or_a_repeated_history_are_flagged() -> None:
    events = [
        {"reason": "GangRestarting", "involvedObject": {"name": "a"}, "count": 1},
        {"reason": "GangRestarting", "involvedObject": {"name": "a"}, "count": 1},
    ]
    one = job(epoch=1, barrierEpoch=1, phase="Running", restarts={"total": 1})
    c = checker()
    c.end(9.0, {"a": one}, {"a": [pod(0), pod(1)]}, events)
    assert flagged(c) == ["restart-once"]
    twice = job(epoch=2, barrierEpoch=2, phase="Running", restarts={"total": 2},
                history=[{"epoch": 1}, {"epoch": 1}])  # fmt: skip
    c2 = checker()
    c2.end(9.0, {"a": twice}, {"a": [pod(0), pod(1)]}, events)
    assert flagged(c2) == ["restart-once"]


# -- hang --------------------------------------------------------------------------------------


HUNG_AT = 100.0
"""The hung trainer's last step (the campaign's monotonic clock)."""


def _restarted(c: Checker, at: float, cls: str, worker: int | None) -> None:
    """The gang, at epoch 1, restarted to epoch 2 for `cls` of `worker`, seen at `at`."""
    c.job(HUNG_AT - 5, "a", job(epoch=1, barrierEpoch=1))
    trigger = {"class": cls, "worker": worker, "detail": "step 40 unchanged for 10s"}
    last = {"epoch": 2, "counted": True, "trigger": trigger}
    c.job(at, "a", job(epoch=2, barrierEpoch=1, lastRestart=last))
    c.job(at + 1, "a", job(epoch=2, barrierEpoch=2, lastRestart=last))


def _hung(c: Checker, worker: int = 1) -> None:
    hung = {"a": (worker, HUNG_AT)}
    after = outcome(running(1, 1, 1), running(2, 2, 2), crashes={"a": 1}, hung=hung)
    c.fault_done(HUNG_AT + 20, after)


def test_a_hang_restarting_its_gang_naming_the_hung_worker_within_the_bound_passes() -> None:
    c = Checker(terminating_bound=60.0, recovery_bound=120.0, hang_bound=15.0)
    _restarted(c, HUNG_AT + 12.0, "Hang", 1)
    _hung(c)
    assert flagged(c) == []


@pytest.mark.parametrize(
    ("cls", "worker"), [("Hang", 0), ("Hang", None), ("ProcessExit", 1), ("OOMKilled", 1)]
)
def test_a_hang_restart_naming_another_worker_or_class_is_flagged(
    cls: str, worker: int | None
) -> None:
    c = Checker(terminating_bound=60.0, recovery_bound=120.0, hang_bound=15.0)
    _restarted(c, HUNG_AT + 12.0, cls, worker)
    _hung(c)
    assert flagged(c) == ["hang"]
    assert f"{cls} of worker {worker}; want Hang of worker 1" in c.violations[0].detail


def test_a_hang_restart_later_than_the_bound_is_flagged() -> None:
    c = Checker(terminating_bound=60.0, recovery_bound=120.0, hang_bound=15.0)
    _restarted(c, HUNG_AT + 16.0, "Hang", 1)
    _hung(c)
    assert flagged(c) == ["hang"]
    assert "16.0s after worker 1's last step; bound 15s" in c.violations[0].detail


def test_a_hang_that_never_restarted_the_gang_is_flagged() -> None:
    c = Checker(terminating_bound=60.0, recovery_bound=120.0, hang_bound=15.0)
    c.job(HUNG_AT - 5, "a", job(epoch=1, barrierEpoch=1))
    c.fault_done(HUNG_AT + 130, outcome(running(1, 1, 1), running(1, 1, 1), recovered=False,
                                        crashes={"a": 1}, hung={"a": (1, HUNG_AT)}))  # fmt: skip
    assert "hang" in flagged(c)


# -- straggler ---------------------------------------------------------------------------------

SLOWED_AT = 200.0
"""When the campaign slowed the worker's device."""


def _listed(c: Checker, at: float, ranks: list[int] | None, epoch: int = 1, **status: Any) -> None:
    c.job(at, "a", job(epoch=epoch, barrierEpoch=epoch, progress={"stragglers": ranks}, **status))


def _moved(c: Checker, worker: int, cls: str = "Straggler", to: str = "n2") -> None:
    """Named at +20 s, restarted to epoch 2 for `cls` of `worker`, its pod now on `to`."""
    c.pod(SLOWED_AT - 1, {"metadata": {"uid": "p1", "labels": {"gangjob.io/name": "a",
          "gangjob.io/rank": str(worker)}}, "spec": {"nodeName": "n1"}})  # fmt: skip
    _listed(c, SLOWED_AT + 20, [worker])
    trigger = {"class": cls, "worker": worker}
    _listed(c, SLOWED_AT + 20, [worker], epoch=2, lastRestart={"epoch": 2, "trigger": trigger})
    c.pod(SLOWED_AT + 22, {"metadata": {"uid": "p2", "labels": {"gangjob.io/name": "a",
          "gangjob.io/rank": str(worker)}}, "spec": {"nodeName": to}})  # fmt: skip


def _slowed_outcome(worker: int, moves: bool, after: int) -> FaultOutcome:
    slowed = {"a": (worker, "n1", moves, SLOWED_AT)}
    return outcome(running(1, 1), running(after, after), infra=True, slowed=slowed)


def test_a_slowed_worker_named_and_moved_off_its_node_passes() -> None:
    c = checker()
    _listed(c, SLOWED_AT - 5, None)
    c.expect_straggler("a", 1)
    _moved(c, 1)
    c.fault_done(SLOWED_AT + 30, _slowed_outcome(1, moves=True, after=2))
    assert flagged(c) == []
    assert c.straggler_detections == [("a", 1, 20.0)]


@pytest.mark.parametrize(("cls", "to"), [("ProcessExit", "n2"), ("Straggler", "n1")])
def test_a_straggler_not_moved_for_itself_or_left_on_its_node_is_flagged(cls: str, to: str) -> None:
    c = checker()
    c.expect_straggler("a", 1)
    _moved(c, 1, cls, to)
    c.fault_done(SLOWED_AT + 30, _slowed_outcome(1, moves=True, after=2))
    assert flagged(c) == ["straggler"]


def test_a_straggler_only_reported_that_restarts_its_gang_is_flagged() -> None:
    c = checker()
    c.expect_straggler("a", 1)
    _listed(c, SLOWED_AT + 20, [1])
    assert c.named("a", 1)
    assert c.listed("a", 1)
    c.fault_done(SLOWED_AT + 30, _slowed_outcome(1, moves=False, after=1))
    assert flagged(c) == []
    c.expect_straggler("a", 1)
    _listed(c, SLOWED_AT + 40, None)
    _listed(c, SLOWED_AT + 50, [1])
    c.fault_done(SLOWED_AT + 60, _slowed_outcome(1, moves=False, after=2))
    assert flagged(c) == ["straggler"]


def test_a_healthy_worker_named_or_a_slow_one_never_named_is_flagged() -> None:
    c = checker()
    c.expect_straggler("a", 1)
    _listed(c, SLOWED_AT + 20, [1, 3])  # rank 3's device is fine
    assert flagged(c) == ["straggler"]
    assert "worker 3 named a straggler; its device was not slowed" in c.violations[0].detail
    c2 = checker()
    c2.expect_straggler("a", 1)
    c2.fault_done(SLOWED_AT + 130, _slowed_outcome(1, moves=False, after=1))
    assert flagged(c2) == ["straggler"]


def test_a_straggler_named_later_than_the_bound_is_flagged() -> None:
    c = Checker(terminating_bound=60.0, recovery_bound=120.0, straggler_bound=30.0)
    c.expect_straggler("a", 1)
    _listed(c, SLOWED_AT + 31, [1])
    c.fault_done(SLOWED_AT + 40, _slowed_outcome(1, moves=False, after=1))
    assert flagged(c) == ["straggler"]


def test_every_invariant_has_a_test_that_flags_it() -> None:
    tested = {
        "duplicate-rank", "stale-epoch", "end-state", "budget", "lost-record", "terminating",
        "restart-once", "hang", "straggler",
    }  # fmt: skip
    assert set(INVARIANTS) == tested


# -- the schedule ------------------------------------------------------------------------------


def test_the_schedule_is_the_seeds_and_covers_every_kind_evenly() -> None:
    assert schedule(7, 120) == schedule(7, 120)
    assert schedule(7, 120) != schedule(8, 120)
    full = schedule(1, 8 * len(KINDS))
    assert {k: full.count(k) for k in KINDS} == dict.fromkeys(KINDS, 8)
    short = schedule(1, 10)
    assert len(short) == len(set(short)) == 10
