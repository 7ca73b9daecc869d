"""The sample PyTorch DDP job, made elastic, on the real node: shrunk from 3 workers to 2 and
grown back to 3 by `replicas`, each in place at a new epoch, it resumes each time from its
checkpoint at the new world size (its data sharded anew) and ends Succeeded; the kept pods keep
their UIDs (docs/api.md "Elastic gangs")."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.tools import ControllerProcess
from tests.e2e.test_pytorch import collect_logs, sample_job, wait_for_checkpoint
from tests.integration.harness import gang_pods, watch_finished, watch_job

pytestmark = pytest.mark.e2e

STEPS = 45


def elastic_job(name: str, checkpoints: Path, image: str) -> JsonDict:
    job = sample_job(name, "Process", checkpoints, image)
    job["spec"]["replicas"] = 3
    job["spec"]["elastic"] = {"minReplicas": 2, "maxReplicas": 3}
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    for env in trainer["env"]:
        if env["name"] == "TRAIN_STEPS":
            env["value"] = str(STEPS)
    return job


async def resized(kube: Kube, ns: str, name: str, size: int, epoch: int) -> JsonDict:
    """Patches `replicas` and waits for the barrier of the resize's epoch."""
    await kube.patch(GANGJOBS, name, {"spec": {"replicas": size}}, ns)
    job: JsonDict = await watch_job(
        kube, ns, name,
        lambda j: (j.get("status") or {}).get("barrierEpoch") == epoch,
        timeout=120, what=f"resized to {size} at epoch {epoch}",
    )  # fmt: skip
    return job


async def test_the_ddp_sample_survives_a_shrink_and_a_grow_in_place(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
    record_property: Any,
) -> None:
    ns, name = node_namespace, "eddp"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    await node_kube.create(GANGJOBS, elastic_job(name, checkpoints, trainer_image), ns)
    first = await wait_for_checkpoint(checkpoints / name, 10, timeout=180)
    assert (first["epoch"], first["world_size"]) == (0, 3)
    uids = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }
    assert sorted(uids) == [f"{name}-0", f"{name}-1", f"{name}-2"]
    logs: dict[str, str] = {}
    collector = asyncio.create_task(collect_logs(node_cluster, ns, f"{name}-1", logs))
    try:
        shrunk = await resized(node_kube, ns, name, 2, epoch=1)
        assert shrunk["status"]["worldSize"] == 2
        narrow = await wait_for_checkpoint(checkpoints / name, first["step"] + 10, timeout=120)
        assert (narrow["epoch"], narrow["world_size"]) == (1, 2)
        assert narrow["resumed_from"] >= first["step"]
        grown = await resized(node_kube, ns, name, 3, epoch=2)
        assert grown["status"]["worldSize"] == 3
        # Process-mode pods go once the job succeeds: their UIDs are read now.
        kept = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in await gang_pods(node_kube, ns, name)
        }
        job = await watch_finished(node_kube, ns, name, 180)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
    st = job["status"]
    assert st["phase"] == "Succeeded", st
    assert st["epoch"] == 2
    final = json.loads((checkpoints / name / "latest.json").read_text())
    assert (final["step"], final["epoch"], final["world_size"]) == (STEPS, 2, 3)
    assert final["resumed_from"] >= narrow["step"]
    # The resizes are the restarts: in place, neither counted against maxRestarts.
    assert [r["trigger"]["class"] for r in st["history"]] == ["Resized", "Resized"]
    assert (st["restarts"]["total"], st["restarts"].get("counted", 0)) == (2, 0)
    # Worker 1 was kept through both: one trainer per epoch, each in the world of its epoch.
    log = logs.get(f"{name}-1", "")
    for epoch, world in ((1, 2), (2, 3)):
        assert f"epoch={epoch} rank=1 rendezvous at" in log, log
        assert f"as 1/{world}," in log, log
    assert "world size 2)" in log, log  # epoch 2 resumed from a checkpoint of the 2-wide world
    # Workers 0 and 1 were kept in place through both resizes; worker 2 was made again.
    assert kept[f"{name}-0"] == uids[f"{name}-0"]
    assert kept[f"{name}-1"] == uids[f"{name}-1"]
    assert kept[f"{name}-2"] != uids[f"{name}-2"]
    record_property("epochs", st["epoch"])
