"""Whole-gang preemption on the real 1.36 scheduler (`localcluster up --gang-scheduling`: gate
`WorkloadAwarePreemption`), two priority classes, two KWOK nodes of 8 GPUs: a low-priority gang
of 2 x 8 GPUs runs; a high-priority gang of 1 x 8 GPUs arrives. Its PodGroup preempts the low
gang whole (both workers, though one node would have done), the low GangJob records one restart
of class `Preempted`, not counted, its recreated workers wait unbound while the high gang runs,
and start again whole once it is gone."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from api.builders import gangjob
from controller.k8s import GANGJOBS, PODGROUPS, JsonDict, Kube, NotFound
from controller.k8s.kinds import ResourceKind
from localcluster.cluster import SIMULATED_KUBELET_LABEL
from tests.integration.test_restart import Gang, ctl_kubeconfig
from tests.integration.test_topology import TIMEOUT, Racks, gpus, racks
from tests.waiting import wait_for, wait_for_pods, wait_gone

__all__ = ["ctl_kubeconfig", "racks"]  # the fixtures, shared

pytestmark = pytest.mark.integration

PRIORITY_CLASSES = ResourceKind(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False
)


async def create(gang: Gang, name: str, replicas: int, priority: str) -> JsonDict:
    body = gangjob(
        name, replicas,
        image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        container=gpus(8),
        pod_spec={"nodeSelector": {"gangjob-test": gang.ns}, "priorityClassName": priority},
        pod_labels={SIMULATED_KUBELET_LABEL: "true"},
    )  # fmt: skip
    return await gang.kube.create(GANGJOBS, body, gang.ns)


@contextlib.asynccontextmanager
async def priority_classes(kube: Kube, prefix: str, **values: int) -> Any:
    names = {level: f"{prefix}-{level}" for level in values}
    for level, value in values.items():
        body = {"metadata": {"name": names[level]}, "value": value}
        await kube.create(PRIORITY_CLASSES, body)
    try:
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(NotFound):
                await kube.delete(PRIORITY_CLASSES, name)


def unbound_and_tried(names: set[str]) -> Any:
    """Every named pod exists, new, unbound, and the scheduler found it unschedulable."""

    def check(pods: list[JsonDict]) -> bool:
        found = {p["metadata"]["name"]: p for p in pods if p["metadata"]["name"] in names}
        if set(found) != names:
            return False
        for pod in found.values():
            conds = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
            if (
                pod["spec"].get("nodeName")
                or conds.get("PodScheduled", {}).get("status") != "False"
            ):
                return False
        return True

    return check


async def test_a_higher_priority_gang_preempts_a_lower_one_whole(racks: Racks) -> None:
    gang = await racks(1, 2)  # two nodes of 8 GPUs
    kube, ns = gang.kube, gang.ns
    async with priority_classes(kube, ns[:40], low=100, high=1000) as classes:
        await create(gang, "low", 2, classes["low"])
        await gang.running_at("low", 0, 2, timeout=TIMEOUT)
        await gang.agents_at(0, ["low-0", "low-1"])
        before = await gang.pods("low")
        group = await kube.get(PODGROUPS, "low-of-2", ns)
        assert group["spec"]["disruptionMode"] == "PodGroup"
        assert group["spec"]["priorityClassName"] == classes["low"]
        assert group["spec"]["priority"] == 100

        await create(gang, "high", 1, classes["high"])
        await gang.running_at("high", 0, 1, timeout=TIMEOUT)
        # Whole: both low workers were preempted, though the high gang needed one node.
        job = await wait_for(
            kube, GANGJOBS, "low", ns,
            lambda j: j.get("status", {}).get("epoch") == 1, TIMEOUT, "restarted",
        )  # fmt: skip
        last = job["status"]["lastRestart"]
        assert last["trigger"]["class"] == "Preempted", last
        assert "PreemptionByScheduler" in last["trigger"]["detail"]
        assert job["status"]["restarts"]["counted"] == 0
        # The new low workers wait, neither bound: 8 GPUs are free, the gang needs 16.
        await wait_for_pods(
            kube, ns, unbound_and_tried({"low-0", "low-1"}), TIMEOUT, "low unbound, tried"
        )
        after = await gang.pods("low")
        for name, pod in before.items():
            assert after[name]["metadata"]["uid"] != pod["metadata"]["uid"], name

        # The high gang goes: the low one starts again, whole, at the next epoch.
        await kube.delete(GANGJOBS, "high", ns, propagation_policy="Foreground")
        await wait_gone(kube, GANGJOBS, "high", ns, timeout=TIMEOUT)
        job = await gang.running_at("low", 1, 2, timeout=TIMEOUT)
        pods = await gang.pods("low")
        assert all(p["spec"].get("nodeName") for p in pods.values())
        assert job["status"]["restarts"]["total"] == 1
