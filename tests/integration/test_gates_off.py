"""With the container-restart-rule gates off, the apiserver silently drops `restartPolicyRules`
from new pods (docs/localcluster.md). The controller must notice and fall back, saying so."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.k8s import CORE_EVENTS, GANGJOBS, PODGROUPS, JsonDict, Kube
from localcluster.cluster import Cluster, Options
from localcluster.tools import ControllerProcess, controller_kubeconfig, install_crd, kubectl
from tests.conftest import CLUSTER_PREFIX
from tests.integration.harness import gang_pods, gangjob, watch_job

pytestmark = pytest.mark.integration

GATES_OFF = {"ContainerRestartRules": False, "RestartAllContainersOnContainerExits": False}


@pytest.fixture(scope="module")
def gates_off_cluster() -> Iterator[Cluster]:
    cluster = Cluster(f"{CLUSTER_PREFIX}-nogates")
    started = not cluster.is_up()
    cluster.up(Options(profile="sim", nodes=2, feature_gates=GATES_OFF), sys.stderr)
    try:
        yield cluster
    finally:
        if started:
            cluster.down(sys.stderr)


async def test_dropped_restart_rules_fall_back_to_process_mode(
    gates_off_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = gates_off_cluster
    install_crd(cluster)
    kubectl(cluster, "create", "namespace", "fallback")
    ctl = ControllerProcess(
        controller_kubeconfig(cluster), ["--namespace=fallback"], tmp_path / "ctl.log"
    )
    ctl.start()
    try:
        async with await Kube.from_kubeconfig(cluster.kubeconfig) as kube:
            body = gangjob("gated", 2)
            body["spec"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "infinity"]
            await kube.create(GANGJOBS, body, "fallback")

            def degraded(job: JsonDict) -> bool:
                conds = job.get("status", {}).get("conditions", [])
                return any(c["type"] == "ModeDegraded" and c["status"] == "True" for c in conds)

            job = await watch_job(kube, "fallback", "gated", degraded, 60, "ModeDegraded")
            cond = {c["type"]: c for c in job["status"]["conditions"]}["ModeDegraded"]
            assert cond["reason"] == "RestartRulesDropped"
            assert "dropped" in cond["message"]
            assert job["status"]["mode"] == "Process"

            def rebuilt(job: JsonDict) -> bool:
                return bool(job.get("status", {}).get("workers", {}).get("total") == 2)

            await watch_job(kube, "fallback", "gated", rebuilt, 60, "rebuilt")
            pods = [p for p in await gang_pods(kube, "fallback", "gated")
                    if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
            assert len(pods) == 2
            for pod in pods:
                assert pod["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Process"
                trainer = pod["spec"]["containers"][0]
                assert trainer["command"][:3] == ["python3", "/gangjob/agent.pyz", "wrap"]
                # Nor does this cluster serve the PodGroup API (no --gang-scheduling): the gang
                # runs as without it, which the condition and one Event say.
                assert "schedulingGroup" not in pod["spec"]
            assert not await kube.served(PODGROUPS)
            job = await kube.get(GANGJOBS, "gated", "fallback")
            cond = {c["type"]: c for c in job["status"]["conditions"]}["GangScheduling"]
            assert (cond["status"], cond["reason"]) == ("False", "PodGroupAPINotServed")
            events = (
                await kube.list(
                    CORE_EVENTS, "fallback", field_selector="reason=PodGroupAPINotServed"
                )
            ).items
            assert [e["involvedObject"]["name"] for e in events] == ["gated"]
    finally:
        ctl.stop()
        print(ctl.logs()[-3000:])
