"""`benchmarks.pass_cost` times the passes a restart runs: each kind of pass it times must be
that pass, as the status it writes says (a merge patch: what the pass changed). A smoke test
at N=20; the times are the benchmark's."""

from __future__ import annotations

import pytest

from benchmarks import pass_cost


async def test_the_bump_pass_raises_the_epoch_for_the_reported_exit() -> None:
    _, setup = await pass_cost.measure(20, "bump", passes=2)
    assert setup.api.status is not None
    assert setup.api.status["epoch"] == 2
    assert "barrierEpoch" not in setup.api.status
    assert setup.api.status["lastRestart"]["trigger"]["worker"] == 10


async def test_a_refresh_pass_counts_the_arrivals_behind_a_shut_barrier() -> None:
    _, setup = await pass_cost.measure(20, "refresh", passes=2)
    assert setup.api.status is not None
    assert "epoch" not in setup.api.status
    assert "barrierEpoch" not in setup.api.status
    assert setup.reported == 15  # 5 before the timed passes, 5 before each
    assert setup.api.status["workers"]["arrived"] == 15


async def test_the_barrier_pass_opens_the_barrier_once_every_agent_restarted() -> None:
    _, setup = await pass_cost.measure(20, "barrier", passes=2)
    assert setup.api.status is not None
    assert "epoch" not in setup.api.status
    assert setup.api.status["barrierEpoch"] == 1
    assert setup.api.status["workers"]["arrived"] == 20


def test_an_unknown_kind_of_pass_is_refused() -> None:
    with pytest.raises(ValueError, match="kind must be one of bump, refresh, barrier"):
        pass_cost.Setup(20, "restart")
