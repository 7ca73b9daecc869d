"""`spec.scheduling.topologyKey` on the real 1.36 scheduler (`localcluster up
--gang-scheduling`: gate `TopologyAwareWorkloadScheduling`, plugin
`TopologyPlacementGenerator`), on KWOK nodes of this test labelled by rack: two gangs that each
fit one rack land whole in different racks (and straddle racks without the key); a worker
recreated after node loss stays in its gang's rack although the other rack is emptier; a gang
bigger than every rack stays Pending, `Stuck` saying why."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.apiclient import HttpClient, ssl_context
from controller.k8s import GANGJOBS, NODES, PODGROUPS, PODS, Invalid, JsonDict, Kube, NotFound
from localcluster.cluster import Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet
from tests.integration.harness import ControllerProcess, install_crd, kubectl, watch_job
from tests.integration.test_restart import (
    RESTART_DELAY,
    Gang,
    _lose_node,
    _node_ready,
    ctl_kubeconfig,
)
from tests.waiting import wait_for, wait_for_pods, wait_gone

__all__ = ["ctl_kubeconfig"]  # the fixture, shared

pytestmark = pytest.mark.integration

RACK = "topology.kubernetes.io/rack"
TIMEOUT = 120  # the machine is shared and loaded: generous, never a sleep

Racks = Callable[[int, int], Awaitable[Gang]]
"""Makes this test's world: `racks` racks of `nodes` KWOK nodes (8 GPUs each), the
controller and the simulated kubelet."""


@pytest.fixture
async def racks(
    sim_cluster: Cluster,
    sim_kube: Kube,
    namespace: str,
    ctl_kubeconfig: Path,
    tmp_path: Path,
) -> AsyncIterator[Racks]:
    await install_crd(sim_kube)
    made: list[str] = []
    closing: list[Callable[[], Awaitable[None]]] = []

    async def make(count: int, per_rack: int) -> Gang:
        for r in range(count):
            for i in range(per_rack):
                name = f"{namespace}-r{r}n{i}"
                node = kwok_node(name, Options(gpus_per_node=8))
                node["metadata"]["labels"].update({"gangjob-test": namespace, RACK: f"rack-{r}"})
                await sim_kube.create(NODES, node)
                made.append(name)
        for name in made:
            await wait_for(sim_kube, NODES, name, None, _node_ready, 30, "Ready")
        api = HttpClient(
            sim_cluster.server,
            ssl_context=ssl_context(
                sim_cluster.pki / "ca.crt",
                sim_cluster.pki / "admin.crt",
                sim_cluster.pki / "admin.key",
            ),
        )
        ctl = ControllerProcess(
            ctl_kubeconfig, [f"--namespace={namespace}"], tmp_path / "ctl.log", arrivals=True
        )
        sim = SimKubelet(api, namespace, restart_delay=RESTART_DELAY, arrival_url=ctl.arrival_url)
        task = asyncio.create_task(sim.run())
        ctl.start()

        async def close() -> None:
            ctl.stop()
            print(ctl.logs()[-4000:])
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await sim.close()
            await api.close()

        closing.append(close)
        return Gang(sim_kube, namespace, made, sim, ctl)

    try:
        yield make
    finally:
        for close in closing:
            await close()
        for name in made:
            with contextlib.suppress(NotFound):
                await sim_kube.delete(NODES, name)


def gpus(n: int) -> dict[str, Any]:
    return {
        "resources": {"requests": {"nvidia.com/gpu": str(n)}, "limits": {"nvidia.com/gpu": str(n)}}
    }


async def rack_of(kube: Kube) -> dict[str, str]:
    """Node -> its rack."""
    nodes = (await kube.list(NODES, label_selector=RACK)).items
    return {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in nodes}


async def placed(kube: Kube, ns: str, jobs: list[str], workers: int) -> dict[str, list[str]]:
    """Job -> its workers' racks, once every worker of every job is bound."""

    def bound(pods: list[JsonDict]) -> bool:
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return len(live) == workers * len(jobs) and all(p["spec"].get("nodeName") for p in live)

    pods = await wait_for_pods(kube, ns, bound, TIMEOUT, "every worker bound")
    racks = await rack_of(kube)
    out: dict[str, list[str]] = {job: [] for job in jobs}
    for p in pods:
        out[p["metadata"]["labels"]["gangjob.io/name"]].append(racks[p["spec"]["nodeName"]])
    return out


def show(cluster: Cluster, ns: str) -> None:
    """The placement as `kubectl get pods -o wide` and the nodes' rack labels show it."""
    print(kubectl(cluster, "-n", ns, "get", "pods", "-o", "wide"))
    print(kubectl(cluster, "get", "nodes", "-L", RACK, "-l", f"gangjob-test={ns}"))


async def test_two_gangs_land_whole_in_different_racks_and_straddle_without_the_key(
    racks: Racks, sim_cluster: Cluster
) -> None:
    gang = await racks(2, 2)  # two racks of 16 GPUs
    kube, ns = gang.kube, gang.ns
    for name in ("left", "right"):
        await gang.create(name, 4, trainer=gpus(4), scheduling={"topologyKey": RACK})
    where = await placed(kube, ns, ["left", "right"], 4)
    show(sim_cluster, ns)
    assert len(set(where["left"])) == 1, where
    assert len(set(where["right"])) == 1, where
    assert set(where["left"]) != set(where["right"]), where
    group = await kube.get(PODGROUPS, "left-of-4", ns)
    assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    job = await kube.get(GANGJOBS, "left", ns)
    conds = {c["type"]: c for c in job["status"]["conditions"]}
    assert conds["GangScheduling"]["reason"] == "PodGroupTopology"

    # The same two gangs without the key: the scheduler spreads each over both racks.
    for name in ("left", "right"):
        await kube.delete(GANGJOBS, name, ns, propagation_policy="Foreground")
    for name in ("left", "right"):
        await wait_gone(kube, GANGJOBS, name, ns, timeout=TIMEOUT)
    await wait_for_pods(kube, ns, lambda pods: not pods, TIMEOUT, "no pod left")
    for name in ("left", "right"):
        await gang.create(name, 4, trainer=gpus(4))
    where = await placed(kube, ns, ["left", "right"], 4)
    show(sim_cluster, ns)
    assert any(len(set(r)) > 1 for r in where.values()), where


async def test_a_replacement_after_node_loss_stays_in_its_rack(racks: Racks) -> None:
    gang = await racks(2, 3)  # two racks of three 8-GPU nodes
    kube = gang.kube
    await gang.create(
        "stay", 3, trainer=gpus(4),
        scheduling={"topologyKey": RACK}, nodeLoss={"forceDeleteAfterSeconds": 2},
    )  # fmt: skip
    await gang.running_at("stay", 0, 3, timeout=TIMEOUT)
    await gang.agents_at(0, [f"stay-{r}" for r in range(3)])
    before = await gang.pods("stay")
    racks_of = await rack_of(kube)
    (home,) = {racks_of[p["spec"]["nodeName"]] for p in before.values()}
    node = before["stay-1"]["spec"]["nodeName"]
    lost = [n for n, p in before.items() if p["spec"]["nodeName"] == node]
    for name in lost:
        gang.sim.lose(name)
    await _lose_node(kube, node)

    job = await gang.running_at("stay", 1, 3, timeout=TIMEOUT)
    after = await gang.pods("stay")
    for name in lost:
        assert after[name]["metadata"]["uid"] != before[name]["metadata"]["uid"]
        assert after[name]["spec"]["nodeName"] != node
    # Back in its rack, though the other rack's three nodes stand empty.
    assert {racks_of[p["spec"]["nodeName"]] for p in after.values()} == {home}
    assert job["status"]["lastRestart"]["trigger"]["class"] == "NodeLost"


async def test_a_gang_bigger_than_every_rack_stays_pending_and_says_why(racks: Racks) -> None:
    gang = await racks(2, 2)  # two racks of 16 GPUs; the gang needs 20 (the cluster has 32)
    kube, ns = gang.kube, gang.ns
    await gang.create("big", 5, trainer=gpus(4), scheduling={"topologyKey": RACK})

    def stuck(job: JsonDict) -> bool:
        conds = {c["type"]: c for c in job.get("status", {}).get("conditions", [])}
        return bool(conds.get("Stuck", {}).get("reason") == "NoTopologyDomainFits")

    job = await watch_job(kube, ns, "big", stuck, TIMEOUT, "Stuck: NoTopologyDomainFits")
    message = {c["type"]: c for c in job["status"]["conditions"]}["Stuck"]["message"]
    assert message.startswith(f"The gang needs nvidia.com/gpu 20 in one domain of {RACK}")
    assert "has nvidia.com/gpu 16" in message
    assert job["status"]["phase"] == "Pending"

    def tried(group: JsonDict) -> bool:
        conds = {c["type"]: c for c in group.get("status", {}).get("conditions", [])}
        return bool(conds.get("PodGroupScheduled", {}).get("status") == "False")

    # The scheduler tried the whole gang and placed none of it, though 32 GPUs are free.
    await wait_for(kube, PODGROUPS, "big-of-5", ns, tried, TIMEOUT, "PodGroupScheduled False")
    pods = (await kube.list(PODS, ns)).items
    assert len(pods) == 5
    assert not any(p["spec"].get("nodeName") for p in pods)
    # The key is as immutable as the PodGroup's constraint.
    with pytest.raises(Invalid) as err:
        await kube.patch(GANGJOBS, "big", {"spec": {"scheduling": {"topologyKey": "zone"}}}, ns)
    assert "spec.scheduling.topologyKey is immutable" in str(err.value)
