"""The sample PyTorch DDP job, made elastic, on the real node: a fixed role `leader` (rank 0,
`MASTER_ADDR`) and an elastic role `worker` (`spec.roles[].elastic`), shrunk from 3 workers to 2
and grown back to 3 by the role's `replicas`, each in place at a new epoch; it resumes each time
from its checkpoint at the new world size (its data sharded anew, the leader's trainer told the
new `WORLD_SIZE` too) and ends Succeeded; the kept pods keep their UIDs (docs/api.md "Elastic
gangs"). A job of one role resizes by the same steps (tests/integration/test_elastic.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from api.builders import leader_and_elastic
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.tools import ControllerProcess
from tests.e2e.test_pytorch import collect_logs, sample_job, wait_for_checkpoint
from tests.integration.harness import gang_pods, watch_finished, watch_job

pytestmark = pytest.mark.e2e

STEPS = 45


def elastic_job(name: str, checkpoints: Path, image: str) -> JsonDict:
    job = sample_job(name, "Process", checkpoints, image)
    for env in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        if env["name"] == "TRAIN_STEPS":
            env["value"] = str(STEPS)
    return leader_and_elastic(job, 2, {"minReplicas": 1, "maxReplicas": 2})


async def resized(kube: Kube, ns: str, name: str, size: int, epoch: int) -> JsonDict:
    """Sets the elastic role's `replicas` and waits for the barrier of the resize's epoch."""
    current = await kube.get(GANGJOBS, name, ns)
    roles = current["spec"]["roles"]
    roles[-1]["replicas"] = size
    await kube.patch(GANGJOBS, name, {"spec": {"roles": roles}}, ns)
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
    leader, kept_worker, surplus = f"{name}-leader-0", f"{name}-worker-0", f"{name}-worker-1"
    assert sorted(uids) == [leader, kept_worker, surplus]
    logs: dict[str, str] = {}
    collectors = [
        asyncio.create_task(collect_logs(node_cluster, ns, pod, logs))
        for pod in (leader, kept_worker)
    ]
    try:
        shrunk = await resized(node_kube, ns, name, 1, epoch=1)
        assert shrunk["status"]["worldSize"] == 2
        narrow = await wait_for_checkpoint(checkpoints / name, first["step"] + 10, timeout=120)
        assert (narrow["epoch"], narrow["world_size"]) == (1, 2)
        assert narrow["resumed_from"] >= first["step"]
        grown = await resized(node_kube, ns, name, 2, epoch=2)
        assert grown["status"]["worldSize"] == 3
        # Process-mode pods go once the job succeeds: their UIDs are read now.
        kept = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in await gang_pods(node_kube, ns, name)
        }
        job = await watch_finished(node_kube, ns, name, 180)
    finally:
        for collector in collectors:
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
    # The leader (rank 0) and the elastic role's worker 0 (rank 1) were kept through both: one
    # trainer per epoch, each in the world of its epoch.
    for pod, rank in ((leader, 0), (kept_worker, 1)):
        log = logs.get(pod, "")
        for epoch, world in ((1, 2), (2, 3)):
            assert f"epoch={epoch} rank={rank} rendezvous at" in log, (pod, log)
            assert f"as {rank}/{world}," in log, (pod, log)
        # Epoch 2 resumed from a checkpoint of the 2-wide world.
        assert "world size 2)" in log, (pod, log)
    # Both kept in place through both resizes; the role's worker 1 was made again.
    assert kept[leader] == uids[leader]
    assert kept[kept_worker] == uids[kept_worker]
    assert kept[surplus] != uids[surplus]
    record_property("epochs", st["epoch"])
