"""The work queue: dedup, one worker per key, delays, backoff, rate limit, metrics."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.runtime import metrics
from controller.runtime.queue import BucketRateLimiter, ItemExponentialBackoff, ShutDown, WorkQueue
from tests.unit.fakes import FakeClock

_names = itertools.count()


def new_queue(clock: FakeClock | None = None, **kwargs: float) -> tuple[WorkQueue[str], FakeClock]:
    clock = clock or FakeClock()
    return WorkQueue(f"test-{next(_names)}", clock=clock, **kwargs), clock  # type: ignore[arg-type]


def sample(name: str, queue: WorkQueue[str]) -> float:
    value = metrics.REGISTRY.get_sample_value(name, {"name": queue.name})
    return value or 0.0


def test_add_dedups_a_key_that_is_queued() -> None:
    q, _ = new_queue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert sample("workqueue_adds_total", q) == 2
    assert sample("workqueue_depth", q) == 2
    assert [q.get_nowait(), q.get_nowait(), q.get_nowait()] == ["a", "b", None]


def test_a_key_in_processing_is_requeued_only_after_done() -> None:
    q, _ = new_queue()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0, "a key being processed must not be handed to a second worker"
    assert q.get_nowait() is None
    q.done("a")
    assert q.get_nowait() == "a"
    q.done("a")
    assert q.get_nowait() is None


def test_done_without_readd_does_not_requeue() -> None:
    q, _ = new_queue()
    q.add("a")
    assert q.get_nowait() == "a"
    q.done("a")
    assert len(q) == 0


def test_add_after_waits_for_the_clock() -> None:
    q, clock = new_queue()
    q.add_after("a", 1.0)
    assert q.get_nowait() is None
    assert q.waiting == 1
    clock.advance(0.999)
    assert q.get_nowait() is None
    clock.advance(0.001)
    assert q.get_nowait() == "a"
    assert q.waiting == 0


def test_done_can_requeue_a_key_added_meanwhile_after_a_delay() -> None:
    q, clock = new_queue()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # an event while "a" is processed
    q.done("a", requeue_after=0.5)
    assert len(q) == 0
    assert q.waiting == 1
    clock.advance(0.49)
    assert q.get_nowait() is None
    clock.advance(0.02)
    assert q.get_nowait() == "a"
    q.done("a", requeue_after=0.5)  # nothing added meanwhile: nothing queued
    assert (len(q), q.waiting) == (0, 0)


def test_an_add_during_the_requeue_delay_queues_at_once() -> None:
    q, _ = new_queue()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    q.done("a", requeue_after=5.0)
    q.add("a")
    assert q.get_nowait() == "a"


def test_add_after_keeps_the_earliest_time() -> None:
    q, clock = new_queue()
    q.add_after("a", 5.0)
    q.add_after("a", 1.0)
    q.add_after("a", 3.0)
    assert q.next_ready_in() == pytest.approx(1.0)
    clock.advance(1.0)
    assert q.get_nowait() == "a"
    q.done("a")
    clock.advance(10.0)
    assert q.get_nowait() is None, "superseded delays must not add the key again"


def test_a_key_handed_out_drops_its_delayed_add_but_not_one_made_while_it_is_processed() -> None:
    # A pass reads the world when it starts: the look an earlier `add_after` asked for is served
    # by it (client-go would run one more pass, which at N=5000 decides nothing at ~0.2 s).
    q, clock = new_queue()
    q.add_after("a", 1.0)  # an arrival's coalesced pass
    q.add("a")  # the barrier's own, at once
    assert q.get_nowait() == "a"
    assert q.waiting == 0
    q.done("a")
    clock.advance(5.0)
    assert q.get_nowait() is None, "the pass that ran served the delayed add"
    assert q.get_nowait() is None
    # Asked for while the key is processed: a report the running pass may not have read.
    q.add("a")
    assert q.get_nowait() == "a"
    q.add_after("a", 1.0)
    q.done("a")
    clock.advance(1.0)
    assert q.get_nowait() == "a"


def test_add_after_of_a_queued_key_is_deduped_when_due() -> None:
    q, clock = new_queue()
    q.add("a")
    q.add_after("a", 1.0)
    clock.advance(1.0)
    assert q.get_nowait() == "a"
    assert q.get_nowait() is None


def test_item_backoff_doubles_from_5ms_to_1000s_and_forget_resets() -> None:
    backoff: ItemExponentialBackoff[str] = ItemExponentialBackoff()
    delays = [backoff.when("a") for _ in range(20)]
    assert delays[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert max(delays) == 1000.0
    assert backoff.num_requeues("a") == 20
    assert backoff.when("b") == pytest.approx(0.005), "backoff is per key"
    backoff.forget("a")
    assert backoff.when("a") == pytest.approx(0.005)
    for _ in range(200):
        assert backoff.when("c") <= 1000.0


def test_bucket_allows_a_burst_then_qps() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(qps=10, burst=100, clock=clock)
    assert all(bucket.reserve() == 0.0 for _ in range(100))
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    clock.advance(10.0)
    assert bucket.reserve() == 0.0


def test_add_rate_limited_uses_the_slower_of_backoff_and_bucket() -> None:
    q, clock = new_queue(qps=10, burst=1)
    q.add_rate_limited("a")  # backoff 5 ms, bucket free
    assert q.next_ready_in() == pytest.approx(0.005)
    q.add_rate_limited("b")  # backoff 5 ms, bucket empty: 100 ms
    clock.advance(0.005)
    assert q.get_nowait() == "a"
    assert q.get_nowait() is None
    clock.advance(0.095)
    assert q.get_nowait() == "b"
    assert sample("workqueue_retries_total", q) == 2
    assert q.num_requeues("a") == 1
    q.forget("a")
    assert q.num_requeues("a") == 0


def test_queue_and_work_durations_follow_the_clock() -> None:
    q, clock = new_queue()
    q.add("a")
    clock.advance(0.5)
    key = q.get_nowait()
    clock.advance(2.0)
    assert key == "a"
    q.done(key)
    assert sample("workqueue_queue_duration_seconds_sum", q) == pytest.approx(0.5)
    assert sample("workqueue_work_duration_seconds_sum", q) == pytest.approx(2.0)
    assert sample("workqueue_depth", q) == 0


async def test_get_waits_for_an_add() -> None:
    q, _ = new_queue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.add("a")
    assert await asyncio.wait_for(getter, 1) == "a"


async def test_get_wakes_when_a_delayed_key_is_due() -> None:
    q, clock = new_queue()
    getter = asyncio.create_task(q.get())
    q.add_after("a", 2.0)
    await asyncio.sleep(0)  # let the queue's timer start sleeping on the fake clock
    assert clock.sleepers == 1
    clock.advance(1.0)
    await asyncio.sleep(0)
    assert not getter.done()
    clock.advance(1.0)
    assert await asyncio.wait_for(getter, 1) == "a"


async def test_an_earlier_delay_rearms_the_timer() -> None:
    q, clock = new_queue()
    q.add_after("late", 10.0)
    q.add_after("early", 1.0)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    clock.advance(1.0)
    assert await asyncio.wait_for(getter, 1) == "early"


async def test_one_add_wakes_one_of_several_getters() -> None:
    q, _ = new_queue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.add("a")
    q.add("b")
    done, pending = await asyncio.wait(getters, timeout=1, return_when=asyncio.ALL_COMPLETED)
    assert sorted(t.result() for t in done) == ["a", "b"]
    assert len(pending) == 1
    q.shutdown()
    with pytest.raises(ShutDown):
        await asyncio.wait_for(pending.pop(), 1)


async def test_a_cancelled_getter_does_not_swallow_a_wakeup() -> None:
    q, _ = new_queue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("a")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "a"
    assert first.cancelled()


async def test_shutdown_drains_queued_keys_then_raises() -> None:
    q, _ = new_queue()
    q.add("a")
    q.add_after("later", 5.0)
    q.shutdown()
    q.add("b")
    assert await q.get() == "a"
    with pytest.raises(ShutDown):
        await q.get()


async def test_drain_waits_for_keys_in_processing() -> None:
    q, _ = new_queue()
    q.add("a")
    key = await q.get()
    q.shutdown()
    drained = asyncio.create_task(q.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    q.done(key)
    await asyncio.wait_for(drained, 1)


ops = st.lists(
    st.tuples(st.sampled_from(["add", "get", "done", "after", "tick"]), st.sampled_from("abc")),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_invariants_under_any_sequence(sequence: list[tuple[str, str]]) -> None:
    """No key twice in the queue, no key handed out while in processing, nothing lost."""
    q, clock = new_queue()
    processing: set[str] = set()
    wanted: set[str] = set()  # added since its last hand-out
    for op, key in sequence:
        if op == "add":
            q.add(key)
            wanted.add(key)
        elif op == "after":
            q.add_after(key, 1.0)
        elif op == "tick":
            clock.advance(1.0)
        elif op == "get":
            got = q.get_nowait()
            if got is not None:
                assert got not in processing
                processing.add(got)
                wanted.discard(got)
        elif op == "done" and key in processing:
            processing.discard(key)
            q.done(key)
        assert len(set(q._queue)) == len(q._queue)
    # Finish everything: every key added and not yet handed out must come out.
    for key in list(processing):
        q.done(key)
    processing.clear()
    clock.advance(2.0)
    seen: set[str] = set()
    while (got := q.get_nowait()) is not None:
        seen.add(got)
        q.done(got)
    assert wanted <= seen
