"""The `sim` profile is a working cluster: nodes Ready and declaring features, pods run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from controller.k8s import NODES, PODGROUPS, PODS, WORKLOADS, JsonDict, Kube
from localcluster.cluster import Cluster, Options
from tests.conftest import CLUSTER_PREFIX, SIM_OPTIONS
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def running(pod: JsonDict) -> bool:
    return bool(pod.get("status", {}).get("phase") == "Running")


async def test_pod_is_scheduled_to_a_kwok_node_and_runs(sim_kube: Kube, namespace: str) -> None:
    pod = {
        "metadata": {"name": "hello"},
        "spec": {"containers": [{"name": "c", "image": "localhost/busybox:dev"}]},
    }
    await sim_kube.create(PODS, pod, namespace)
    got = await wait_for(sim_kube, PODS, "hello", namespace, running, what="Running")
    assert got["spec"]["nodeName"].startswith("kwok-node-")
    assert got["status"]["containerStatuses"][0]["ready"] is True


async def test_kwok_nodes_are_ready_declare_restart_all_and_have_gpus(sim_kube: Kube) -> None:
    nodes = (await sim_kube.list(NODES)).items
    assert len(nodes) == SIM_OPTIONS.nodes
    for node in nodes:
        status = node["status"]
        ready = {c["type"]: c["status"] for c in status["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        assert "RestartAllContainersOnContainerExits" in status["declaredFeatures"]
        assert status["allocatable"]["nvidia.com/gpu"] == str(SIM_OPTIONS.gpus_per_node)


async def test_gang_scheduling_api_is_served(sim_kube: Kube) -> None:
    assert SIM_OPTIONS.gang_scheduling
    assert await sim_kube.served(WORKLOADS)
    assert await sim_kube.served(PODGROUPS)


def test_up_again_only_prints_the_kubeconfig(sim_cluster: Cluster) -> None:
    before = sim_cluster.procs()
    res = subprocess.run(
        [sys.executable, "-m", "localcluster.cli", "up", "--name", sim_cluster.name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"KUBECONFIG={sim_cluster.kubeconfig}"]
    assert sim_cluster.procs() == before  # nothing was started again (same PIDs, start times)


def test_up_then_down_leaves_no_process_behind() -> None:
    cluster = Cluster(f"{CLUSTER_PREFIX}-updown")
    assert not cluster.is_up()
    cluster.up(Options(profile="sim", nodes=1), sys.stderr)
    procs = cluster.procs()
    assert {p.name for p in procs} == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert all(p.alive() for p in procs)
    assert cluster.ready_nodes() == 1
    stopped = cluster.down(sys.stderr)
    assert sorted(stopped) == sorted(p.name for p in procs)
    assert not any(p.alive() for p in procs)
    assert not cluster.state_file.exists()
    assert cluster.procs() == []
