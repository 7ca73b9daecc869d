"""A stuck gang says why, on the real kubelet (controller/policy/stuck.py): an agent image the
node cannot pull makes the GangJob `Stuck` with reason `AgentImagePullFailed`, the kubelet's own
message and the fix; agents that cannot reach the arrival endpoint make it `ArrivalDegraded`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api import builders
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE, Bridge
from localcluster.procs import free_port
from localcluster.tools import ControllerProcess
from tests.integration.harness import watch_job

pytestmark = pytest.mark.e2e

MISSING_AGENT = "localhost/gangjob-agent:not-built"


@pytest.fixture
async def controller(
    node_controller_kubeconfig: Path, node_namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerProcess]:
    """A controller that gives its workers an agent image no node has nor can pull."""
    ctl = ControllerProcess(
        node_controller_kubeconfig,
        [f"--namespace={node_namespace}", f"--agent-image={MISSING_AGENT}"],
        tmp_path / "controller.log",
    )
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-5000:])


def stuck_on_the_agents_image(job: JsonDict) -> bool:
    return any(
        c["type"] == "Stuck" and c["status"] == "True" and c["reason"] == "AgentImagePullFailed"
        for c in (job.get("status") or {}).get("conditions") or []
    )


async def test_an_agent_image_the_node_cannot_pull_is_said_on_the_gangjob(
    node_cluster: Cluster, node_kube: Kube, node_namespace: str, controller: ControllerProcess
) -> None:
    job = builders.gangjob(
        "no-agent",
        1,
        image="localhost/busybox:dev",
        command=["sh", "-c", "sleep 3600"],
        container={"imagePullPolicy": "Never"},
    )
    await node_kube.create(GANGJOBS, job, node_namespace)
    found = await watch_job(
        node_kube, node_namespace, "no-agent", stuck_on_the_agents_image, 120,
        "Stuck: AgentImagePullFailed",
    )  # fmt: skip
    stuck = next(c for c in found["status"]["conditions"] if c["type"] == "Stuck")
    message = stuck["message"]
    assert "container gangjob-agent of worker 0 (pod no-agent-0)" in message
    # The kubelet's reason and message, which names the image.
    assert "ErrImagePull" in message or "ImagePullBackOff" in message
    assert MISSING_AGENT in message
    assert "--agent-image" in message


async def test_agents_that_cannot_reach_the_arrival_endpoint_are_said_on_the_gangjob(
    node_cluster: Cluster,
    node_kube: Kube,
    node_namespace: str,
    node_controller_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """The controller gives its agents an arrival URL where nothing listens (a network policy
    would look the same to them): they fall back to annotating their pods, and the gang runs,
    which `ArrivalDegraded` says."""
    unreachable = f"http://{Bridge.for_slot(node_cluster.ports.slot).gateway}:{free_port()}"
    ctl = ControllerProcess(
        node_controller_kubeconfig,
        [
            f"--namespace={node_namespace}",
            f"--agent-image={AGENT_IMAGE}",
            f"--arrival-url={unreachable}",
        ],
        tmp_path / "controller.log",
    )
    ctl.start()
    try:
        job = builders.gangjob(
            "no-endpoint",
            2,
            image="localhost/busybox:dev",
            command=["sh", "-c", "sleep 3600"],
            container={"imagePullPolicy": "Never"},
        )
        await node_kube.create(GANGJOBS, job, node_namespace)

        def degraded(job: JsonDict) -> bool:
            status = job.get("status") or {}
            return status.get("barrierEpoch") == 0 and any(
                c["type"] == "ArrivalDegraded" and c["status"] == "True"
                for c in status.get("conditions") or []
            )

        found = await watch_job(
            node_kube, node_namespace, "no-endpoint", degraded, 120,
            "barrier open, ArrivalDegraded",
        )  # fmt: skip
    finally:
        ctl.stop()
        print(ctl.logs()[-5000:])
    cond = next(c for c in found["status"]["conditions"] if c["type"] == "ArrivalDegraded")
    assert cond["reason"] == "ArrivalEndpointUnreachable"
    assert cond["message"].startswith("2 of 2 workers arrived at epoch 0 by pod annotation")
    assert unreachable in cond["message"]
