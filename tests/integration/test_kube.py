"""controller.k8s (`Kube`, the store, leader election) against a real apiserver (the local
`sim` cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator

import pytest
import yaml

from controller.k8s import (
    CRDS,
    GANGJOBS,
    LEASES,
    PODS,
    AlreadyExists,
    Conflict,
    Invalid,
    JsonDict,
    Kube,
    NotFound,
    WatchEvent,
)
from controller.k8s.leader import LeaderElectionConfig, LeaderElector
from controller.k8s.store import BY_GANGJOB, Store, StoreEvent, gangjob_index
from controller.runtime import metrics
from localcluster.addons import crd_established

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
DEADLINE = 30.0


@pytest.fixture
async def kube(sim_kubeconfig: pathlib.Path) -> AsyncIterator[Kube]:
    async with await Kube.from_kubeconfig(sim_kubeconfig, request_timeout=10) as client:
        yield client


def pod_manifest(name: str, **labels: str) -> JsonDict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/trainer:1"}]},
    }


async def next_event(
    stream: AsyncIterator[WatchEvent], *, name: str | None = None, skip_bookmarks: bool = True
) -> WatchEvent:
    """The next event (of object `name`, if given) within the deadline."""
    async with asyncio.timeout(DEADLINE):
        async for event in stream:
            if skip_bookmarks and event.type == "BOOKMARK":
                continue
            if name is not None and event.object["metadata"].get("name") != name:
                continue
            return event
    raise AssertionError("watch ended")


def labels(event: WatchEvent) -> dict[str, str]:
    found: dict[str, str] = event.object["metadata"].get("labels") or {}
    return found


async def test_pod_crud_and_error_types(kube: Kube, namespace: str) -> None:
    created = await kube.create(PODS, pod_manifest("w-0", app="x"), namespace)
    uid = created["metadata"]["uid"]
    assert created["metadata"]["namespace"] == namespace

    with pytest.raises(AlreadyExists):
        await kube.create(PODS, pod_manifest("w-0"), namespace)

    got = await kube.get(PODS, "w-0", namespace)
    assert got["metadata"]["uid"] == uid

    patched = await kube.patch(
        PODS, "w-0", {"metadata": {"annotations": {"gangjob.io/epoch": "1"}}}, namespace
    )
    assert patched["metadata"]["annotations"]["gangjob.io/epoch"] == "1"
    assert patched["metadata"]["labels"] == {"app": "x"}, "a merge-patch keeps other fields"

    stale = created["metadata"]["resourceVersion"]
    with pytest.raises(Conflict):
        await kube.patch(
            PODS,
            "w-0",
            {"metadata": {"resourceVersion": stale, "labels": {"app": "y"}}},
            namespace,
        )

    with pytest.raises(Invalid) as invalid:
        await kube.create(
            PODS,
            {"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "Main_1"}]}},
            namespace,
        )
    assert "spec.containers[0]" in invalid.value.message

    with pytest.raises(Conflict, match=r"[Pp]recondition"):
        await kube.delete(PODS, "w-0", namespace, grace_period_seconds=0, uid="not-the-uid")
    await kube.delete(PODS, "w-0", namespace, grace_period_seconds=0, uid=uid)
    with pytest.raises(NotFound):
        await kube.get(PODS, "w-0", namespace)
    with pytest.raises(NotFound):
        await kube.delete(PODS, "w-0", namespace)

    assert metrics.REGISTRY.get_sample_value(
        "rest_client_requests_total", {"code": "409", "method": "PATCH", "resource": "pods"}
    )


async def test_list_then_watch_from_its_resource_version(kube: Kube, namespace: str) -> None:
    await kube.create(PODS, pod_manifest("before"), namespace)
    listed = await kube.list(PODS, namespace, page_size=1)
    assert [p["metadata"]["name"] for p in listed.items] == ["before"]
    stream = kube.watch(PODS, namespace, resource_version=listed.resource_version)
    async with contextlib.aclosing(stream):
        await kube.create(PODS, pod_manifest("after", gang="g"), namespace)
        event = await next_event(stream, name="after")
        assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "after")
        # The scheduler and KWOK modify the pods too: wait for the changes we made.
        await kube.patch(PODS, "after", {"metadata": {"labels": {"x": "1"}}}, namespace)
        while "x" not in labels(event := await next_event(stream, name="after")):
            assert event.type == "MODIFIED"
        assert event.type == "MODIFIED"
        assert labels(event) == {"gang": "g", "x": "1"}
        await kube.delete(PODS, "after", namespace, grace_period_seconds=0)
        while (event := await next_event(stream, name="after")).type != "DELETED":
            assert event.type == "MODIFIED"
        assert event.object["metadata"]["name"] == "after"


async def test_label_selected_list_and_pagination(kube: Kube, namespace: str) -> None:
    for i in range(5):
        await kube.create(PODS, pod_manifest(f"j-{i}", **{"gangjob.io/name": "j"}), namespace)
    await kube.create(PODS, pod_manifest("other"), namespace)
    listed = await kube.list(PODS, namespace, label_selector="gangjob.io/name=j", page_size=2)
    assert sorted(p["metadata"]["name"] for p in listed.items) == [f"j-{i}" for i in range(5)]
    assert listed.resource_version


async def test_watch_delivers_bookmarks(kube: Kube, namespace: str) -> None:
    # A watch from a resourceVersion gets its bookmarks about once a minute (measured on
    # 1.36.2: none at all in a watch of 5 or 10 s), too slow to wait for here. A watch from no
    # resourceVersion that asks for bookmarks gets one at once, marking the end of the initial
    # events; one that does not ask gets none.
    stream = kube.watch(PODS, namespace, timeout_seconds=5)
    async with contextlib.aclosing(stream):
        event = await next_event(stream, skip_bookmarks=False)
    assert event.type == "BOOKMARK"
    assert event.object["metadata"]["resourceVersion"]
    assert event.object["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"


async def test_store_syncs_indexes_and_follows_changes(kube: Kube, namespace: str) -> None:
    await kube.create(PODS, pod_manifest("j-0", **{"gangjob.io/name": "j"}), namespace)
    seen: asyncio.Queue[StoreEvent] = asyncio.Queue()
    store = Store(
        kube,
        PODS,
        namespace=namespace,
        indexers={BY_GANGJOB: gangjob_index},
        handlers=[seen.put_nowait],
    )
    task = asyncio.create_task(store.run())
    try:
        async with asyncio.timeout(DEADLINE):
            await store.wait_synced()
            assert store.index_keys(BY_GANGJOB, f"{namespace}/j") == {f"{namespace}/j-0"}
            await kube.create(PODS, pod_manifest("j-1", **{"gangjob.io/name": "j"}), namespace)
            while (event := await seen.get()).key != f"{namespace}/j-1":
                pass
        assert event.type == "ADDED"
        assert len(store.by_index(BY_GANGJOB, f"{namespace}/j")) == 2
        # A relist (as after 410 Gone) converges on the same cache.
        listed = await kube.list(PODS, namespace)
        store.replace(listed.items, listed.resource_version)
        assert sorted(store.keys()) == [f"{namespace}/j-0", f"{namespace}/j-1"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_one_elector_holds_the_lease_the_other_waits(kube: Kube, namespace: str) -> None:
    def config(identity: str) -> LeaderElectionConfig:
        return LeaderElectionConfig(
            name="gangjob-controller",
            namespace=namespace,
            identity=identity,
            lease_duration=4.0,
            renew_deadline=3.0,
            retry_period=0.5,
            request_timeout=2.0,
        )

    a = LeaderElector(kube, config("a"))
    b = LeaderElector(kube, config("b"))
    leading = asyncio.Event()
    stopped: list[str] = []

    async def lead() -> None:
        leading.set()
        await asyncio.Event().wait()

    runner = asyncio.create_task(a.run(lead, lambda: stopped.append("a")))
    try:
        async with asyncio.timeout(DEADLINE):
            await leading.wait()
        assert a.is_leader
        assert not await b.try_acquire_or_renew()
        assert b.observed_holder == "a"
        lease = await kube.get(LEASES, "gangjob-controller", namespace)
        assert lease["spec"]["holderIdentity"] == "a"
        assert lease["spec"]["leaseDurationSeconds"] == 4
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    assert stopped == ["a"]
    # a released the lease on its clean exit: b takes it without waiting for expiry.
    assert await b.try_acquire_or_renew()
    lease = await kube.get(LEASES, "gangjob-controller", namespace)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


async def ensure_gangjob_crd(kube: Kube) -> None:
    """Install the committed CRD if the cluster lacks it, and wait until it is served."""
    crd = yaml.safe_load((REPO / "manifests/crd/gangjob.io_gangjobs.yaml").read_text())
    with contextlib.suppress(AlreadyExists):
        await kube.create(CRDS, crd)
    name = crd["metadata"]["name"]
    listed = await kube.list(CRDS, field_selector=f"metadata.name={name}")

    if listed.items and crd_established(listed.items[0]):
        return
    stream = kube.watch(
        CRDS, field_selector=f"metadata.name={name}", resource_version=listed.resource_version
    )
    async with contextlib.aclosing(stream), asyncio.timeout(DEADLINE):
        async for event in stream:
            if event.type != "BOOKMARK" and crd_established(event.object):
                return


async def test_gangjob_status_subresource_merge_patch(kube: Kube, namespace: str) -> None:
    await ensure_gangjob_crd(kube)
    template = {"spec": {"containers": [{"name": "trainer", "image": "registry.invalid/t:1"}]}}
    gj = {
        "apiVersion": GANGJOBS.api_version,
        "kind": GANGJOBS.kind,
        "metadata": {"name": "train"},
        "spec": {"replicas": 2, "template": template},
    }
    created = await kube.create(GANGJOBS, gj, namespace)
    patched = await kube.patch_status(
        GANGJOBS, "train", {"status": {"epoch": 1, "barrierEpoch": 0}}, namespace
    )
    assert patched["status"]["epoch"] == 1
    # Status written through the main resource is ignored: that is what the subresource is for.
    main = await kube.patch(GANGJOBS, "train", {"status": {"epoch": 7}}, namespace)
    assert main["status"]["epoch"] == 1
    with pytest.raises(Conflict):
        await kube.patch_status(
            GANGJOBS,
            "train",
            {
                "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
                "status": {"epoch": 2},
            },
            namespace,
        )
    listed = await kube.list(GANGJOBS, namespace)
    assert [o["metadata"]["name"] for o in listed.items] == ["train"]
