"""The clocks the controller reads: a monotonic `Clock`, injected so tests drive time, and
`utcnow`, the wall clock for timestamps written to the API.

Deadlines and backoffs use the monotonic clock: a wall-clock step (NTP, a VM resumed) must not
make a lease look expired or a backoff end early.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds and a way to wait for them to pass."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


MONOTONIC = MonotonicClock()


def utcnow() -> dt.datetime:
    """Now on the wall clock, as an aware UTC datetime (Lease and status timestamps, Events)."""
    return dt.datetime.now(dt.UTC)
