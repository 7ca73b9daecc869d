"""Quota admission by a real Kueue (localcluster.kueue, built from the module proxy on first use)
on the sim cluster: a GangJob labelled with a queue is one Kueue pod group, admitted whole or
not at all, kept admitted through an in-place restart, and its quota released when it ends."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.apiclient import HttpClient, ssl_context
from api.builders import gangjob
from api.constants import KUEUE_QUEUE_NAME_LABEL
from controller.k8s import GANGJOBS, NODES, PODS, JsonDict, Kube, NotFound, ResourceKind
from localcluster import kueue
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet
from tests.integration.harness import ControllerProcess, controller_kubeconfig, install_crd
from tests.integration.test_restart import (
    RESTART_DELAY,
    Gang,
    _lose_node,
    _node_ready,
    _patch_pod_status,
)
from tests.waiting import wait_for, wait_for_pods

pytestmark = pytest.mark.integration

WORKLOADS = ResourceKind(kueue.GROUP, kueue.API_VERSION.split("/")[1], "workloads", "Workload")
WORKERS = 2
GPU_QUOTA = 3  # one gang of 2 x 1 GPU fits, two do not; the nodes have 6 GPUs: quota decides
QUEUE = "team"
TIMEOUT = 180  # the machine is shared and loaded: generous, never a sleep


@pytest.fixture
async def queued(
    request: pytest.FixtureRequest,
    sim_cluster: Cluster,
    sim_kube: Kube,
    namespace: str,
    tmp_path: Path,
) -> AsyncIterator[Gang]:
    """Kueue with a ClusterQueue of `GPU_QUOTA` GPUs, the controller, the simulated kubelet,
    and three nodes of this test's own with 2 GPUs each. An indirect parameter is Kueue's
    `waitForPodsReady` (default: off)."""
    await install_crd(sim_kube)
    pods_ready = getattr(request, "param", None)
    mgr = await asyncio.to_thread(
        kueue.start, sim_cluster, wait_for_pods_ready=pods_ready, out=sys.stderr
    )
    # The namespace whole (its random suffix too): a node name used again soon after its node
    # was lost may still be tainted unreachable by the controller-manager.
    names = [f"{namespace}-n{i}" for i in range(3)]
    api = HttpClient(
        sim_cluster.server,
        ssl_context=ssl_context(
            sim_cluster.pki / "ca.crt", sim_cluster.pki / "admin.crt", sim_cluster.pki / "admin.key"
        ),
    )
    ctl = ControllerProcess(
        controller_kubeconfig(sim_cluster), [f"--namespace={namespace}"], tmp_path / "ctl.log"
    )
    sim = SimKubelet(api, namespace, restart_delay=RESTART_DELAY, arrival_url=ctl.arrival_url)
    sim_task = asyncio.create_task(sim.run())
    try:
        quota = {"cpu": "1000", "memory": "1000Gi", "nvidia.com/gpu": str(GPU_QUOTA)}
        # A ClusterQueue of this test's own: an earlier test's Workloads, admitted until their
        # namespace is gone, must not hold this one's quota.
        await asyncio.to_thread(
            kueue.apply_queue, sim_cluster, QUEUE, namespace, quota, cluster_queue=namespace
        )
        for name in names:
            node = kwok_node(name, Options(gpus_per_node=2))
            node["metadata"]["labels"]["gangjob-test"] = namespace
            await sim_kube.create(NODES, node)
        for name in names:
            await wait_for(sim_kube, NODES, name, None, _node_ready, 30, "Ready")
        ctl.start()
        yield Gang(sim_kube, namespace, names, sim, ctl)
    finally:
        ctl.stop()
        print(ctl.logs()[-4000:])
        sim_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sim_task
        await sim.close()
        await api.close()
        # Kueue's finalizer on the workers would outlive it and hold the namespace.
        mgr.stop()
        for pod in (await sim_kube.list(PODS, namespace)).items:
            with contextlib.suppress(NotFound):
                await sim_kube.patch(
                    PODS, pod["metadata"]["name"], {"metadata": {"finalizers": None}}, namespace
                )
        for name in names:
            with contextlib.suppress(NotFound):
                await sim_kube.delete(NODES, name)


async def create(g: Gang, name: str, workers: int = WORKERS, **spec: Any) -> JsonDict:
    gpu = {"nvidia.com/gpu": "1"}
    body = gangjob(
        name, workers,
        labels={KUEUE_QUEUE_NAME_LABEL: QUEUE},
        image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        container={"resources": {"requests": gpu, "limits": gpu}},
        pod_spec={"nodeSelector": {"gangjob-test": g.ns}},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
        spec=spec,
    )  # fmt: skip
    return await g.kube.create(GANGJOBS, body, g.ns)


def cond(obj: JsonDict, kind: str) -> JsonDict:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


def admitted(wl: JsonDict) -> bool:
    return cond(wl, "Admitted").get("status") == "True"


def of(pods: list[JsonDict], job: str) -> list[JsonDict]:
    return [p for p in pods if p["metadata"]["name"].rsplit("-", 1)[0] == job]


def bound(pods: list[JsonDict], job: str) -> int:
    return sum(1 for p in of(pods, job) if p["spec"].get("nodeName"))


async def test_quota_admits_one_gang_whole_keeps_it_through_a_restart_then_the_next(
    queued: Gang,
) -> None:
    g = queued
    await create(g, "first")
    await g.running_at("first", 0, WORKERS, timeout=TIMEOUT)
    wl_first = await wait_for(g.kube, WORKLOADS, "first", g.ns, admitted, TIMEOUT, "Admitted")
    assert wl_first["spec"]["podSets"][0]["count"] == WORKERS

    # The second gang does not fit the quota: Kueue keeps its pods gated, none is bound, though
    # the nodes have the GPUs for it.
    await create(g, "second")
    wl_second = await wait_for(
        g.kube,
        WORKLOADS,
        "second",
        g.ns,
        lambda wl: cond(wl, "QuotaReserved").get("status") == "False",
        TIMEOUT,
        "QuotaReserved=False",
    )
    assert not admitted(wl_second)
    assert "nvidia.com/gpu" in cond(wl_second, "QuotaReserved")["message"]
    pods = (await g.kube.list(PODS, g.ns)).items
    assert len(of(pods, "second")) == WORKERS
    assert bound(pods, "second") == 0
    for pod in of(pods, "second"):
        gates = [x["name"] for x in pod["spec"].get("schedulingGates", [])]
        assert "kueue.x-k8s.io/admission" in gates

    # A worker of the first crashes: the gang restarts in place, its pods stay, and so does
    # its admission (same Admitted transition, never Evicted); the second still waits.
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in of(pods, "first")}
    admitted_at = cond(wl_first, "Admitted")["lastTransitionTime"]
    await g.agents_at(0, list(before))
    await g.sim.crash("first-1", 1)
    job = await g.running_at("first", 1, WORKERS, timeout=TIMEOUT)
    assert job["status"]["restarts"]["inPlace"] == 1
    pods = (await g.kube.list(PODS, g.ns)).items
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in of(pods, "first")} == before
    wl_first = await g.kube.get(WORKLOADS, "first", g.ns)
    assert admitted(wl_first)
    assert cond(wl_first, "Admitted")["lastTransitionTime"] == admitted_at
    assert cond(wl_first, "Evicted").get("status") != "True"
    assert not admitted(await g.kube.get(WORKLOADS, "second", g.ns))
    assert bound(pods, "second") == 0

    # The first gang ends: its quota goes back, and the second is admitted and bound whole.
    for name in before:
        g.sim.lose(name)  # the simulated kubelet leaves the pod to the status patch below
        await succeed(g.kube, g.ns, await g.kube.get(PODS, name, g.ns))
    wl_first = await wait_for(
        g.kube,
        WORKLOADS,
        "first",
        g.ns,
        lambda wl: cond(wl, "Finished").get("status") == "True",
        TIMEOUT,
        "Finished",
    )
    await wait_for(g.kube, WORKLOADS, "second", g.ns, admitted, TIMEOUT, "Admitted")
    await wait_for_pods(
        g.kube, g.ns, lambda ps: bound(ps, "second") == WORKERS, TIMEOUT, "second bound whole"
    )
    await g.running_at("second", 0, WORKERS, timeout=TIMEOUT)


async def test_a_worker_recreated_after_node_loss_joins_the_admitted_workload(
    queued: Gang,
) -> None:
    g = queued
    await create(g, "lost", 3, nodeLoss={"forceDeleteAfterSeconds": 2})
    await g.running_at("lost", 0, 3, timeout=TIMEOUT)
    wl = await wait_for(g.kube, WORKLOADS, "lost", g.ns, admitted, TIMEOUT, "Admitted")
    admitted_at = cond(wl, "Admitted")["lastTransitionTime"]
    before = {p["metadata"]["name"]: p for p in of((await g.kube.list(PODS, g.ns)).items, "lost")}
    await g.agents_at(0, list(before))
    node = before["lost-1"]["spec"]["nodeName"]
    lost = [n for n, p in before.items() if p["spec"]["nodeName"] == node]
    for n in lost:
        g.sim.lose(n)
    await _lose_node(g.kube, node)

    # Force-deleted and Failed, the old pod keeps Kueue's finalizer until the controller lifts
    # it; then the same-named replacement is created, gated by Kueue, and ungated as a member
    # of the Workload that stayed admitted all along.
    job = await g.running_at("lost", 1, 3, timeout=TIMEOUT)
    assert job["status"]["lastRestart"]["trigger"]["class"] == "NodeLost"
    after = {p["metadata"]["name"]: p for p in of((await g.kube.list(PODS, g.ns)).items, "lost")}
    for n, pod in after.items():
        replaced = n in lost
        assert (pod["metadata"]["uid"] != before[n]["metadata"]["uid"]) == replaced, n
        assert pod["spec"]["nodeName"] != node, n
        assert not pod["spec"].get("schedulingGates"), n
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "lost"
    wl = await g.kube.get(WORKLOADS, "lost", g.ns)
    assert admitted(wl)
    assert cond(wl, "Admitted")["lastTransitionTime"] == admitted_at
    assert cond(wl, "Evicted").get("status") != "True"
    print(f"node loss under Kueue: {job['status']['lastRestart']['durationSeconds']} s")


async def test_a_worker_recreated_for_an_unhealthy_device_joins_the_admitted_workload(
    queued: Gang,
) -> None:
    """Its node goes on `avoidNodes`, yet the replacement is created in its group's shape
    (Kueue's role hash covers the affinity) and kept off the node while gated."""
    g = queued
    await create(g, "dev", 3)
    await g.running_at("dev", 0, 3, timeout=TIMEOUT)
    wl = await wait_for(g.kube, WORKLOADS, "dev", g.ns, admitted, TIMEOUT, "Admitted")
    admitted_at = cond(wl, "Admitted")["lastTransitionTime"]
    before = {p["metadata"]["name"]: p for p in of((await g.kube.list(PODS, g.ns)).items, "dev")}
    await g.agents_at(0, list(before))
    bad_node = before["dev-1"]["spec"]["nodeName"]

    def unhealthy(status: JsonDict) -> None:
        for c in status.get("containerStatuses", []):
            if c["name"] == "trainer":
                c["allocatedResourcesStatus"] = [
                    {"name": "nvidia.com/gpu",
                     "resources": [{"resourceID": "gpu-0", "health": "Unhealthy"}]}
                ]  # fmt: skip

    await _patch_pod_status(g.kube, g.ns, "dev-1", unhealthy)
    job = await g.running_at("dev", 1, 3, timeout=TIMEOUT)
    assert job["status"]["lastRestart"]["trigger"]["class"] == "DeviceUnhealthy"
    assert job["status"]["avoidNodes"] == [bad_node]
    after = {p["metadata"]["name"]: p for p in of((await g.kube.list(PODS, g.ns)).items, "dev")}
    for n, pod in after.items():
        assert (pod["metadata"]["uid"] != before[n]["metadata"]["uid"]) == (n == "dev-1"), n
        assert not pod["spec"].get("schedulingGates"), n
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "dev"
    assert after["dev-1"]["spec"]["nodeName"] != bad_node
    terms = after["dev-1"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad_node]}
    assert all(avoid in term["matchExpressions"] for term in terms), terms
    wl = await g.kube.get(WORKLOADS, "dev", g.ns)
    assert admitted(wl)
    assert cond(wl, "Admitted")["lastTransitionTime"] == admitted_at
    assert cond(wl, "Evicted").get("status") != "True"


PODS_READY = {"timeout": "5m", "recoveryTimeout": "10m"}


@pytest.mark.parametrize("queued", [PODS_READY], indirect=True)
async def test_wait_for_pods_ready_sees_the_in_place_restart_and_keeps_the_admission(
    queued: Gang,
) -> None:
    """kueue issue 14811: with `waitForPodsReady` the restart's unready spell is a recovery
    (`PodsReady=False`, `WaitForRecovery`), which evicts only past `recoveryTimeout`."""
    g = queued
    await create(g, "ready")
    await g.running_at("ready", 0, WORKERS, timeout=TIMEOUT)

    def ready(wl: JsonDict) -> bool:
        return admitted(wl) and cond(wl, "PodsReady").get("status") == "True"

    wl = await wait_for(g.kube, WORKLOADS, "ready", g.ns, ready, TIMEOUT, "PodsReady")
    admitted_at = cond(wl, "Admitted")["lastTransitionTime"]
    seen: list[tuple[str | None, str | None]] = []

    async def recovered() -> JsonDict:
        # From the version read before the crash: no transition of PodsReady is missed.
        stream = g.kube.watch(
            WORKLOADS,
            g.ns,
            field_selector="metadata.name=ready",
            resource_version=wl["metadata"]["resourceVersion"],
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type not in ("ADDED", "MODIFIED"):
                    continue
                c = cond(ev.object, "PodsReady")
                seen.append((c.get("status"), c.get("reason")))
                if ("False", "WaitForRecovery") in seen and c.get("status") == "True":
                    return ev.object
        raise AssertionError("watch ended")

    watching = asyncio.create_task(asyncio.wait_for(recovered(), TIMEOUT))
    await g.agents_at(0, [f"ready-{r}" for r in range(WORKERS)])
    await g.sim.crash("ready-0", 1)
    await g.running_at("ready", 1, WORKERS, timeout=TIMEOUT)
    try:
        wl = await watching
    except TimeoutError:
        raise AssertionError(f"PodsReady did not recover; seen {seen}") from None
    assert admitted(wl)
    assert cond(wl, "Admitted")["lastTransitionTime"] == admitted_at
    assert cond(wl, "Evicted").get("status") != "True"
    assert not wl["status"].get("requeueState")


async def succeed(kube: Kube, ns: str, pod: JsonDict) -> None:
    """What the kubelet reports when the worker's containers exited 0."""
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": "2026-01-01T00:00:00Z",
                    "finishedAt": "2026-01-01T00:00:01Z",
                }
            },
        }
        for c in pod["spec"]["containers"]
    ]
    body = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
    await kube.patch_status(PODS, pod["metadata"]["name"], body, ns)
