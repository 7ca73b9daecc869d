"""`ObjectApi`: the verbs on one object that the code built on `Kube` takes as its seam (get,
create, and replace conditional on the body's resourceVersion), so that a test hands it an
in-memory API instead (tests/unit/fakes.py `FakeApi`). `Kube` is one.
"""

from __future__ import annotations

from typing import Protocol

from controller.k8s.kinds import JsonDict, ResourceKind

__all__ = ["ObjectApi"]


class ObjectApi(Protocol):
    """What leader election (`controller.k8s.leader`) and the workers' access
    (`controller.workeraccess`) need of `Kube`; `Kube`'s docstrings say what each verb does."""

    async def get(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict: ...

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict: ...

    async def replace(
        self,
        kind: ResourceKind,
        name: str,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict: ...
