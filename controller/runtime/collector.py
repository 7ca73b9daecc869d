"""The garbage collector's pace in a controller whose caches hold hundreds of thousands of
objects (docs/design.md section 7).

CPython collects its youngest generation every 700 new container objects. A gang restart at
N=1000 allocates millions (watch events parsed, a view per pod version, a thousand reports and
their streams), nearly all freed by reference counting soon after; at the default pace the
collector ran ~2000 young and ~20 full collections in a scale run (gang start, 6 restarts,
teardown) and took 4.2-5.4 s of the controller's 31-36 s of CPU (benchmarks.scale, N=1000).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""New container objects between two collections of the youngest generation (CPython: 700).
More of them are freed by reference counting before a collection walks them; the young
generation holds at most this many objects more (a few MB)."""


def settle() -> None:
    """Once the caches are filled: what is alive now (modules, the first lists) stays out of
    every later collection (`gc.freeze`; an object of it that dies is still freed by reference
    counting), and the youngest generation is collected every `YOUNG_THRESHOLD` allocations."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
