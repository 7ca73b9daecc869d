"""The reconcile work queue, with client-go's semantics.

One entry per key however often it is added; a key is never handed to two workers at once (a
key added while it is being processed is queued again when `done` is called); delayed adds;
per-key exponential backoff for failures (5 ms doubling to 1000 s) under an overall token
bucket (10 qps, burst 100), the slower of the two winning. Time comes from an injected `Clock`.

One departure from client-go: a key handed to a worker drops its pending delayed add. A pass
reads the world as it is when it starts, so a look asked for earlier is served by it, and what
must be looked at again later the pass asks for itself (`done(requeue_after)`, `add_after`).
Client-go's would run it once more: at N=5000, a pass over every worker that decides nothing
(an arrival's coalesced pass, due after the barrier's own pass opened the barrier).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from controller.runtime import metrics
from controller.runtime.clock import MONOTONIC, Clock

__all__ = ["BucketRateLimiter", "ItemExponentialBackoff", "ShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """`get` on a queue that is shut down and drained."""


class ItemExponentialBackoff(Generic[K]):
    """client-go's ItemExponentialFailureRateLimiter: base * 2^failures, capped."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        exp = self._failures.get(key, 0)
        self._failures[key] = exp + 1
        if exp > 64:  # 2**64 * base is past any cap; avoid a float overflow on long outages
            return self.max_delay
        return min(self.base_delay * 2.0**exp, self.max_delay)

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class BucketRateLimiter:
    """A token bucket: each reservation waits until a token is free (tokens may go negative,
    as with Go's rate.Limiter.Reserve)."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = MONOTONIC) -> None:
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    def reserve(self) -> float:
        """Take a token; return how long to wait before using it."""
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


@dataclass(order=True)
class _Delayed(Generic[K]):
    ready_at: float
    seq: int
    key: K = field(compare=False)


class WorkQueue(Generic[K]):
    """A rate-limited, delaying, deduplicating queue of keys (client-go's workqueue).

    Workers loop: `key = await q.get()`, reconcile, then `q.forget(key)` on success or
    `q.add_rate_limited(key)` on failure, and always `q.done(key)`.
    """

    def __init__(
        self,
        name: str,
        *,
        clock: Clock = MONOTONIC,
        base_delay: float = 0.005,
        max_delay: float = 1000.0,
        qps: float = 10.0,
        burst: int = 100,
    ) -> None:
        self.name = name
        self._clock = clock
        self._backoff: ItemExponentialBackoff[K] = ItemExponentialBackoff(base_delay, max_delay)
        self._bucket = BucketRateLimiter(qps, burst, clock)
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}
        self._waiting: list[_Delayed[K]] = []
        self._waiting_at: dict[K, float] = {}
        self._seq = itertools.count()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.Task[None] | None = None
        self._timer_due = 0.0
        self._shutting_down = False
        self._idle: asyncio.Event | None = None
        self._depth = metrics.WORKQUEUE_DEPTH.labels(name)
        self._adds = metrics.WORKQUEUE_ADDS.labels(name)
        self._queue_duration = metrics.WORKQUEUE_QUEUE_DURATION.labels(name)
        self._work_duration = metrics.WORKQUEUE_WORK_DURATION.labels(name)
        self._retries = metrics.WORKQUEUE_RETRIES.labels(name)

    # adding

    def add(self, key: K) -> None:
        """Queue `key` unless it is already queued; if it is being processed, after `done`."""
        if self._shutting_down or key in self._dirty:
            return
        self._adds.inc()
        self._dirty.add(key)
        self._added_at.setdefault(key, self._clock.now())
        if key in self._processing:
            return
        self._queue.append(key)
        self._depth.set(len(self._queue))
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` once `delay` seconds have passed (the earliest of several wins)."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        ready_at = self._clock.now() + delay
        current = self._waiting_at.get(key)
        if current is not None and current <= ready_at:
            return
        # A superseded heap entry stays behind; `_promote_due` skips it by its ready time.
        self._waiting_at[key] = ready_at
        heapq.heappush(self._waiting, _Delayed(ready_at, next(self._seq), key))
        self._arm_timer()

    def add_rate_limited(self, key: K) -> None:
        """Queue `key` again after its backoff (a failure): per-key exponential, bucket-capped."""
        self._retries.inc()
        self.add_after(key, max(self._backoff.when(key), self._bucket.reserve()))

    def forget(self, key: K) -> None:
        """The key succeeded: reset its backoff."""
        self._backoff.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._backoff.num_requeues(key)

    # taking

    def get_nowait(self) -> K | None:
        """The next ready key (now marked processing), or None."""
        self._promote_due()
        if not self._queue:
            return None
        key = self._queue.popleft()
        self._depth.set(len(self._queue))
        now = self._clock.now()
        added = self._added_at.pop(key, None)
        if added is not None:
            self._queue_duration.observe(now - added)
        self._started_at[key] = now
        self._processing.add(key)
        self._dirty.discard(key)
        # Its delayed add is served by this pass (its heap entry, superseded, is skipped).
        self._waiting_at.pop(key, None)
        return key

    async def get(self) -> K:
        """Wait for the next ready key. Raises `ShutDown` once shut down and drained."""
        loop = asyncio.get_running_loop()
        while True:
            key = self.get_nowait()
            if key is not None:
                return key
            if self._shutting_down:
                raise ShutDown(self.name)
            waiter: asyncio.Future[None] = loop.create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # the wake-up meant for us goes to another getter
                elif waiter in self._getters:
                    self._getters.remove(waiter)
                raise

    def done(self, key: K, requeue_after: float = 0.0) -> None:
        """Processing of `key` ended; if it was added meanwhile, it is queued again now, or
        `requeue_after` seconds from now (an add before then still queues it at once)."""
        self._processing.discard(key)
        started = self._started_at.pop(key, None)
        if started is not None:
            self._work_duration.observe(self._clock.now() - started)
        if key in self._dirty and requeue_after > 0:
            self._dirty.discard(key)
            self.add_after(key, requeue_after)
        elif key in self._dirty:
            self._queue.append(key)
            self._depth.set(len(self._queue))
            self._wake_one()
        if not self._processing and self._idle is not None:
            self._idle.set()

    # state

    def __len__(self) -> int:
        """Keys ready to be processed (not delayed, not in processing)."""
        return len(self._queue)

    @property
    def waiting(self) -> int:
        """Keys waiting for a delayed add."""
        return len(self._waiting_at)

    def next_ready_in(self) -> float | None:
        """Seconds until the earliest delayed key is due, or None if none waits."""
        self._drop_superseded()
        if not self._waiting:
            return None
        return max(0.0, self._waiting[0].ready_at - self._clock.now())

    def shutdown(self) -> None:
        """Refuse new keys, drop delayed ones; getters drain what is queued, then `ShutDown`."""
        self._shutting_down = True
        self._waiting.clear()
        self._waiting_at.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def drain(self) -> None:
        """Wait until no key is being processed (after `shutdown`, for a clean exit)."""
        while self._processing:
            self._idle = asyncio.Event()
            await self._idle.wait()

    # internals

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _drop_superseded(self) -> None:
        while self._waiting and self._waiting_at.get(self._waiting[0].key) != (
            self._waiting[0].ready_at
        ):
            heapq.heappop(self._waiting)

    def _promote_due(self) -> None:
        now = self._clock.now()
        while True:
            self._drop_superseded()
            if not self._waiting or self._waiting[0].ready_at > now:
                return
            entry = heapq.heappop(self._waiting)
            del self._waiting_at[entry.key]
            self.add(entry.key)

    def _arm_timer(self) -> None:
        """Keep one task sleeping until the earliest delayed key is due, to wake a getter."""
        self._drop_superseded()
        if not self._waiting:
            return
        due = self._waiting[0].ready_at
        if self._timer is not None and not self._timer.done() and self._timer_due <= due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (synchronous use): get_nowait promotes due keys itself
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = loop.create_task(self._fire(due), name=f"workqueue-{self.name}-timer")

    async def _fire(self, due: float) -> None:
        await self._clock.sleep(due - self._clock.now())
        self._timer = None
        self._promote_due()
        self._arm_timer()
