"""The garbage collector's pace in a controller whose caches hold hundreds of thousands of
objects (docs/scale.md, "The garbage collector").

CPython collects its youngest generation every 700 new container objects. A gang restart at
N=1000 allocates millions (watch events parsed, a view per pod version, a thousand reports and
their streams), nearly all freed by reference counting soon after; at the default pace the
collector ran ~2000 young and ~20 full collections in a scale run (gang start, 6 restarts,
teardown) and took 4.2-5.4 s of the controller's 31-36 s of CPU (benchmarks.scale, N=1000).

A full collection walks every object the caches hold: at N=5000, ~0.5-0.7 s of CPU in one go.
Left to CPython, it starts whenever allocation says so, which is mostly during a restart (the
restart is when the controller allocates), where it delays the barrier by as much. So the
controller runs its full collections itself, when it is quiet (`collect_when_quiet`): the
same collections, as often, out of the restart's way.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 10_000
"""New container objects between two collections of the youngest generation (CPython: 700).
More of them are freed by reference counting before a collection walks them; the young
generation holds at most this many objects more (a few MB)."""
FULL_AFTER = 10
"""Collections of the middle generation after which a full one is due (CPython's own third
threshold)."""
NEVER = 1 << 30
"""The oldest generation's threshold while `collect_when_quiet` runs its collections."""
QUIET_SECONDS = 5.0
"""No pass for this long: the controller is quiet (a restart's passes come ~1-2.5 s apart)."""
PATIENCE_SECONDS = 300.0
"""A due full collection waits at most this long for a quiet moment, then runs anyway."""
CHECK_SECONDS = 1.0
"""How often `collect_when_quiet` looks whether a full collection is due."""


def settle() -> None:
    """Once the caches are filled: what is alive now (modules, the first lists) stays out of
    every later collection (`gc.freeze`; an object of it that dies is still freed by reference
    counting), and the youngest generation is collected every `YOUNG_THRESHOLD` allocations."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


def due(middles: int, quiet_for: float, waited: float) -> bool:
    """Whether to run a full collection now: `middles` middle-generation collections since the
    last full one, no pass for `quiet_for` seconds, and the collection due for `waited`."""
    if middles < FULL_AFTER:
        return False
    return quiet_for >= QUIET_SECONDS or waited >= PATIENCE_SECONDS


async def collect_when_quiet(
    quiet_for: Callable[[], float],
    *,
    check_seconds: float = CHECK_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Runs the oldest generation's collections, in place of CPython, when `quiet_for()` (the
    seconds since the controller's last pass; 0 while one runs) says the controller is quiet,
    or once one has waited `PATIENCE_SECONDS`. Until cancelled; then CPython runs them again."""
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)
    pending_since: float | None = None
    try:
        while True:
            await asyncio.sleep(check_seconds)
            middles = gc.get_count()[2]
            if middles < FULL_AFTER:
                pending_since = None
                continue
            now = clock()
            pending_since = now if pending_since is None else pending_since
            if due(middles, quiet_for(), now - pending_since):
                started = time.process_time()
                found = gc.collect(2)
                pending_since = None
                log.debug(
                    "full collection: %d unreachable, %.3f s of CPU",
                    found,
                    time.process_time() - started,
                )
    finally:
        gc.set_threshold(*gc.get_threshold()[:2], oldest)
