"""The torchrun contract on a real apiserver: the controller gives every worker of a multi-GPU
gang what torchrun reads, `nprocPerNode: auto` taken from the trainer's GPU limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.constants import LABEL_RANK
from controller.k8s import GANGJOBS, PODS, Invalid, Kube
from localcluster.cluster import Cluster
from tests.integration.harness import (
    ControllerProcess,
    controller_kubeconfig,
    gangjob,
    install_crd,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def controller(
    sim_kube: Kube, sim_cluster: Cluster, namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerProcess]:
    await install_crd(sim_kube)
    ctl = ControllerProcess(
        controller_kubeconfig(sim_cluster), [f"--namespace={namespace}"], tmp_path / "ctl.log"
    )
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-3000:])


async def test_nproc_auto_on_8_gpu_nodes_gives_a_world_of_32(
    sim_kube: Kube, namespace: str, controller: ControllerProcess, sim_cluster: Cluster
) -> None:
    gpus = {"nvidia.com/gpu": "8"}
    body = gangjob("llm", 4, nprocPerNode="auto")
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"limits": gpus, "requests": dict(gpus)}
    await sim_kube.create(GANGJOBS, body, namespace)

    nodes = set()
    world = 0
    for rank in range(4):
        # Each worker once created and scheduled (the status counts pods as its pass plans
        # them, ahead of the creates).
        pod = await wait_for(
            sim_kube, PODS, f"llm-{rank}", namespace,
            lambda p: bool(p["spec"].get("nodeName")), timeout=60, what="scheduled",
        )  # fmt: skip
        assert pod["metadata"]["labels"][LABEL_RANK] == str(rank)
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PET_NNODES"] == "4"
        assert env["PET_NODE_RANK"] == str(rank)
        assert env["PET_NPROC_PER_NODE"] == "8"
        assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == "llm-0.llm"
        assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29500"
        assert env["PET_MAX_RESTARTS"] == "0"
        # Plain WORLD_SIZE/RANK keep counting pods, for programs without torchrun.
        assert (env["WORLD_SIZE"], env["RANK"]) == ("4", str(rank))
        # The epoch's rendezvous id comes from the agent at each start, never from the pod.
        assert "PET_RDZV_ID" not in env
        assert container["command"][:4] == ["python3", "/gangjob/agent.pyz", "launch", "--"]
        world += int(env["PET_NPROC_PER_NODE"])
        nodes.add(pod["spec"]["nodeName"])
    assert world == 32
    # 8 GPUs a pod on nodes of 8: one worker per node, as a torchrun node is.
    assert len(nodes) == 4


async def test_the_apiserver_refuses_a_bad_nproc_per_node(
    sim_kube: Kube, namespace: str, sim_cluster: Cluster
) -> None:
    await install_crd(sim_kube)
    for bad in (0, "all", "8"):
        with pytest.raises(Invalid, match="nprocPerNode"):
            await sim_kube.create(GANGJOBS, gangjob(f"bad-{bad}", 2, nprocPerNode=bad), namespace)
