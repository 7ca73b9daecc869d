"""The arrival proof (docs/design.md section 3.5): a report from another agent incarnation than
the pod's previous one proves the pod restarted, so it counts even while the controller's cache
still shows that restart; the book counts the arrivals per epoch, and the last one triggers the
barrier's pass. Here: the book's rules, how a proven report joins the pod's view, how
classification reads such a view, and that the book's count and `plan` agree on when the
barrier opens, over any order of reports and any lag of the cache."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v1alpha1 import (
    FailureAction,
    GangJobStatus,
    Phase,
    RestartMode,
    RestartRecord,
    RestartTrigger,
)
from controller.arrivals.book import ArrivalBook, Report, with_report
from controller.policy import classify
from controller.policy.plan import Observed, plan
from controller.policy.views import NodeView, PodView
from tests.unit.builders import JOB_NAME, NAMESPACE, T0, make_job, make_node, make_pod, with_status

JOB = f"{NAMESPACE}/{JOB_NAME}"
NOW = T0 + timedelta(minutes=10)
DETECTED = NOW - timedelta(seconds=5)


def test_another_incarnation_at_a_later_epoch_proves_the_restart() -> None:
    book = ArrivalBook()
    book.record(NAMESPACE, "p", Report("u", 0, incarnation="a"), job=JOB)
    assert not book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    book.record(NAMESPACE, "p", Report("u", 1, incarnation="b"), job=JOB)
    assert book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # The stream broke and the same agent sends its report again: still proven.
    book.record(NAMESPACE, "p", Report("u", 1, incarnation="b"), job=JOB)
    assert book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # Process mode: the same agent at the next epoch restarted its trainer, not the pod.
    book.record(NAMESPACE, "p", Report("u", 2, incarnation="b"), job=JOB)
    assert not book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]


def test_an_agent_that_came_back_before_the_epoch_stays_proven_at_it() -> None:
    """Pod mode, the failed worker: its pod restarts (trainer exit) before the controller raises
    the epoch; the new agent finds its state file at the old epoch, says the pod restarted there
    (code unknown), waits, and arrives at the new epoch without another restart. That arrival
    is a restarted pod's: it must count before the kubelet's status write clears the pod's
    `AllContainersRestarting` (at N=1000 that write came 8 s after the last arrival)."""
    book = ArrivalBook()
    book.record(NAMESPACE, "p", Report("u", 1, incarnation="a"), job=JOB)
    book.record(NAMESPACE, "p", Report("u", 1, (1, None), incarnation="b"), job=JOB)
    assert book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    book.record(NAMESPACE, "p", Report("u", 2, incarnation="b"), job=JOB)
    assert book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # Its trainer then ran at 2 (Process mode) or its barrier opened: at 3 it proves nothing.
    book.record(NAMESPACE, "p", Report("u", 3, incarnation="b"), job=JOB)
    assert not book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # A trainer's own exit at an epoch (a code) is no restart of the pod: nothing carries over.
    other = ArrivalBook()
    other.record(NAMESPACE, "p", Report("u", 1, incarnation="a"), job=JOB)
    other.record(NAMESPACE, "p", Report("u", 1, (1, 1), incarnation="a"), job=JOB)
    other.record(NAMESPACE, "p", Report("u", 2, incarnation="a"), job=JOB)
    assert not other.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # Unproven at its own epoch (no earlier report held): not proven later either.
    fresh = ArrivalBook()
    fresh.record(NAMESPACE, "p", Report("u", 1, (1, None), incarnation="b"), job=JOB)
    fresh.record(NAMESPACE, "p", Report("u", 2, incarnation="b"), job=JOB)
    assert not fresh.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]


def test_without_a_known_previous_incarnation_nothing_is_proven() -> None:
    # A controller that restarted holds no previous report: the pod's status decides.
    book = ArrivalBook()
    book.record(NAMESPACE, "p", Report("u", 1, incarnation="b"), job=JOB)
    assert not book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # An agent that sends no incarnation proves nothing, nor does one after it.
    old = ArrivalBook()
    old.record(NAMESPACE, "p", Report("u", 0), job=JOB)
    old.record(NAMESPACE, "p", Report("u", 1, incarnation="b"), job=JOB)
    assert not old.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]
    # A new pod of the name starts over.
    book.record(NAMESPACE, "p", Report("u2", 2, incarnation="c"), job=JOB)
    assert not book.get(NAMESPACE, "p").restarted  # type: ignore[union-attr]


def test_the_book_counts_who_waits_at_each_epoch() -> None:
    book = ArrivalBook()
    for pod in ("a", "b", "c"):
        book.record(NAMESPACE, pod, Report(f"u-{pod}", 0, incarnation="0"), job=JOB)
    assert (book.waiting(JOB, 0), book.waiting(JOB, 1)) == (3, 0)
    book.record(NAMESPACE, "a", Report("u-a", 1, incarnation="1"), job=JOB)
    book.record(NAMESPACE, "b", Report("u-b", 1, incarnation="1"), job=JOB)
    assert (book.waiting(JOB, 0), book.waiting(JOB, 1)) == (1, 2)
    # Failed at 1 (its exit joins its report): no longer one of the barrier's arrivals.
    book.record(NAMESPACE, "b", Report("u-b", 1, (1, None), incarnation="2"), job=JOB)
    assert book.waiting(JOB, 1) == 1
    book.forget(NAMESPACE, "a", "u-a")
    assert book.waiting(JOB, 1) == 0
    book.forget(NAMESPACE, "c", "someone-else")  # not its pod: kept
    assert book.waiting(JOB, 0) == 1
    assert book.waiting("other/job", 0) == 0


RESTARTING: dict[str, tuple[str, str | None]] = {"AllContainersRestarting": ("True", None)}


def view(**kw: Any) -> PodView:
    base = PodView.from_pod(make_pod(0, epoch=0))
    return base.__class__(**{**base.__dict__, **kw})


def test_a_proven_report_counts_while_the_cache_shows_the_restart() -> None:
    stale = view(conditions=RESTARTING)
    unproven = with_report(stale, Report(stale.uid, 1, incarnation="b"))
    assert unproven is stale  # as before: the pod's own status decides
    proven = with_report(stale, Report(stale.uid, 1, incarnation="b", restarted=True))
    assert (proven.arrived_epoch, proven.restarted) == (1, True)
    # An annotation of a later epoch than the report is a later story: no proof for it.
    later = with_report(view(arrived_epoch=2), Report(stale.uid, 1, restarted=True))
    assert (later.arrived_epoch, later.restarted) == (2, False)


def context(barrier_open: bool, mode: RestartMode = RestartMode.POD) -> classify.Context:
    """Epoch 1; its barrier open since NOW, or still closed (the previous one open since T0)."""
    job = make_job(replicas=1)
    opened = NOW if barrier_open else T0
    return classify.Context.of(job, mode, 1, 1 if barrier_open else 0, opened)


def restarting_pod(at: str | None, **kw: Any) -> PodView:
    """Rank 0 at epoch 1, its status showing a whole-pod restart whose trainer exit and
    condition date from `at` (None: no times)."""
    pod = make_pod(0, epoch=1)
    condition = {"type": "AllContainersRestarting", "status": "True"}
    terminated = {"exitCode": 137, "reason": "RestartingAllContainers"}
    if at is not None:
        condition["lastTransitionTime"] = terminated["finishedAt"] = at
    pod["status"]["conditions"].append(condition)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": terminated}
    v = PodView.from_pod(pod)
    return v.__class__(**{**v.__dict__, **kw})


def stamp(at: Any) -> str:
    return str(at.strftime("%Y-%m-%dT%H:%M:%SZ"))


BEFORE = stamp(NOW - timedelta(seconds=3))  # the restart that brought the worker to epoch 1
AFTER = stamp(NOW + timedelta(seconds=2))  # a restart of the worker at epoch 1


@pytest.mark.parametrize(
    ("barrier_open", "at", "restarted", "failure"),
    [
        # Before its barrier opens no trainer ran at the epoch: the status shows the restart
        # that brought the worker there, whatever channel its arrival took.
        (False, BEFORE, False, False),
        (False, BEFORE, True, False),
        (False, None, False, False),
        # After it opens, only a restart since then is a failure at the epoch.
        (True, BEFORE, False, False),
        (True, BEFORE, True, False),
        (True, AFTER, False, True),
        (True, AFTER, True, True),
        # No times in the status: the arrival book's proof decides.
        (True, None, False, True),
        (True, None, True, False),
    ],
)
def test_a_worker_shows_no_failure_from_the_restart_it_came_back_from(
    barrier_open: bool, at: str | None, restarted: bool, failure: bool
) -> None:
    node = NodeView.from_node(make_node())
    pod = restarting_pod(at, restarted=restarted)
    found = classify.detect(context(barrier_open), 0, pod, node)
    assert (found is not None) == failure
    if found is not None:
        assert found.failure_class == "ProcessExit"


@pytest.mark.parametrize("mode", [RestartMode.PROCESS, RestartMode.RECREATE])
def test_without_in_place_pod_restarts_a_dead_trainer_is_a_failure_at_once(
    mode: RestartMode,
) -> None:
    # No kubelet restarts these pods in place: nothing stale to explain, even before a barrier.
    node = NodeView.from_node(make_node())
    assert classify.detect(context(False, mode), 0, restarting_pod(BEFORE), node) is not None


# --- the book and plan agree on when the barrier opens ----------------------------------------


def restarting_gang(replicas: int) -> Any:
    status = GangJobStatus(
        phase=Phase.RESTARTING,
        epoch=1,
        barrier_epoch=0,
        barrier_opened_at=T0,
        start_time=T0,
        mode=RestartMode.POD,
        last_restart=RestartRecord(
            epoch=1,
            trigger=RestartTrigger(
                worker=0,
                failure_class="ProcessExit",
                detail="x",
                action=FailureAction.RESTART_GANG,
            ),
            detected_at=DETECTED,
        ),
    )
    return with_status(make_job(replicas=replicas), status)


def cached_pod(rank: int, lagging: bool) -> dict[str, Any]:
    """Rank `rank` arrived at epoch 0 by annotation; if `lagging`, its cached status still
    shows the restart to epoch 1 (the kubelet's writes not in yet)."""
    pod = make_pod(rank, epoch=0)
    if lagging:
        pod["status"]["phase"] = "Pending"
        pod["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
        pod["status"]["containerStatuses"][0]["state"] = {
            "terminated": {
                "exitCode": 137,
                "reason": "RestartingAllContainers",
                "finishedAt": stamp(DETECTED),
            }
        }
    return pod


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=1, max_value=6).flatmap(
        lambda n: st.tuples(
            st.permutations(range(n)),
            st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=n, max_size=n),
        )
    )
)
def test_the_books_count_and_plan_agree_on_the_barrier(
    case: tuple[list[int], list[list[bool]]],
) -> None:
    order, lags = case
    replicas = len(order)
    job = restarting_gang(replicas)
    nodes = {"node-0": NodeView.from_node(make_node())}
    book = ArrivalBook()
    for rank in range(replicas):  # every agent had reported epoch 0 before the restart
        book.record(NAMESPACE, f"{JOB_NAME}-{rank}", Report(f"uid-{rank}", 0, incarnation="0"), JOB)
    for step, rank in enumerate(order):
        # A new incarnation reports epoch 1, whatever the cache shows of its pod meanwhile.
        report = Report(f"uid-{rank}", 1, incarnation=f"new-{rank}")
        book.record(NAMESPACE, f"{JOB_NAME}-{rank}", report, JOB)
        pods = [book.apply(PodView.from_pod(cached_pod(r, lags[step][r]))) for r in range(replicas)]
        result = plan(Observed(job, pods, nodes, True, NOW))
        complete = book.waiting(JOB, 1) >= replicas
        assert (result.status.barrier_epoch == 1) == complete, (step, lags[step])
        # The restart the workers came back from is never taken for a new failure.
        assert result.status.epoch == 1
        assert result.restart_started is None
        assert result.failures == []
