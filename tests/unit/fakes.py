"""Test doubles for the controller's I/O seams: clocks, and an in-memory API for one process."""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
from collections.abc import AsyncIterator, Callable

from controller.k8s import (
    AlreadyExists,
    Conflict,
    JsonDict,
    NotFound,
    ObjectApi,
    ObjectList,
    ResourceKind,
    TransportError,
    WatchEvent,
)
from controller.k8s.store import ListWatcher


class FakeClock:
    """Time moves only when the test calls `advance`; `sleep` waits for that."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> None:
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


class JumpClock:
    """Every `sleep` jumps time forward by its length at once: loops run in no wall time."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)


class FakeApi(ObjectApi):
    """An in-memory apiserver for any kind, as `ObjectApi`: resourceVersions, preconditions,
    typed errors.

    `down = True` makes every call fail as if the apiserver were unreachable;
    `down_after_calls = n` does so from the (n+1)th call on."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], JsonDict] = {}
        self._rv = itertools.count(1)
        self.down = False
        self.down_after_calls: int | None = None
        self.calls: list[str] = []

    def _check(self, verb: str) -> None:
        self.calls.append(verb)
        if self.down_after_calls is not None and len(self.calls) > self.down_after_calls:
            self.down = True
        if self.down:
            raise TransportError("fake apiserver is down")

    async def get(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        self._check("get")
        try:
            return copy.deepcopy(self.objects[(kind.resource, namespace, name)])
        except KeyError:
            raise NotFound(404, "NotFound", f"{kind.plural} {name!r} not found") from None

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        self._check("create")
        name = obj["metadata"]["name"]
        key = (kind.resource, namespace, name)
        if key in self.objects:
            raise AlreadyExists(409, "AlreadyExists", f"{name} already exists")
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        stored["metadata"]["uid"] = f"uid-{name}-{stored['metadata']['resourceVersion']}"
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def replace(
        self,
        kind: ResourceKind,
        name: str,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        self._check("replace")
        key = (kind.resource, namespace, name)
        current = self.objects.get(key)
        if current is None:
            raise NotFound(404, "NotFound", name)
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = stored
        return copy.deepcopy(stored)


class ScriptedListWatcher(ListWatcher):
    """Serves scripted lists and watch streams to a Store. A stream item that is an exception
    is raised; once a stream's script is over it blocks until `close_streams`."""

    def __init__(self) -> None:
        self.lists: list[ObjectList | Exception] = []
        self.streams: list[list[WatchEvent | Exception]] = []
        self.watched_from: list[str | None] = []
        self._release = asyncio.Event()

    async def list(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[JsonDict], JsonDict] | None = None,
    ) -> ObjectList:
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        if transform is not None:
            return ObjectList([transform(obj) for obj in item.items], item.resource_version)
        return item

    async def watch(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        self.watched_from.append(resource_version)
        script = self.streams.pop(0) if self.streams else []
        for item in script:
            if isinstance(item, Exception):
                raise item
            yield item
        await self._release.wait()

    def close_streams(self) -> None:
        self._release.set()


def pod(
    name: str,
    rv: str,
    *,
    namespace: str = "ns",
    job: str | None = None,
    node: str | None = None,
) -> JsonDict:
    labels = {"gangjob.io/name": job} if job else {}
    spec: JsonDict = {"nodeName": node} if node else {}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": rv,
            "labels": labels,
        },
        "spec": spec,
    }
