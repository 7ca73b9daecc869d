"""The scale benchmark's repetitions run without the garbage collector in its own process (the
simulation's heap, `scenarios.no_collector`), and give it back as they found it."""

from __future__ import annotations

import gc

import pytest

from benchmarks.scale.scenarios import no_collector


async def test_a_repetition_runs_without_the_collector_and_restores_it() -> None:
    assert gc.isenabled()
    try:
        async with no_collector():
            assert not gc.isenabled()
            # What exists before the repetition is frozen: no collection walks it after.
            assert gc.get_freeze_count() > 0
        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            async with no_collector():
                raise RuntimeError("a repetition that failed")
        assert gc.isenabled()
        gc.disable()
        async with no_collector():
            assert not gc.isenabled()
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        gc.enable()
        gc.unfreeze()
