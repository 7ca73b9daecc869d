"""The store: cache and indexes follow events; list, watch, relist on Gone."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from controller.k8s import PODS, Gone, JsonDict, ObjectList, TransportError, WatchEvent
from controller.k8s.store import (
    BY_GANGJOB,
    BY_NODE,
    Store,
    StoreEvent,
    gangjob_index,
    node_index,
    object_key,
)
from tests.unit.fakes import JumpClock, ScriptedListWatcher, pod


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def __call__(self, event: StoreEvent) -> None:
        self.events.append((event.type, event.key))
        self.changed.set()


def new_store(lw: ScriptedListWatcher | None = None) -> tuple[Store, Recorder]:
    recorder = Recorder()
    store = Store(
        lw or ScriptedListWatcher(),
        PODS,
        indexers={BY_GANGJOB: gangjob_index, BY_NODE: node_index},
        handlers=[recorder],
        clock=JumpClock(),
    )
    return store, recorder


def test_object_key() -> None:
    assert object_key({"metadata": {"name": "a", "namespace": "ns"}}) == "ns/a"
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"


def test_events_update_cache_and_indexes() -> None:
    store, rec = new_store()
    store.replace([pod("j-0", "1", job="j", node="n1")], "1")
    assert store.has_synced
    store.apply(WatchEvent("ADDED", pod("j-1", "2", job="j")))
    assert {p["metadata"]["name"] for p in store.by_index(BY_GANGJOB, "ns/j")} == {"j-0", "j-1"}
    assert store.index_keys(BY_NODE, "n1") == {"ns/j-0"}
    # The pod is scheduled to another node and relabelled.
    store.apply(WatchEvent("MODIFIED", pod("j-0", "3", job="k", node="n2")))
    assert store.index_keys(BY_NODE, "n1") == set()
    assert store.index_keys(BY_NODE, "n2") == {"ns/j-0"}
    assert store.index_keys(BY_GANGJOB, "ns/k") == {"ns/j-0"}
    assert store.index_keys(BY_GANGJOB, "ns/j") == {"ns/j-1"}
    store.apply(WatchEvent("DELETED", pod("j-1", "4", job="j")))
    assert store.get("ns/j-1") is None
    assert store.index_keys(BY_GANGJOB, "ns/j") == set()
    store.apply(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "9"}}))
    assert store.resource_version == "9"
    assert len(store) == 1
    assert rec.events == [
        ("ADDED", "ns/j-0"),
        ("ADDED", "ns/j-1"),
        ("MODIFIED", "ns/j-0"),
        ("DELETED", "ns/j-1"),
    ]


def test_replace_emits_only_differences() -> None:
    store, rec = new_store()
    store.replace([pod("a", "1"), pod("b", "1"), pod("c", "1")], "1")
    rec.events.clear()
    store.replace([pod("a", "1"), pod("b", "2"), pod("d", "1")], "5")
    assert sorted(rec.events) == [("ADDED", "ns/d"), ("DELETED", "ns/c"), ("MODIFIED", "ns/b")]
    assert sorted(store.keys()) == ["ns/a", "ns/b", "ns/d"]
    assert store.resource_version == "5"


def test_a_failing_handler_does_not_stop_the_cache() -> None:
    store, rec = new_store()

    def broken(event: StoreEvent) -> None:
        raise RuntimeError("boom")

    store._handlers.insert(0, broken)
    store.apply(WatchEvent("ADDED", pod("a", "1")))
    assert "ns/a" in store
    assert rec.events == [("ADDED", "ns/a")]


async def wait_for_events(rec: Recorder, count: int) -> None:
    async with asyncio.timeout(5):
        while len(rec.events) < count:
            rec.changed.clear()
            await rec.changed.wait()


async def test_run_lists_watches_and_relists_on_gone() -> None:
    lw = ScriptedListWatcher()
    lw.lists = [
        ObjectList([pod("a", "1")], "10"),
        ObjectList([pod("b", "12")], "20"),  # after Gone: a was deleted meanwhile
    ]
    lw.streams = [
        [WatchEvent("MODIFIED", pod("a", "11")), Gone(410, "Expired", "too old")],
        [WatchEvent("ADDED", pod("c", "21"))],
    ]
    store, rec = new_store(lw)
    task = asyncio.create_task(store.run())
    try:
        await wait_for_events(rec, 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert rec.events == [
        ("ADDED", "ns/a"),
        ("MODIFIED", "ns/a"),
        ("DELETED", "ns/a"),
        ("ADDED", "ns/b"),
        ("ADDED", "ns/c"),
    ]
    assert lw.watched_from == ["10", "20"]
    assert store.relists == 2
    assert sorted(store.keys()) == ["ns/b", "ns/c"]


async def test_run_retries_a_failed_list_with_backoff() -> None:
    lw = ScriptedListWatcher()
    lw.lists = [TransportError("refused"), TransportError("refused"), ObjectList([], "7")]
    store, _ = new_store(lw)
    task = asyncio.create_task(store.run())
    try:
        await asyncio.wait_for(store.wait_synced(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert store.resource_version == "7"
    assert lw.watched_from == ["7"]


@pytest.mark.parametrize("missing", ["labels", "namespace"])
def test_gangjob_index_ignores_pods_outside_a_gang(missing: str) -> None:
    p = pod("x", "1", job="j")
    if missing == "labels":
        del p["metadata"]["labels"]
    else:
        del p["metadata"]["namespace"]
    assert gangjob_index(p) == []


def test_the_transform_is_applied_to_everything_cached_and_handed_on() -> None:
    seen: list[StoreEvent] = []

    def keep_name_only(obj: JsonDict) -> JsonDict:
        meta = obj["metadata"]
        trimmed = {k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels")}
        return {"metadata": trimmed, "spec": obj.get("spec", {})}

    store = Store(
        ScriptedListWatcher(),
        PODS,
        indexers={BY_GANGJOB: gangjob_index, BY_NODE: node_index},
        handlers=[seen.append],
        transform=keep_name_only,
        clock=JumpClock(),
    )

    def fat(name: str, rv: str, node: str | None = None) -> JsonDict:
        obj = pod(name, rv, job="j", node=node)
        obj["metadata"]["managedFields"] = [{"manager": "kubelet"}]
        obj["status"] = {"phase": "Running"}
        return obj

    store.replace([fat("a", "1", node="n1")], "1")
    store.apply(WatchEvent("ADDED", fat("b", "2")))
    store.apply(WatchEvent("MODIFIED", fat("a", "3", node="n2")))
    store.apply(WatchEvent("DELETED", fat("b", "4")))
    store.apply(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "5"}}))
    assert store.list() == [keep_name_only(fat("a", "3", node="n2"))]
    assert store.index_keys(BY_NODE, "n2") == {"ns/a"}
    assert store.resource_version == "5"
    handed = [e.obj for e in seen] + [e.old for e in seen if e.old is not None]
    assert handed
    assert all("status" not in o and "managedFields" not in o["metadata"] for o in handed)


async def test_a_running_store_transforms_what_it_lists_and_watches() -> None:
    lw = ScriptedListWatcher()
    lw.lists = [ObjectList([pod("a", "1", job="j")], "10")]
    lw.streams = [[WatchEvent("ADDED", pod("b", "11", job="j"))]]

    def no_spec(obj: JsonDict) -> JsonDict:
        return {"metadata": obj["metadata"]}

    rec = Recorder()
    store = Store(lw, PODS, handlers=[rec], transform=no_spec, clock=JumpClock())
    task = asyncio.create_task(store.run())
    try:
        await wait_for_events(rec, 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sorted(store.keys()) == ["ns/a", "ns/b"]
    assert all("spec" not in obj for obj in store.list())
