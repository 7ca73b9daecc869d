"""What a scale run is asked to do (`Settings`), and the names and numbers its parts share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS

MODES = ("in-place", "in-place-annotation", "node-lost", "recreate", "floor", "annotation-floor")
"""Every measurement, in the order the report lists them."""
PODS_PER_NODE = 250
ANNOTATION_FLOOR_CONCURRENCY = 32
"""annotation-floor: pod annotation patches in flight at once."""
BENCH_LABEL = "gangjob-bench"
BULK_TAINT = "gangjob-bench/bulk"
POLL = 0.05
"""Seconds between two looks at a milestone known only by polling (the agents' state)."""
# The goals of issue 5, printed beside the results and never asserted.
GOAL_RATIO_AT = 5000
GOAL_RATIO = 15.0
GOAL_SHARE = 1.0


@dataclass
class Settings:
    sizes: list[int]
    reps: int = 3
    restart_delay: float = 2.0
    start_delay: float = 1.3
    scheduler_qps: int | None = None
    endpoint_batch: float | None = None
    """The controller-manager's endpoint update batching period (seconds; default none)."""
    modes: tuple[str, ...] = MODES
    """Which measurements to take (all by default: they are meant side by side)."""
    cluster: str = "bench"
    keep: bool = False
    name: str = "restart_scale"
    """The results' file name (`<name>[-qpsQ][-epbatchS].{json,md,png}`)."""
    results_dir: Path = RESULTS
    rep_limit_s: float | None = None
    """A repetition's time limit, overriding the one that grows with N (tests use it)."""
