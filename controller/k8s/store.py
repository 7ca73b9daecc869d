"""The informer: a cache of one kind of object, kept current by list-then-watch, with indexes.

List once, watch from the list's resourceVersion (bookmarks keep it fresh), list again on
`410 Gone` or when the stream keeps breaking, with backoff. Each object is passed through the
store's transform (`controller.k8s.transforms`: only what the controller reads is kept), then
cached and handed to the registered handlers, which map it to work-queue keys; the cache itself
is read by reconcilers.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from api.constants import LABEL_NAME
from controller.k8s.errors import ApiError, Gone
from controller.k8s.kinds import JsonDict, ResourceKind
from controller.k8s.transforms import Transform
from controller.k8s.watch import ObjectList, WatchEvent
from controller.runtime.clock import MONOTONIC, Clock

__all__ = [
    "BY_GANGJOB",
    "BY_NODE",
    "EventHandler",
    "IndexFunc",
    "ListWatcher",
    "Store",
    "StoreEvent",
    "gangjob_index",
    "node_index",
    "object_key",
]

log = logging.getLogger(__name__)

BY_GANGJOB = "gangjob"
BY_NODE = "node"

IndexFunc = Callable[[JsonDict], Iterable[str]]


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKey)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{namespace}/{name}" if namespace else name


def gangjob_index(pod: JsonDict) -> list[str]:
    """A gang pod's GangJob key, `<ns>/<gangjob.io/name label>`."""
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_NAME)
    namespace = meta.get("namespace")
    return [f"{namespace}/{job}"] if job and namespace else []


def node_index(pod: JsonDict) -> list[str]:
    """The node a pod is bound to (none while it is unscheduled)."""
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


class ListWatcher(Protocol):
    """What the store needs of the API client (`controller.k8s.Kube` is one)."""

    async def list(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = None,
    ) -> ObjectList:
        """Every object, each through `transform` (when given) before the next page is read."""
        ...

    def watch(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> AsyncIterator[WatchEvent]: ...


@dataclass(frozen=True)
class StoreEvent:
    """A change the cache applied: `old` is the cached object before (MODIFIED, DELETED)."""

    type: str  # ADDED | MODIFIED | DELETED
    obj: JsonDict
    old: JsonDict | None = None

    @property
    def key(self) -> str:
        return object_key(self.obj)


class EventHandler(Protocol):
    """Called synchronously for each change; it should only enqueue keys."""

    def __call__(self, event: StoreEvent, /) -> None: ...


class Store:
    """A reflector and its cache for one kind (optionally one namespace and selector).

    `transform` is applied to every object listed or watched before it is cached or handed to
    the handlers (e.g. `trim_pod`); it must keep `metadata` (name, namespace, resourceVersion)
    and whatever the indexers read."""

    def __init__(
        self,
        client: ListWatcher,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: Mapping[str, IndexFunc] | None = None,
        handlers: Sequence[EventHandler] = (),
        transform: Transform | None = None,
        clock: Clock = MONOTONIC,
        initial_backoff: float = 0.8,
        max_backoff: float = 30.0,
    ) -> None:
        self.kind = kind
        self._client = client
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._handlers: list[EventHandler] = list(handlers)
        self._transform = transform
        self._clock = clock
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._items: dict[str, JsonDict] = {}
        # index name -> index value -> keys; and key -> index name -> its values, to unindex
        self._indices: dict[str, dict[str, set[str]]] = {n: {} for n in self._indexers}
        self._indexed: dict[str, dict[str, tuple[str, ...]]] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.relists = 0

    # reading

    @property
    def has_synced(self) -> bool:
        return self.synced.is_set()

    async def wait_synced(self) -> None:
        await self.synced.wait()

    def get(self, key: str) -> JsonDict | None:
        return self._items.get(key)

    def keys(self) -> builtins.list[str]:
        return list(self._items)

    def list(self) -> list[JsonDict]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def index_keys(self, index: str, value: str) -> set[str]:
        return set(self._indices[index].get(value, ()))

    def by_index(self, index: str, value: str) -> builtins.list[JsonDict]:
        keys = self._indices[index].get(value, ())
        return [self._items[k] for k in keys]

    # the reflector

    async def run(self) -> None:
        """List and watch forever (until cancelled), relisting with backoff when needed."""
        failures = 0
        while True:
            try:
                await self._list_and_watch()
                failures = 0  # the watch ended normally: relist at once
            except Gone as error:
                log.info("%s: %s; relisting", self.kind.resource, error)
                failures = 0
            except (ApiError, OSError, ValueError) as error:
                failures += 1
                delay = min(self._max_backoff, self._initial_backoff * 2 ** (failures - 1))
                delay *= 1 + random.random() * 0.2
                log.warning(
                    "%s list/watch failed (%s); retrying in %.1fs", self.kind.resource, error, delay
                )
                await self._clock.sleep(delay)

    async def _list_and_watch(self) -> None:
        listed = await self._client.list(
            self.kind,
            self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            transform=self._transform,
        )
        self.relists += 1
        self._replace(listed.items, listed.resource_version)
        events = self._client.watch(
            self.kind,
            self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            resource_version=listed.resource_version,
        )
        async with contextlib.aclosing(_Closable(events)) as stream:
            async for event in stream:
                self.apply(event)

    # applying changes (public so tests and benchmarks can drive a store without a cluster)

    def replace(self, items: Iterable[JsonDict], resource_version: str) -> None:
        """Make the cache exactly `items` (a fresh list), emitting the differences."""
        if self._transform is not None:
            items = map(self._transform, items)
        self._replace(items, resource_version)

    def _replace(self, items: Iterable[JsonDict], resource_version: str) -> None:
        """`replace` with `items` transformed already."""
        fresh = {object_key(obj): obj for obj in items}
        for key in [k for k in self._items if k not in fresh]:
            gone = self._items[key]
            self._remove(key)
            self._emit(StoreEvent("DELETED", gone, gone))
        for key, obj in fresh.items():
            old = self._items.get(key)
            if old is None:
                self._put(key, obj)
                self._emit(StoreEvent("ADDED", obj))
            elif _rv(old) != _rv(obj):
                self._put(key, obj)
                self._emit(StoreEvent("MODIFIED", obj, old))
        self.resource_version = resource_version
        self.synced.set()

    def apply(self, event: WatchEvent) -> None:
        """Apply one watch event to the cache and notify the handlers."""
        etype, obj = event
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if etype == "BOOKMARK":
            return
        if self._transform is not None:
            obj = self._transform(obj)
        key = object_key(obj)
        if etype == "DELETED":
            old = self._remove(key)
            self._emit(StoreEvent("DELETED", obj, old))
            return
        old = self._items.get(key)
        self._put(key, obj)
        self._emit(StoreEvent("ADDED" if old is None else "MODIFIED", obj, old))

    def _emit(self, event: StoreEvent) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                # One broken handler must not stop the cache from following the cluster.
                log.exception("%s event handler failed on %s", self.kind.resource, event.key)

    def _put(self, key: str, obj: JsonDict) -> None:
        self._unindex(key)
        self._items[key] = obj
        for name in self._indexers:
            self._index_one(name, key, obj)

    def _remove(self, key: str) -> JsonDict | None:
        self._unindex(key)
        return self._items.pop(key, None)

    def _index_one(self, name: str, key: str, obj: JsonDict) -> None:
        values = tuple(self._indexers[name](obj))
        self._indexed.setdefault(key, {})[name] = values
        index = self._indices[name]
        for value in values:
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str) -> None:
        for name, values in self._indexed.pop(key, {}).items():
            index = self._indices[name]
            for value in values:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _Closable:
    """Give any async iterator an `aclose` (async generators have one; fakes may not)."""

    def __init__(self, it: AsyncIterator[WatchEvent]) -> None:
        self._it = it

    def __aiter__(self) -> _Closable:
        return self

    async def __anext__(self) -> WatchEvent:
        return await self._it.__anext__()

    async def aclose(self) -> None:
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()
