"""The simulated kubelet's own bookkeeping against the real apiserver: what it caches after a
relist, and which pod its status writes land on. The benchmarks at N=5000 stalled on both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.apiclient import HttpClient, ssl_context
from controller.k8s import PODS, JsonDict, Kube, NotFound
from localcluster import simkubelet
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster
from localcluster.simkubelet import SimKubelet

pytestmark = pytest.mark.integration


@pytest.fixture
async def sim(sim_cluster: Cluster, namespace: str) -> AsyncIterator[SimKubelet]:
    pki = sim_cluster.pki
    api = HttpClient(
        sim_cluster.server,
        ssl_context=ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key"),
    )
    s = SimKubelet(api, namespace)  # not run: the tests drive its steps themselves
    try:
        yield s
    finally:
        await s.close()
        await api.close()


def _pod(name: str) -> JsonDict:
    return {
        "metadata": {"name": name, "labels": {"gangjob.io/name": "g"}},
        "spec": {
            "containers": [{"name": "trainer", "image": "localhost/busybox:dev"}],
            # No node fits: it stays Pending, and no kubelet (KWOK's) writes its status.
            "nodeSelector": {"gangjob-test/no-such-node": "x"},
        },
    }


async def _recreate(kube: Kube, ns: str, name: str) -> JsonDict:
    await kube.delete(PODS, name, ns, grace_period_seconds=0)
    return await kube.create(PODS, _pod(name), ns)


async def test_a_relist_drops_the_pods_deleted_while_no_watch_was_open(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    for name in ("a", "b"):
        await sim_kube.create(PODS, _pod(name), namespace)
    listed = await sim.api.get(sim.pods_path, {"labelSelector": "gangjob.io/name"})
    sim._relisted(listed["items"])
    assert set(sim.pods) == {"a", "b"}

    # Deleted and recreated while the watch was down: neither DELETED event ever arrives.
    await sim_kube.delete(PODS, "a", namespace, grace_period_seconds=0)
    new_b = await _recreate(sim_kube, namespace, "b")
    listed = await sim.api.get(sim.pods_path, {"labelSelector": "gangjob.io/name"})
    sim._relisted(listed["items"])

    assert set(sim.pods) == {"b"}
    assert sim.pods["b"]["metadata"]["uid"] == new_b["metadata"]["uid"]


async def test_a_status_write_never_lands_on_a_recreated_pod_of_the_same_name(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    old = await sim_kube.create(PODS, _pod("w"), namespace)
    sim._relisted([old])  # the watch's copy is of the old pod
    new = await _recreate(sim_kube, namespace, "w")

    def restarting(status: JsonDict) -> None:
        status["conditions"] = [{"type": "AllContainersRestarting", "status": "True"}]

    def conditions(pod: JsonDict) -> list[str]:
        return [c["type"] for c in pod.get("status", {}).get("conditions", [])]

    # The old pod's kubelet, late: its write conflicts on the stale version, and the fresh read
    # finds another pod.
    await sim._patch_status("w", old["metadata"]["uid"], restarting)
    assert "AllContainersRestarting" not in conditions(await sim_kube.get(PODS, "w", namespace))

    # The same write for the pod that is there does land.
    await sim._patch_status("w", new["metadata"]["uid"], restarting)
    assert "AllContainersRestarting" in conditions(await sim_kube.get(PODS, "w", namespace))


async def test_the_pod_list_comes_whole_in_pages(
    sim: SimKubelet, sim_kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simkubelet, "LIST_PAGE", 2)
    names = {f"p{i}" for i in range(5)}
    for name in names:
        await sim_kube.create(PODS, _pod(name), namespace)
    items, rv = await sim._list({"labelSelector": "gangjob.io/name"})
    assert sorted(p["metadata"]["name"] for p in items) == sorted(names)
    assert int(rv) > 0  # the snapshot's version, for the watch that follows


def _bound_pod(name: str) -> JsonDict:
    """A pod on a KWOK node, labelled for the simulated kubelet to finish its deletion."""
    pod = _pod(name)
    pod["metadata"]["labels"][SIMULATED_KUBELET_LABEL] = "true"
    del pod["spec"]["nodeSelector"]
    pod["spec"]["nodeName"] = "kwok-node-0"
    return pod


async def test_the_simulation_not_kwok_finishes_a_deletion_and_only_for_its_uid(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    old = await sim_kube.create(PODS, _bound_pod("w"), namespace)
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=30)
    # KWOK's pod-delete stage skips the label (KWOK deletes by name only): it stays terminating.
    await asyncio.sleep(3)
    terminating = await sim_kube.get(PODS, "w", namespace)
    assert terminating["metadata"]["deletionTimestamp"]

    # Recreated under the same name (as the controller recreates a worker) while the old pod's
    # deletion was pending: the late finish of the old pod must not remove the new one.
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=0)
    new = await sim_kube.create(PODS, _bound_pod("w"), namespace)
    sim._finish_deletion(terminating)
    await asyncio.gather(*sim._tasks)
    assert (await sim_kube.get(PODS, "w", namespace))["metadata"]["uid"] == new["metadata"]["uid"]
    assert old["metadata"]["uid"] != new["metadata"]["uid"]

    # The new pod's own deletion is finished, as soon as the simulation sees it terminating.
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=30)
    sim._seen(await sim_kube.get(PODS, "w", namespace))
    await asyncio.gather(*sim._tasks)
    with pytest.raises(NotFound):
        await sim_kube.get(PODS, "w", namespace)
