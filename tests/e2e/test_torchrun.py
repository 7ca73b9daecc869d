"""The torchrun sample on the real node: `torchrun train.py` on 2 pods x 2 processes survives a
killed local worker process (torchrun's child, not torchrun, not the pod). torchrun exits
non-zero, the gang restarts in place at epoch 1, nothing of the old torchrun survives, and the
same pods resume from the checkpoint with a world of 4 and the job succeeds. And the ordering of
a job's end: one pod's torchrun succeeded, then the other's trainer fails: both restart in place.

The job is manifests/samples/pytorch-torchrun.yaml itself (shortened), its program from the
ConfigMap the sample names, in the trainer image `localcluster` builds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from controller.k8s import CONFIGMAPS, GANGJOBS, PODS, JsonDict, Kube
from localcluster.chaos import cmdline, container_pid, descendants
from localcluster.cluster import Cluster
from localcluster.tools import REPO, ControllerProcess, kubectl
from tests.e2e.test_pytorch import collect_logs, wait_for_checkpoint
from tests.integration.harness import gang_pods, watch_finished, watch_job
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "manifests" / "samples" / "pytorch-torchrun.yaml"
PROGRAM = REPO / "manifests" / "samples" / "torchrun" / "train.py"
STEPS = 30
EVERY = 5
KILL_AFTER_STEP = 10
TORCHRUN = "bin/torchrun"
"""In torchrun's command line (`/usr/bin/python3 /usr/local/bin/torchrun train.py`), not in its
workers' (`/usr/bin/python3 -u train.py`)."""


def sample_job(name: str, mode: str, checkpoints: Path, image: str) -> JsonDict:
    job: JsonDict = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["restart"]["mode"] = mode
    pod = job["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["image"] == image
    settings = {"TRAIN_STEPS": STEPS, "CHECKPOINT_EVERY": EVERY, "STEP_SECONDS": 0.2}
    trainer["env"] = [{"name": k, "value": str(v)} for k, v in settings.items()]
    (checkpoint_volume,) = [v for v in pod["volumes"] if v["name"] == "checkpoints"]
    checkpoint_volume["hostPath"] = {"path": str(checkpoints), "type": "Directory"}
    return job


def process_tree(cluster: Cluster, pod: JsonDict) -> dict[str, dict[int, str]]:
    """The trainer container's torchrun and its local workers, by host PID with command line
    (in Process mode the container's first process is the agent, whose command names both)."""
    procs = {p: cmdline(p) for p in descendants(container_pid(cluster, pod, "trainer"))}
    procs = {p: c for p, c in procs.items() if c and "agent.pyz" not in c}
    torchrun = {p: c for p, c in procs.items() if TORCHRUN in c}
    workers = {p: c for p, c in procs.items() if "train.py" in c and TORCHRUN not in c}
    return {"torchrun": torchrun, "workers": workers}


def alive(pid: int, command: str) -> bool:
    """The same process (a reused PID runs another command line)."""
    return cmdline(pid) == command


async def running_pods(kube: Kube, ns: str, name: str) -> list[JsonDict]:
    pods = sorted(await gang_pods(kube, ns, name), key=lambda p: p["metadata"]["name"])
    return [
        await wait_for(
            kube,
            PODS,
            p["metadata"]["name"],
            ns,
            lambda p: any(
                s["name"] == "trainer" and "running" in s.get("state", {})
                for s in p.get("status", {}).get("containerStatuses", [])
            ),
            timeout=120,
            what="trainer running",
        )
        for p in pods
    ]


async def trees_with_workers(
    cluster: Cluster, kube: Kube, ns: str, name: str, nproc: int
) -> list[dict[str, dict[int, str]]]:
    """Each pod's torchrun tree once torchrun has started its `nproc` workers (polled: they are
    processes on this host, with nothing to watch)."""
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        pods = await running_pods(kube, ns, name)
        with contextlib.suppress(RuntimeError):
            trees = [process_tree(cluster, p) for p in pods]
            if all(len(t["torchrun"]) == 1 and len(t["workers"]) == nproc for t in trees):
                return trees
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no torchrun with {nproc} workers in every pod of {name}")
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("mode", ["Pod", "Process"])
async def test_torchrun_sample_survives_a_killed_local_worker(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
    mode: str,
) -> None:
    ns, name = node_namespace, "torchrun"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "torchrun-sample-train"},
        "data": {"train.py": PROGRAM.read_text()},
    }
    await node_kube.create(CONFIGMAPS, configmap, ns)
    await node_kube.create(GANGJOBS, sample_job(name, mode, checkpoints, trainer_image), ns)
    before = await wait_for_checkpoint(checkpoints / name, KILL_AFTER_STEP, timeout=240)
    assert before["epoch"] == 0
    assert before["world"] == 4
    uids = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }

    old = await trees_with_workers(node_cluster, node_kube, ns, name, nproc=2)
    # One local worker of rank 1's pod, torchrun's child: not torchrun, not the pod.
    victim, victim_cmd = next(iter(old[1]["workers"].items()))
    os.kill(victim, signal.SIGKILL)

    logs: dict[str, str] = {}
    collector = asyncio.create_task(collect_logs(node_cluster, ns, f"{name}-1", logs))
    try:
        await watch_job(
            node_kube, ns, name, lambda j: (j.get("status") or {}).get("barrierEpoch") == 1,
            timeout=180, what="barrier 1 open",
        )  # fmt: skip
        new = await trees_with_workers(node_cluster, node_kube, ns, name, nproc=2)
        # Nothing of the old torchrun survives: neither it nor any of its workers, in any pod.
        for tree in old:
            for pid, cmd in {**tree["torchrun"], **tree["workers"]}.items():
                assert not alive(pid, cmd), (pid, cmd)
        for before_tree, after_tree in zip(old, new, strict=True):
            assert set(after_tree["torchrun"]).isdisjoint(before_tree["torchrun"])
        job = await watch_finished(node_kube, ns, name, 240)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
    assert not alive(victim, victim_cmd)
    st = job["status"]
    assert st["phase"] == "Succeeded", st
    assert st["epoch"] == 1
    assert st["restarts"] == {"total": 1, "counted": 1, "inPlace": 1, "recreatedWorkers": 0}
    # torchrun exited non-zero when its worker died: a process exit of the trainer.
    assert st["lastRestart"]["trigger"]["class"] == "ProcessExit", st["lastRestart"]
    assert st["lastRestart"]["recreated"] == []
    # Same pods, resumed from a checkpoint at epoch 1 with a world of 4, to the last step.
    after = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }
    assert all(after.get(n, u) == u for n, u in uids.items()), (uids, after)
    final = json.loads((checkpoints / name / "latest.json").read_text())
    assert final["step"] == STEPS
    assert (final["epoch"], final["world"]) == (1, 4)
    assert final["resumed_from"] >= before["step"] > 0
    log = logs.get(f"{name}-1", "")
    # Pod 1 is torchrun node 1: global ranks 2 and 3, in the epoch's rendezvous.
    for rank, local in ((2, 0), (3, 1)):
        assert (
            f"epoch=1 rank={rank} world=4 node_rank=1 local_rank={local} run_id={name}-epoch-1 "
        ) in log, log
        assert f"epoch=1 rank={rank} resumed from checkpoint step={final['resumed_from']}" in log


# Pod 1 (torchrun node 1) holds after torchrun's success at epoch 0, then fails: its trainer exits
# 1 when the test kills the `sleep`. By then pod 0's torchrun has exited 0.
HOLD_SECONDS = 3601
AFTER_SUCCESS = (
    # `torchrun`, the image's console script, as a user writes it.
    "torchrun /opt/torchrun-sample/train.py || exit $?; "
    f'if [ "$GANGJOB_EPOCH" = 0 ] && [ "$PET_NODE_RANK" = 1 ]; then '
    f"sleep {HOLD_SECONDS}; exit 1; fi"
)


async def holding_sleep(cluster: Cluster, kube: Kube, ns: str, pod_name: str) -> int:
    """The pid of the `sleep` pod 1's trainer holds in after torchrun's success (polled: a
    process on this host, with nothing to watch; torchrun takes a moment to exit)."""
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        pod = await kube.get(PODS, pod_name, ns)
        with contextlib.suppress(RuntimeError):
            for pid in descendants(container_pid(cluster, pod, "trainer")):
                if cmdline(pid).split() == ["sleep", str(HOLD_SECONDS)]:
                    return pid
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no `sleep {HOLD_SECONDS}` in {pod_name}'s trainer")
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("mode", ["Pod", "Process"])
async def test_a_torchrun_node_that_succeeded_restarts_in_place_when_another_fails(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    trainer_image: str,
    tmp_path: Path,
    mode: str,
) -> None:
    """The ordering of a job's end: pod 0's torchrun exited 0 (training done), then pod 1's
    trainer fails. Pod 0 is one of the gang until the job has succeeded: restarted in place
    at epoch 1 with pod 1, it resumes from the last checkpoint, and the job succeeds."""
    ns, name = node_namespace, "torchrun-end"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "torchrun-sample-train"},
        "data": {"train.py": PROGRAM.read_text()},
    }
    await node_kube.create(CONFIGMAPS, configmap, ns)
    job = sample_job(name, mode, checkpoints, trainer_image)
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["command"] = ["sh", "-c", AFTER_SUCCESS]
    trainer["env"] = [e for e in trainer["env"] if e["name"] != "TRAIN_STEPS"]
    trainer["env"].append({"name": "TRAIN_STEPS", "value": str(EVERY * 2)})
    await node_kube.create(GANGJOBS, job, ns)

    # Pod 0's trainer succeeded (the controller counts it), pod 1's still runs.
    await watch_job(
        node_kube, ns, name,
        lambda j: [r.get("succeeded") for r in (j.get("status") or {}).get("roles") or []]
        == [1],
        timeout=300, what="pod 0 succeeded",
    )  # fmt: skip
    uids = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }
    assert len(uids) == 2
    holding = await holding_sleep(node_cluster, node_kube, ns, f"{name}-1")
    os.kill(holding, signal.SIGKILL)

    done = await watch_finished(node_kube, ns, name, 300)
    st = done["status"]
    assert st["phase"] == "Succeeded", st
    assert st["epoch"] == 1
    assert st["restarts"] == {"total": 1, "counted": 1, "inPlace": 1, "recreatedWorkers": 0}
    assert st["lastRestart"]["trigger"]["worker"] == 1, st["lastRestart"]
    assert st["lastRestart"]["recreated"] == []
    after = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(node_kube, ns, name)
    }
    assert after == uids
    # Both nodes ran at epoch 1: resumed from the last checkpoint, the world whole.
    final = json.loads((checkpoints / name / "latest.json").read_text())
    assert final["step"] == EVERY * 2
    log = kubectl(node_cluster, "-n", ns, "logs", f"{name}-0", "-c", "trainer")
    assert f"epoch=1 rank=0 world=4 node_rank=0 local_rank=0 run_id={name}-epoch-1 " in log, log
