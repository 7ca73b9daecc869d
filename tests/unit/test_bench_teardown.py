"""A gang's teardown in the scale benchmark outlasts an apiserver that cannot answer for a while:
the run goes on to write what it measured instead of ending on the delete's error."""

from __future__ import annotations

from typing import Any, cast

import pytest

from benchmarks.scale import cluster
from controller.k8s import Kube, NotFound
from controller.k8s.errors import ApiError, Forbidden, TransportError


class FlakyKube:
    """Fails each delete with the next error of `errors`, then deletes."""

    def __init__(self, *errors: ApiError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def delete(self, kind: Any, name: str, ns: str) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None

    monkeypatch.setattr("benchmarks.scale.cluster.asyncio.sleep", instant)


async def test_a_timed_out_delete_is_asked_again_until_it_goes() -> None:
    kube = FlakyKube(TransportError("DELETE: TimeoutError()"), ApiError(503, "Unavailable", ""))
    await cluster.delete_job(cast(Kube, kube), "ip", "bench")
    assert kube.calls == 3


async def test_a_gang_already_gone_is_deleted() -> None:
    kube = FlakyKube(NotFound(404, "NotFound", ""))
    await cluster.delete_job(cast(Kube, kube), "ip", "bench")
    assert kube.calls == 1


async def test_an_error_not_worth_retrying_or_past_the_deadline_is_raised() -> None:
    with pytest.raises(Forbidden):
        await cluster.delete_job(cast(Kube, FlakyKube(Forbidden(403, "Forbidden", ""))), "ip", "b")
    kube = FlakyKube(*[TransportError("timeout")] * 3)
    with pytest.raises(TransportError):
        await cluster.delete_job(cast(Kube, kube), "ip", "bench", within=0.0)
    assert kube.calls == 1
