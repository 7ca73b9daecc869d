"""The two-role sample (manifests/samples/pytorch-ddp-roles.yaml) on the real node: the
initializer completes before the DDP workers start, a killed worker's process restarts the
running role in place at epoch 1, the initializer is not run again, and the job succeeds.

The job is the sample itself (shortened: few steps, its own checkpoint directory), in the trainer
image `localcluster` builds (built and imported on first use)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from api.v1alpha1 import RoleState, parse_gangjob
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.chaos import kill_trainer
from localcluster.cluster import Cluster
from localcluster.tools import REPO, ControllerProcess
from tests.e2e.test_pytorch import wait_for_checkpoint
from tests.integration.harness import gang_pods, watch_finished

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "manifests" / "samples" / "pytorch-ddp-roles.yaml"
STEPS = 30
EVERY = 5
KILL_AFTER_STEP = 10


def sample_job(checkpoints: Path, image: str) -> JsonDict:
    job: JsonDict = yaml.safe_load(SAMPLE.read_text())
    for role in job["spec"]["roles"]:
        pod = role["template"]["spec"]
        assert pod["containers"][0]["image"] == image
        pod["volumes"] = [
            {"name": "checkpoints", "hostPath": {"path": str(checkpoints), "type": "Directory"}}
        ]
        if role["name"] == "worker":
            settings = {"TRAIN_STEPS": STEPS, "CHECKPOINT_EVERY": EVERY, "STEP_SECONDS": 0.2}
            pod["containers"][0]["env"] = [
                {"name": k, "value": str(v)} for k, v in settings.items()
            ]
    return job


def test_the_sample_is_a_valid_two_role_job() -> None:
    job = parse_gangjob(yaml.safe_load(SAMPLE.read_text()))
    assert [(r.name, r.replicas, r.ranked) for r in job.spec.effective_roles] == [
        ("init", 1, False),
        ("worker", 2, True),
    ]
    assert job.spec.world_size == 2


async def test_two_role_sample_survives_a_killed_worker_and_succeeds(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
) -> None:
    ns = node_namespace
    name = "ddp-roles"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    await node_kube.create(GANGJOBS, sample_job(checkpoints, trainer_image), ns)
    before = await wait_for_checkpoint(checkpoints / name, KILL_AFTER_STEP, timeout=240)
    assert before["epoch"] == 0
    # The initializer ran first, and once.
    assert (checkpoints / name / "prepared").read_text() == "init\n"
    pods = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, name)}
    assert set(pods) == {f"{name}-init-0", f"{name}-worker-0", f"{name}-worker-1"}
    assert pods[f"{name}-init-0"]["status"]["phase"] == "Succeeded"
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}

    await asyncio.to_thread(kill_trainer, node_cluster, pods[f"{name}-worker-1"])
    job = await watch_finished(node_kube, ns, name, 240)
    st = job["status"]
    assert st["phase"] == "Succeeded", st
    assert st["epoch"] == 1
    assert st["restarts"] == {"total": 1, "counted": 1, "inPlace": 1, "recreatedWorkers": 0}
    assert st["lastRestart"]["recreated"] == []
    roles = {r["name"]: r for r in st["roles"]}
    assert roles["init"]["state"] == RoleState.COMPLETE
    assert roles["worker"]["succeeded"] == 2 or roles["worker"]["state"] == RoleState.COMPLETE
    final = json.loads((checkpoints / name / "latest.json").read_text())
    assert final["step"] == STEPS
    assert final["epoch"] == 1
    assert final["resumed_from"] >= before["step"] > 0
    # In place: the same pods; the initializer's pod is the one that ran at the start.
    after = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, name)}
    assert {n: p["metadata"]["uid"] for n, p in after.items()} == uids
    init_status = after[f"{name}-init-0"]["status"]
    assert [c["restartCount"] for c in init_status["containerStatuses"]] == [0]
