"""`Reconciler.act` loses no error of its parallel writes: every failed delete and every
failed create is raised (joined), as jobset joins them, not only the first."""

from __future__ import annotations

from typing import Any, cast

import pytest

from controller.k8s import GANGJOBS, NODES, PODS, SERVICES, ApiError, NotFound
from controller.k8s.store import Store
from controller.policy.plan import Plan, PodDelete
from controller.reconcile import Caches, Reconciler, joined
from tests.unit.builders import job_dict, make_job


class FailingWrites:
    """Pod writes fail for the names in `failing`, each with its own 500; the rest succeed."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.done: list[str] = []

    def _maybe_fail(self, name: str) -> None:
        if name in self.failing:
            raise ApiError(500, "InternalError", f"etcd is sad about {name}")
        self.done.append(name)

    async def delete(self, kind: Any, name: str, namespace: str | None = None, **kw: Any) -> None:
        self._maybe_fail(name)

    async def create(self, kind: Any, obj: dict[str, Any], namespace: str | None = None) -> Any:
        if kind is PODS:
            self._maybe_fail(obj["metadata"]["name"])
        return obj

    async def get(self, *args: Any, **kw: Any) -> Any:
        raise NotFound(404, "NotFound", "nothing here")


def reconciler(api: FailingWrites) -> Reconciler:
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    return Reconciler(cast(Any, api), caches)


def messages(error: BaseException) -> list[str]:
    if isinstance(error, BaseExceptionGroup):
        return sorted(str(e) for e in error.exceptions)
    return [str(error)]


async def test_every_failed_delete_is_raised_and_the_others_are_done() -> None:
    api = FailingWrites(failing={"j-1", "j-3"})
    job = make_job(replicas=4)
    deletes = [PodDelete(f"j-{i}", f"uid-{i}") for i in range(4)]
    decided = Plan(
        status=job.status, create_service=None, create_pods=[], delete_pods=deletes, events=[]
    )
    with pytest.raises(ExceptionGroup) as raised:
        await reconciler(api).act(job, job_dict(4), decided)
    assert messages(raised.value) == [
        "500 InternalError: etcd is sad about j-1",
        "500 InternalError: etcd is sad about j-3",
    ]
    assert sorted(api.done) == ["j-0", "j-2"]


async def test_every_failed_create_is_raised() -> None:
    api = FailingWrites(failing={"j-0", "j-2"})
    job = make_job(replicas=3)
    pods = [{"metadata": {"name": f"j-{i}"}} for i in range(3)]
    decided = Plan(status=job.status, create_service=None, create_pods=pods, delete_pods=[],
                   events=[])  # fmt: skip
    with pytest.raises(ExceptionGroup) as raised:
        await reconciler(api).act(job, job_dict(3), decided)
    assert messages(raised.value) == [
        "500 InternalError: etcd is sad about j-0",
        "500 InternalError: etcd is sad about j-2",
    ]
    assert api.done == ["j-1"]


def test_one_error_is_raised_as_itself() -> None:
    error = ApiError(500, "InternalError", "once")
    assert joined("deleting", [error]) is error
