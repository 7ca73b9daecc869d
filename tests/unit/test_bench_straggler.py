"""The straggler benchmark's soak (benchmarks/straggler.py) is no vacuous count: through the same
agent tracker, wire format, book and judgement, healthy jitter finds nothing, and one slowed
worker is found about forSeconds after it slowed down, and nobody else."""

from __future__ import annotations

from api.v1alpha1 import StragglerSpec
from benchmarks.straggler import soak

SPEC = StragglerSpec(ratio=1.5, for_seconds=30)


def test_the_soak_finds_nothing_in_jitter_and_the_one_slowed_worker() -> None:
    healthy = soak(20, 0.1, SPEC, seed=1)
    assert healthy["false_positives"] == 0
    assert healthy["summaries"] >= 20 * 360 // 30
    slowed = soak(20, 0.1, SPEC, seed=1, slow=(7, 120.0, 2.0))
    assert slowed["false_positives"] == 0
    assert slowed["workers_named"] == [7]
    # Slowed at 120 s: its shift said at once, found forSeconds later, at a 5 s pass.
    assert 120 + 30 <= slowed["first_found_s"] <= 120 + 30 + 10
