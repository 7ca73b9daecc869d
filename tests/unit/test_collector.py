"""The garbage collector's full collections, run by the controller in its quiet moments
(controller.runtime.collector), not by CPython in the middle of a restart."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from controller.runtime.collector import (
    FULL_AFTER,
    NEVER,
    PATIENCE_SECONDS,
    QUIET_SECONDS,
    collect_when_quiet,
    due,
)
from tests.unit.test_agent import polled


@pytest.mark.parametrize(
    ("middles", "quiet_for", "waited", "expected"),
    [
        (FULL_AFTER - 1, 3600.0, 3600.0, False),  # not due yet, however quiet
        (FULL_AFTER, 0.0, 0.0, False),  # due, and a pass runs: it waits
        (FULL_AFTER, QUIET_SECONDS - 0.1, 10.0, False),  # a restart's passes, ~1-2.5 s apart
        (FULL_AFTER, QUIET_SECONDS, 0.0, True),  # quiet
        (FULL_AFTER + 5, 0.0, PATIENCE_SECONDS, True),  # never quiet: it runs anyway
    ],
)
def test_a_full_collection_runs_when_due_and_quiet(
    middles: int, quiet_for: float, waited: float, expected: bool
) -> None:
    assert due(middles, quiet_for, waited) is expected


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The full collections CPython starts from here on (by anyone)."""
    seen: list[int] = []

    def started(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    gc.callbacks.append(started)
    yield seen
    gc.callbacks.remove(started)


@contextlib.asynccontextmanager
async def collecting(quiet: list[float], clock: list[float]) -> AsyncIterator[None]:
    oldest = gc.get_threshold()[2]
    task = asyncio.create_task(
        collect_when_quiet(lambda: quiet[0], check_seconds=0.01, clock=lambda: clock[0])
    )
    await asyncio.sleep(0.05)
    assert gc.get_threshold()[2] == NEVER  # CPython starts none itself
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert gc.get_threshold()[2] == oldest  # CPython's again


def middles(count: int) -> None:
    for _ in range(count):
        gc.collect(1)  # each counts toward the next full collection


async def test_a_due_full_collection_waits_for_the_passes_to_stop(
    full_collections: list[int],
) -> None:
    quiet, clock = [0.0], [0.0]
    async with collecting(quiet, clock):
        middles(FULL_AFTER)
        await asyncio.sleep(0.2)
        assert full_collections == []  # a pass runs
        quiet[0] = QUIET_SECONDS
        await polled(lambda: bool(full_collections))
        assert gc.get_count()[2] < FULL_AFTER
        full_collections.clear()
        await asyncio.sleep(0.1)
        assert full_collections == []  # one per due collection, not one per check


async def test_a_full_collection_never_quiet_runs_after_its_patience(
    full_collections: list[int],
) -> None:
    quiet, clock = [0.0], [100.0]
    async with collecting(quiet, clock):
        middles(FULL_AFTER)
        await asyncio.sleep(0.1)
        clock[0] += PATIENCE_SECONDS - 1
        await asyncio.sleep(0.1)
        assert full_collections == []
        clock[0] += 1
        await polled(lambda: bool(full_collections))
