"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

One candidate holds the Lease and renews it every `retry_period`; one that has not renewed
within `renew_deadline` stops leading (and the process exits) before the others may take over
at `lease_duration`. Expiry is judged on this process's monotonic clock from when it last saw
the record change, never from the timestamps in the record, so clock skew between machines
does not matter. The decisions are pure functions; `LeaderElector` does the I/O through a
`controller.k8s.ObjectApi` (`Kube` is one).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from controller.k8s.errors import AlreadyExists, ApiError, Conflict, NotFound
from controller.k8s.kinds import LEASES, JsonDict
from controller.k8s.verbs import ObjectApi
from controller.runtime import metrics
from controller.runtime.clock import MONOTONIC, Clock, utcnow

__all__ = [
    "LeaderElectionConfig",
    "LeaderElector",
    "LeaseObservation",
    "LeaseRecord",
    "next_record",
]

log = logging.getLogger(__name__)

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def timing_problem(
    lease: float,
    renew: float,
    retry: float,
    names: tuple[str, str, str] = ("lease_duration", "renew_deadline", "retry_period"),
) -> str | None:
    """What is wrong with a Lease's timing, naming its parts by `names` (the config's fields,
    or the controller's flags); None if nothing. client-go's own checks: the leader must give
    up before others may take over, and must get more than one try (with its 1.2 jitter) at
    renewing before that."""
    if not lease > renew:
        return f"{names[0]} must be greater than {names[1]}"
    if not renew > 1.2 * retry:
        return f"{names[1]} must be greater than 1.2 * {names[2]}"
    return None


@dataclass(frozen=True)
class LeaderElectionConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    request_timeout: float = 5.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        problem = timing_problem(self.lease_duration, self.renew_deadline, self.retry_period)
        if problem is not None:
            raise ValueError(problem)
        if not self.identity:
            raise ValueError("identity must not be empty")


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease spec fields leader election uses."""

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int = 0

    @classmethod
    def from_lease(cls, lease: JsonDict) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> JsonDict:
        spec: JsonDict = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            spec["renewTime"] = self.renew_time
        return spec


def microtime(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime(MICROTIME)


def next_record(
    current: LeaseRecord | None, identity: str, lease_duration: float, now: dt.datetime
) -> LeaseRecord:
    """The record to write to take or keep the lease: a new holder counts a transition and
    sets acquireTime; the same holder only renews."""
    stamp = microtime(now)
    duration = max(1, round(lease_duration))
    if current is None:
        return LeaseRecord(identity, duration, stamp, stamp, 0)
    if current.holder_identity == identity:
        return replace(
            current,
            lease_duration_seconds=duration,
            renew_time=stamp,
            acquire_time=current.acquire_time or stamp,
        )
    return LeaseRecord(identity, duration, stamp, stamp, current.lease_transitions + 1)


def released_record(current: LeaseRecord, now: dt.datetime) -> LeaseRecord:
    """What a leader writes on a clean exit: no holder, so the next candidate need not wait."""
    stamp = microtime(now)
    return LeaseRecord("", 1, stamp, stamp, current.lease_transitions)


@dataclass
class LeaseObservation:
    """What one candidate has seen of the lease, and when (on its monotonic clock)."""

    record: LeaseRecord | None = None
    observed_at: float = 0.0

    def observe(self, record: LeaseRecord, now: float) -> None:
        """Note `record`; the expiry clock restarts only when the record changed."""
        if record != self.record:
            self.record = record
            self.observed_at = now

    def held_by_other(self, identity: str, now: float, default_duration: float) -> bool:
        """True while another holder's lease is still valid from our point of view."""
        record = self.record
        if record is None or not record.holder_identity or record.holder_identity == identity:
            return False
        duration = record.lease_duration_seconds or default_duration
        return now < self.observed_at + duration


def renew_deadline_passed(last_renew: float, now: float, renew_deadline: float) -> bool:
    return now >= last_renew + renew_deadline


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(
        self,
        client: ObjectApi,
        config: LeaderElectionConfig,
        *,
        clock: Clock = MONOTONIC,
        wall: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.config = config
        self._client = client
        self._clock = clock
        self._wall = wall
        self._observation = LeaseObservation()
        self._lease: JsonDict | None = None  # the Lease as last read or written by us
        self._last_renew: float | None = None
        self.is_leader = False
        self._status = metrics.LEADER_STATUS.labels(config.name)

    @property
    def observed_holder(self) -> str:
        record = self._observation.record
        return record.holder_identity if record else ""

    def healthy(self, tolerance: float = 20.0) -> bool:
        """False when we think we lead but have not renewed for lease_duration + tolerance:
        the election loop is stuck (client-go's HealthzAdaptor)."""
        if not self.is_leader or self._last_renew is None:
            return True
        return self._clock.now() < self._last_renew + self.config.lease_duration + tolerance

    async def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One attempt to take or keep the lease; True if we hold it now."""
        cfg = self.config
        # Leader's fast path: write over our own last copy; a Conflict means someone else
        # wrote, and the slow path below re-reads.
        if self.is_leader and self._lease is not None and await self._write(self._lease, deadline):
            return True
        try:
            lease = await self._client.get(
                LEASES,
                cfg.name,
                cfg.namespace,
                request_timeout=self._timeout(deadline),
                retry=False,
            )
        except NotFound:
            return await self._create(deadline)
        except ApiError as error:
            log.warning("lease %s/%s: get failed: %s", cfg.namespace, cfg.name, error)
            return False
        now = self._clock.now()
        self._observation.observe(LeaseRecord.from_lease(lease), now)
        self._lease = lease
        if self._observation.held_by_other(cfg.identity, now, cfg.lease_duration):
            return False
        return await self._write(lease, deadline)

    async def _create(self, deadline: float | None) -> bool:
        cfg = self.config
        record = next_record(None, cfg.identity, cfg.lease_duration, self._wall())
        body: JsonDict = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": record.to_spec(),
        }
        try:
            created = await self._client.create(
                LEASES, body, cfg.namespace, request_timeout=self._timeout(deadline), retry=False
            )
        except AlreadyExists:
            return False
        except ApiError as error:
            log.warning("lease %s/%s: create failed: %s", cfg.namespace, cfg.name, error)
            return False
        self._accept(created)
        return True

    async def _write(self, lease: JsonDict, deadline: float | None) -> bool:
        cfg = self.config
        current = LeaseRecord.from_lease(lease)
        record = next_record(current, cfg.identity, cfg.lease_duration, self._wall())
        try:
            # The body carries the resourceVersion we read: a concurrent writer wins, we lose.
            written = await self._put(lease, record, self._timeout(deadline))
        except ApiError as error:
            log.info("lease %s/%s: update failed: %s", cfg.namespace, cfg.name, error)
            return False
        self._accept(written)
        return True

    async def _put(self, lease: JsonDict, record: LeaseRecord, timeout: float) -> JsonDict:
        """`lease` (its resourceVersion with it) written with `record`'s spec."""
        cfg = self.config
        body = copy.deepcopy(lease)
        body["spec"] = {**(lease.get("spec") or {}), **record.to_spec()}
        return await self._client.replace(
            LEASES, cfg.name, body, cfg.namespace, request_timeout=timeout, retry=False
        )

    def _accept(self, lease: JsonDict) -> None:
        self._lease = lease
        now = self._clock.now()
        self._observation.observe(LeaseRecord.from_lease(lease), now)
        self._last_renew = now

    def _timeout(self, deadline: float | None) -> float:
        timeout = self.config.request_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - self._clock.now())
        return max(0.1, timeout)

    def _jittered(self, period: float) -> float:
        return period * (1 + random.random() * 0.2)

    async def release(self) -> bool:
        """Give the lease up if we still hold it (so a successor need not wait it out).

        Our copy can be one write behind: a renewal cancelled in flight (a SIGTERM stops the
        renewing task mid-request) may have reached the apiserver without its answer reaching
        us. Its Conflict is then ours, not a successor's: re-read once, and release the fresh
        copy if it still names us."""
        cfg = self.config
        lease = self._lease
        for attempt in range(2):
            if lease is None or LeaseRecord.from_lease(lease).holder_identity != cfg.identity:
                return False
            record = released_record(LeaseRecord.from_lease(lease), self._wall())
            try:
                written = await self._put(lease, record, cfg.request_timeout)
            except Conflict:
                if attempt:
                    log.warning("lease %s/%s: release conflicted twice", cfg.namespace, cfg.name)
                    return False
                try:
                    lease = await self._client.get(
                        LEASES,
                        cfg.name,
                        cfg.namespace,
                        request_timeout=cfg.request_timeout,
                        retry=False,
                    )
                except ApiError as error:
                    log.warning("lease %s/%s: release failed: %s", cfg.namespace, cfg.name, error)
                    return False
                continue
            except ApiError as error:
                log.warning("lease %s/%s: release failed: %s", cfg.namespace, cfg.name, error)
                return False
            self._lease = written
            self._observation.observe(LeaseRecord.from_lease(written), self._clock.now())
            return True
        return False

    async def acquire(self) -> None:
        """Return once we hold the lease, retrying every retry_period (jittered)."""
        cfg = self.config
        log.info("lease %s/%s: %s is trying to acquire", cfg.namespace, cfg.name, cfg.identity)
        while not await self.try_acquire_or_renew():
            await self._clock.sleep(self._jittered(cfg.retry_period))
        self.is_leader = True
        self._status.set(1)
        log.info("lease %s/%s: %s acquired", cfg.namespace, cfg.name, cfg.identity)

    async def renew_until_lost(self) -> None:
        """Keep renewing; return when the renew deadline passed without a renewal."""
        cfg = self.config
        while True:
            await self._clock.sleep(cfg.retry_period)
            assert self._last_renew is not None
            deadline = self._last_renew + cfg.renew_deadline
            while not await self.try_acquire_or_renew(deadline):
                now = self._clock.now()
                if renew_deadline_passed(self._last_renew, now, cfg.renew_deadline):
                    log.error(
                        "lease %s/%s: %s failed to renew within %.0fs; stopping leading",
                        cfg.namespace,
                        cfg.name,
                        cfg.identity,
                        cfg.renew_deadline,
                    )
                    return
                await self._clock.sleep(min(cfg.retry_period, deadline - now))

    async def run(
        self,
        on_started_leading: Callable[[], Awaitable[Any]],
        on_stopped_leading: Callable[[], Any],
    ) -> None:
        """Acquire; run `on_started_leading()` as a task while renewing; when the lease is lost
        (or that task ends, or this is cancelled) cancel the task, release the lease if we
        left cleanly, and call `on_stopped_leading()`. Returns after losing the lease; the
        caller is expected to exit the process then."""
        await self.acquire()
        work = asyncio.ensure_future(on_started_leading())
        renewing = asyncio.ensure_future(self.renew_until_lost())
        lost = False
        try:
            await asyncio.wait({work, renewing}, return_when=asyncio.FIRST_COMPLETED)
            lost = renewing.done()
        finally:
            for task in (renewing, work):
                task.cancel()
            for task in (renewing, work):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.is_leader = False
            self._status.set(0)
            if not lost and self.config.release_on_cancel:
                await self.release()
            on_stopped_leading()
        if work.done() and not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
