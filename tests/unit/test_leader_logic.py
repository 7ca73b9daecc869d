"""Leader election: the pure decisions, then the elector against an in-memory apiserver."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from controller.k8s import LEASES
from controller.k8s.leader import (
    LeaderElectionConfig,
    LeaderElector,
    LeaseObservation,
    LeaseRecord,
    next_record,
    released_record,
    renew_deadline_passed,
)
from tests.unit.fakes import FakeApi, JumpClock

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def config(identity: str) -> LeaderElectionConfig:
    return LeaderElectionConfig(name="gangjob-controller", namespace="sys", identity=identity)


# -- pure decisions ------------------------------------------------------------------------------


def test_first_holder_starts_at_zero_transitions() -> None:
    r = next_record(None, "a", 15, T0)
    assert r == LeaseRecord("a", 15, "2026-01-01T00:00:00.000000Z", r.renew_time, 0)


def test_same_holder_renews_and_keeps_acquire_time() -> None:
    first = next_record(None, "a", 15, T0)
    later = next_record(first, "a", 15, T0 + dt.timedelta(seconds=2))
    assert later.acquire_time == first.acquire_time
    assert later.renew_time == "2026-01-01T00:00:02.000000Z"
    assert later.lease_transitions == 0


def test_new_holder_counts_a_transition() -> None:
    first = next_record(None, "a", 15, T0)
    taken = next_record(first, "b", 15, T0 + dt.timedelta(seconds=20))
    assert taken.holder_identity == "b"
    assert taken.lease_transitions == 1
    assert taken.acquire_time == "2026-01-01T00:00:20.000000Z"


def test_released_record_has_no_holder() -> None:
    released = released_record(next_record(None, "a", 15, T0), T0)
    assert released.holder_identity == ""
    assert released.lease_duration_seconds == 1


def test_expiry_counts_from_when_the_record_was_last_seen_changing() -> None:
    obs = LeaseObservation()
    held = next_record(None, "a", 15, T0)
    obs.observe(held, now=100.0)
    assert obs.held_by_other("b", 114.9, 15)
    obs.observe(held, now=110.0)  # unchanged: the expiry clock does not restart
    assert not obs.held_by_other("b", 115.0, 15)
    renewed = next_record(held, "a", 15, T0 + dt.timedelta(seconds=2))
    obs.observe(renewed, now=112.0)
    assert obs.held_by_other("b", 126.9, 15)
    assert not obs.held_by_other("a", 113.0, 15), "our own lease is never held by another"


def test_an_empty_holder_is_free() -> None:
    obs = LeaseObservation()
    obs.observe(released_record(next_record(None, "a", 15, T0), T0), now=100.0)
    assert not obs.held_by_other("b", 100.0, 15)


def test_renew_deadline() -> None:
    assert not renew_deadline_passed(100.0, 109.9, 10.0)
    assert renew_deadline_passed(100.0, 110.0, 10.0)


@pytest.mark.parametrize(("lease", "renew", "retry"), [(10, 10, 2), (15, 10, 9), (15, 10, 8.5)])
def test_config_rejects_unsafe_timings(lease: float, renew: float, retry: float) -> None:
    with pytest.raises(ValueError, match="must be greater"):
        LeaderElectionConfig("l", "ns", "me", lease, renew, retry)


# -- the elector against a fake apiserver --------------------------------------------------------


async def test_one_acquires_the_other_waits_for_expiry() -> None:
    api, clock = FakeApi(), JumpClock()
    a = LeaderElector(api, config("a"), clock=clock, wall=lambda: T0)
    b = LeaderElector(api, config("b"), clock=clock, wall=lambda: T0)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert b.observed_holder == "a"
    await clock.sleep(14.0)
    assert not await b.try_acquire_or_renew()
    await clock.sleep(1.0)  # 15 s after b first saw a's record, unchanged
    assert await b.try_acquire_or_renew()
    lease = api.objects[(LEASES.resource, "sys", "gangjob-controller")]
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a's fast-path renewal now conflicts; re-reading shows b's fresh lease.
    a.is_leader = True
    assert not await a.try_acquire_or_renew()


async def test_renewals_keep_others_out() -> None:
    api, clock = FakeApi(), JumpClock()
    a = LeaderElector(api, config("a"), clock=clock)
    b = LeaderElector(api, config("b"), clock=clock)
    await a.acquire()
    for _ in range(20):
        await clock.sleep(2.0)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()


async def test_release_lets_the_next_candidate_in_at_once() -> None:
    api, clock = FakeApi(), JumpClock()
    a = LeaderElector(api, config("a"), clock=clock)
    b = LeaderElector(api, config("b"), clock=clock)
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    assert await a.release()
    assert await b.try_acquire_or_renew()
    assert not await a.release(), "a no longer holds it"


async def test_release_after_a_renewal_whose_answer_was_lost_still_releases() -> None:
    # A SIGTERM cancels the renewing task mid-request: the apiserver took the renewal, the
    # elector never saw its answer, and its copy is one resourceVersion behind.
    api, clock = FakeApi(), JumpClock()
    a = LeaderElector(api, config("a"), clock=clock)
    b = LeaderElector(api, config("b"), clock=clock)
    await a.acquire()
    key = (LEASES.resource, "sys", "gangjob-controller")
    stale = a._lease
    assert await a.try_acquire_or_renew()  # the renewal that landed
    a._lease = stale
    assert await a.release()
    assert api.objects[key]["spec"]["holderIdentity"] == ""
    assert await b.try_acquire_or_renew()
    # Taken by b meanwhile: a's stale copy conflicts, the re-read names b, nothing is written.
    a._lease = stale
    assert not await a.release()
    assert api.objects[key]["spec"]["holderIdentity"] == "b"


async def test_run_stops_leading_when_renewals_fail_past_the_deadline() -> None:
    api, clock = FakeApi(), JumpClock()
    api.down_after_calls = 4  # get + create to acquire, two renewals, then unreachable
    elector = LeaderElector(api, config("a"), clock=clock)
    work_cancelled = asyncio.Event()
    stopped: list[float] = []

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            work_cancelled.set()
            raise

    await asyncio.wait_for(elector.run(work, lambda: stopped.append(clock.now())), 5)
    assert work_cancelled.is_set()
    assert not elector.is_leader
    assert elector._last_renew is not None
    assert len(stopped) == 1
    # It gave up at the renew deadline after its last renewal: before the 15 s lease expires
    # for anyone else, and without releasing (the apiserver is unreachable anyway).
    assert stopped[0] - elector._last_renew == pytest.approx(10.0)
    lease = api.objects[(LEASES.resource, "sys", "gangjob-controller")]
    assert lease["spec"]["holderIdentity"] == "a"


async def test_run_releases_the_lease_when_cancelled() -> None:
    api, clock = FakeApi(), JumpClock()
    elector = LeaderElector(api, config("a"), clock=clock)
    started = asyncio.Event()
    stopped: list[bool] = []

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    runner = asyncio.create_task(elector.run(work, lambda: stopped.append(True)))
    await asyncio.wait_for(started.wait(), 5)
    assert elector.is_leader
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert stopped == [True]
    lease = api.objects[(LEASES.resource, "sys", "gangjob-controller")]
    assert lease["spec"]["holderIdentity"] == ""


async def test_run_reraises_a_failure_of_the_leading_work() -> None:
    api, clock = FakeApi(), JumpClock()
    elector = LeaderElector(api, config("a"), clock=clock)
    stopped: list[bool] = []

    async def work() -> None:
        raise RuntimeError("controller crashed")

    with pytest.raises(RuntimeError, match="controller crashed"):
        await elector.run(work, lambda: stopped.append(True))
    assert stopped == [True]
