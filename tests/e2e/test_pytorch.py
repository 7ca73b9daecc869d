"""The sample PyTorch DDP job on the real node survives a killed training process: the gang
restarts in place at epoch 1, training resumes from its last checkpoint and completes.

The job is manifests/samples/pytorch-ddp.yaml itself (shortened: few steps, its own checkpoint
directory), in the trainer image `localcluster` builds (built and imported on first use)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.chaos import kill_trainer
from localcluster.cluster import Cluster
from localcluster.tools import REPO, ControllerProcess, kubectl
from tests.integration.harness import gang_pods, watch_finished, watch_job

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "manifests" / "samples" / "pytorch-ddp.yaml"
STEPS = 30
EVERY = 5
KILL_AFTER_STEP = 10  # a checkpoint at least this far exists when the trainer is killed
LOG_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) epoch=(\d+) rank=(\d+) (.*)$")


def sample_job(name: str, mode: str, checkpoints: Path, image: str) -> JsonDict:
    job: JsonDict = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["restart"]["mode"] = mode
    pod = job["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["image"] == image
    settings = {"TRAIN_STEPS": STEPS, "CHECKPOINT_EVERY": EVERY, "STEP_SECONDS": 0.2}
    trainer["env"] = [{"name": k, "value": str(v)} for k, v in settings.items()]
    pod["volumes"] = [
        {"name": "checkpoints", "hostPath": {"path": str(checkpoints), "type": "Directory"}}
    ]
    return job


async def wait_for_checkpoint(directory: Path, step: int, timeout: float) -> JsonDict:
    """Polls the summary the trainer writes (a file on this host: there is nothing to watch)."""
    deadline = time.monotonic() + timeout
    latest = directory / "latest.json"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            summary: JsonDict = json.loads(latest.read_text())
            if summary["step"] >= step:
                return summary
        await asyncio.sleep(0.1)
    raise AssertionError(f"no checkpoint of step {step} in {directory} after {timeout}s")


async def collect_logs(cluster: Cluster, ns: str, pod: str, into: dict[str, str]) -> None:
    """Keeps the latest log of a trainer: Process-mode pods are deleted once the job succeeds."""
    while True:
        with contextlib.suppress(RuntimeError):
            into[pod] = await asyncio.to_thread(
                kubectl, cluster, "-n", ns, "logs", pod, "-c", "trainer", timeout=10
            )
        await asyncio.sleep(0.5)


def first_step_after(log: str, epoch: int) -> datetime.datetime | None:
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if m and int(m.group(2)) == epoch and m.group(4).startswith("step="):
            t = datetime.datetime.strptime(m.group(1), "%H:%M:%S.%f").time()
            return datetime.datetime.combine(datetime.datetime.now(datetime.UTC).date(), t)
    return None


@pytest.mark.parametrize("mode", ["Pod", "Process"])
async def test_ddp_resumes_from_its_checkpoint_after_a_trainer_is_killed(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
    mode: str,
    record_property: Any,
) -> None:
    ns, name = node_namespace, "ddp"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    await node_kube.create(GANGJOBS, sample_job(name, mode, checkpoints, trainer_image), ns)
    before = await wait_for_checkpoint(checkpoints / name, KILL_AFTER_STEP, timeout=180)
    assert before["epoch"] == 0
    pods = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, name)}
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}

    killed_at = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    pid = await asyncio.to_thread(kill_trainer, node_cluster, pods[f"{name}-1"])
    logs: dict[str, str] = {}
    collector = asyncio.create_task(collect_logs(node_cluster, ns, f"{name}-1", logs))
    try:
        job = await watch_finished(node_kube, ns, name, 180)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
    st = job["status"]
    assert st["phase"] == "Succeeded", st
    # One gang restart, in place, triggered by rank 1's killed process.
    assert st["epoch"] == 1
    assert st["restarts"]["total"] == 1
    assert st["restarts"]["inPlace"] == 1
    last = st["lastRestart"]
    assert last["epoch"] == 1
    # Rank 1 was killed; its DDP peer then fails too, on the broken gloo connection, often
    # within the same second. Both are failures at epoch 0 and make one restart; when the
    # controller sees both in one pass, the lowest rank names the trigger.
    assert last["trigger"]["worker"] in (0, 1)
    assert last["recreated"] == []
    assert 0 < last["durationSeconds"] < 60
    # Training went on at epoch 1 from a checkpoint, not from step 0, to the last step.
    final = json.loads((checkpoints / name / "latest.json").read_text())
    assert final["step"] == STEPS
    assert final["epoch"] == 1
    assert final["resumed_from"] >= before["step"] > 0
    # Same pods: nothing was deleted or rescheduled.
    after = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }
    assert all(after.get(n, u) == u for n, u in uids.items()), (uids, after)
    log = logs.get(f"{name}-1", "")
    assert f"epoch=1 rank=1 resumed from checkpoint step={final['resumed_from']}" in log, log
    resumed = first_step_after(log, epoch=1)
    assert resumed is not None, log
    seconds = (resumed - killed_at).total_seconds()
    record_property("kill_to_training_resumed_seconds", round(seconds, 2))
    print(
        f"{mode} mode: killed pid {pid} at {killed_at:%H:%M:%S.%f}; first step at epoch 1 "
        f"{seconds:.2f}s later; restart durationSeconds {last['durationSeconds']}"
    )


async def test_a_stopped_rank_of_the_ddp_sample_is_the_hang_not_the_rank_waiting_for_it(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
) -> None:
    # Rank 1 is stopped (SIGSTOP, as a wedged device leaves a process): both ranks stop
    # stepping together, rank 0 waiting in the all-reduce; the sample shares its pod's process
    # namespace, so the agent tells the stopped trainer from the waiting one.
    ns, name = node_namespace, "ddp"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    job = sample_job(name, "Pod", checkpoints, trainer_image)
    hang_seconds = job["spec"]["progress"]["hangSeconds"]
    settings = {"TRAIN_STEPS": 1000, "CHECKPOINT_EVERY": EVERY, "STEP_SECONDS": 0.2}
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": k, "value": str(v)} for k, v in settings.items()
    ]
    await node_kube.create(GANGJOBS, job, ns)
    await wait_for_checkpoint(checkpoints / name, KILL_AFTER_STEP, timeout=180)
    pods = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, name)}
    await asyncio.to_thread(kill_trainer, node_cluster, pods[f"{name}-1"], sig=signal.SIGSTOP)
    job = await watch_job(
        node_kube, ns, name,
        lambda j: j.get("status", {}).get("barrierEpoch") == 1,
        timeout=hang_seconds + 90, what="restarted at epoch 1",
    )  # fmt: skip
    last = job["status"]["lastRestart"]
    assert last["trigger"]["class"] == "Hang", last
    assert last["trigger"]["worker"] == 1, last
    assert "its trainer is stopped" in last["trigger"]["detail"], last
    assert last["recreated"] == []
    assert last["lostSteps"] is not None, last
    assert last["lostSteps"] < EVERY + 2, last  # since the last checkpoint, at most
