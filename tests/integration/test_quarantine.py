"""Node quarantine on the real apiserver (`--quarantine-nodes`, docs/design.md section 4.10): the
real controller, with only the RBAC of manifests/rbac and manifests/quarantine, recreates
workers whose device failed on KWOK nodes of the test's own; a node struck `threshold` times is
tainted `gangjob.io/suspect=DeviceUnhealthy:NoSchedule` with an Event on it, never more nodes
than the share allows, its taint lifted at its expiry; a node an admin untainted stays so for
the window."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.builders import gangjob
from controller.k8s import CORE_EVENTS, GANGJOBS, NODES, PODS, JsonDict, Kube, NotFound
from localcluster.cluster import Cluster, Options, kwok_node
from localcluster.tools import REPO, kubectl
from tests.integration.harness import ControllerProcess, controller_kubeconfig, install_crd
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

THRESHOLD = 2
TAINT_SECONDS = 20
WINDOW_SECONDS = 300
SUSPECT = "gangjob.io/suspect"
QUIET_SECONDS = 8.0
"""Long enough for the controller's quarantine round (every 5 s, and at each strike) to have
done what it would: a node not tainted by then is not."""


@dataclass
class World:
    cluster: Cluster
    kube: Kube
    ns: str
    nodes: dict[str, str]
    """Label value -> node name."""
    gangs: int = 0

    async def strike(self, node: str) -> None:
        """A one-worker gang on `node` whose device fails: recreated, a strike on the node."""
        self.gangs += 1
        name = f"g{self.gangs}"
        body = gangjob(
            name, 1, image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
            container={"resources": {"limits": {"nvidia.com/gpu": "1"}}},
            pod_spec={"nodeSelector": {"quarantine-test": node}},
        )  # fmt: skip
        await self.kube.create(GANGJOBS, body, self.ns)
        pod = await wait_for(self.kube, PODS, f"{name}-0", self.ns,
                             lambda p: p.get("status", {}).get("phase") == "Running", 60,
                             "Running")  # fmt: skip
        status = pod["status"]
        for c in status.get("containerStatuses", []):
            c["allocatedResourcesStatus"] = [
                {"name": "nvidia.com/gpu",
                 "resources": [{"resourceID": "gpu-0", "health": "Unhealthy"}]}
            ]  # fmt: skip
        await self.kube.patch_status(PODS, f"{name}-0", {"status": status}, self.ns)
        await wait_for(
            self.kube, GANGJOBS, name, self.ns,
            lambda j: (j.get("status", {}).get("lastRestart") or {}).get("trigger", {}).get(
                "class") == "DeviceUnhealthy", 60, "restarted for its device",
        )  # fmt: skip

    async def node(self, label: str, predicate: Callable[[JsonDict], bool], what: str,
                   timeout: float = 30) -> JsonDict:  # fmt: skip
        return await wait_for(self.kube, NODES, self.nodes[label], None, predicate, timeout, what)

    async def stays(self, label: str, predicate: Callable[[JsonDict], bool], what: str) -> None:
        """`predicate` holds of the node all along `QUIET_SECONDS`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(QUIET_SECONDS):
                await self.node(label, lambda n: not predicate(n), "", QUIET_SECONDS + 5)
                raise AssertionError(f"node {self.nodes[label]}: {what} no longer holds")

    async def event(self, label: str, reason: str) -> JsonDict:
        node = self.nodes[label]

        async def seen() -> JsonDict:
            while True:
                listed = await self.kube.list(
                    CORE_EVENTS, "default",
                    field_selector=f"involvedObject.name={node},reason={reason}",
                )  # fmt: skip
                if listed.items:
                    return listed.items[0]
                await asyncio.sleep(0.2)  # Events of a Node: listed until there

        return await asyncio.wait_for(seen(), 20)


def suspect(node: JsonDict) -> str | None:
    taints = node.get("spec", {}).get("taints") or []
    return next((t.get("value") for t in taints if t.get("key") == SUSPECT), None)


def annotation(node: JsonDict, key: str) -> str | None:
    return (node["metadata"].get("annotations") or {}).get(key)


@pytest.fixture
async def world(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str, tmp_path: Path
) -> AsyncIterator[World]:
    await install_crd(sim_kube)
    labels = ["x", "y", "z"]
    nodes = {label: f"{namespace[:40]}-{label}" for label in labels}
    for label, name in nodes.items():
        node = kwok_node(name, Options(gpus_per_node=4))
        node["metadata"]["labels"]["quarantine-test"] = label
        await sim_kube.create(NODES, node)
    role = REPO / "manifests" / "quarantine" / "role.yaml"
    kubeconfig = controller_kubeconfig(sim_cluster)
    kubectl(sim_cluster, "apply", "-f", str(role))
    # One node suspect at a time, whatever the cluster's other nodes: the share is of them all.
    total = len((await sim_kube.list(NODES)).items)
    share = 1.5 / total
    assert math.floor(share * total) == 1
    ctl = ControllerProcess(
        kubeconfig,
        [f"--namespace={namespace}", "--quarantine-nodes",
         f"--quarantine-threshold={THRESHOLD}", f"--quarantine-window-seconds={WINDOW_SECONDS}",
         f"--quarantine-seconds={TAINT_SECONDS}", f"--quarantine-max-share={share}"],
        tmp_path / "ctl.log",
    )  # fmt: skip
    ctl.start()
    try:
        yield World(sim_cluster, sim_kube, namespace, nodes)
    finally:
        ctl.stop()
        print(ctl.logs()[-4000:])
        for name in nodes.values():
            with contextlib.suppress(NotFound):
                await sim_kube.delete(NODES, name)
        kubectl(sim_cluster, "delete", "--ignore-not-found", "-f", str(role))


async def test_a_node_that_keeps_failing_gangs_is_tainted_within_the_share_and_for_a_while(
    world: World,
) -> None:
    # One strike: below the threshold.
    await world.strike("x")
    await world.stays("x", lambda n: suspect(n) is None, "not suspect after one strike")
    # The second: suspect, with its expiry and an Event on the Node saying why.
    await world.strike("x")
    node = await world.node("x", lambda n: suspect(n) == "DeviceUnhealthy", "tainted")
    assert annotation(node, "gangjob.io/suspect-until") is not None
    taint = next(t for t in node["spec"]["taints"] if t["key"] == SUSPECT)
    assert taint["effect"] == "NoSchedule"
    event = await world.event("x", "NodeSuspect")
    assert "2 workers restarted or moved off this node" in event["message"], event
    assert event["type"] == "Warning"

    # Node y struck as often while x is suspect: the share allows one node at a time.
    await world.strike("y")
    await world.strike("y")
    await world.stays("y", lambda n: suspect(n) is None, "kept untainted by the share cap")

    # x's taint expires and is lifted; then there is room for y, whose strikes still count.
    node = await world.node("x", lambda n: suspect(n) is None, "lifted", TAINT_SECONDS + 15)
    assert annotation(node, "gangjob.io/suspect-until") is None
    await world.event("x", "NodeSuspectLifted")
    await world.node("y", lambda n: suspect(n) == "DeviceUnhealthy", "tainted once room")

    # An admin takes y's taint off: it stays off for the window, whatever strikes y again.
    kubectl(world.cluster, "taint", "nodes", world.nodes["y"], f"{SUSPECT}-")
    node = await world.node(
        "y", lambda n: annotation(n, "gangjob.io/suspect-cleared-until") is not None,
        "marked cleared by an admin",
    )  # fmt: skip
    assert annotation(node, "gangjob.io/suspect-until") is None
    await world.event("y", "NodeSuspectCleared")
    await world.strike("y")
    await world.strike("y")
    await world.stays("y", lambda n: suspect(n) is None, "left untainted, as the admin wants")
