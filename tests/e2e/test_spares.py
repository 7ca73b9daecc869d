"""A spare on the real kubelet (docs/design.md section 3.12): workers and a spare; worker 1's
trainer exits with a code a `RecreateWorker` rule names (a device gone, as the trainer tells it:
the one loss that a test can cause on the only real node), and the spare, its pod started long
before, takes worker 1's rank at the next epoch (the others keep theirs); worker 1's new pod
starts its agent and no trainer, the next spare. In `Process` mode the spare runs the rank in
its own container; in `Pod` mode its sidecar passed its startup probe (its launcher holding, no
trainer started), so it idles past the probe's failureThreshold unharmed, and its pod restarts
in place with the kept worker's."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime

import pytest

from api import builders
from api.constants import AGENT_CONTAINER, BARRIER_PROBE_SLACK_SECONDS
from controller.k8s import CORE_EVENTS, GANGJOBS, PODS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import ControllerProcess, kubectl
from localcluster.versions import binary
from tests.integration.harness import gang_pods, watch_job
from tests.waiting import wait_for_pods

pytestmark = pytest.mark.e2e

LOST = 42
"""The exit code of a trainer whose device is gone: recreated, by the job's rule."""

# Every run says what it was given; a run whose "device" the test takes away (the file
# /tmp/lost) exits 42. A trainer leaves on SIGTERM at once, as the agent stops it so.
TRAINER = r"""
trap 'exit 0' TERM
echo "run: rank $RANK of $WORLD_SIZE at epoch $GANGJOB_EPOCH in $HOSTNAME"
while :; do [ -f /tmp/lost ] && exit 42; sleep 1; done
"""


BARRIER_TIMEOUT = 15
"""`Pod` mode: the sidecar's startup probe fails past `BARRIER_TIMEOUT` + 60 probes, 1 s apart."""


def spare_job(mode: str = "Process", replicas: int = 2) -> JsonDict:
    return builders.gangjob(
        "sp", replicas,
        image=AGENT_IMAGE, command=["sh", "-c", TRAINER],
        container={"imagePullPolicy": "Never"},
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode=mode,
        spec={
            "restart": {"barrierTimeoutSeconds": BARRIER_TIMEOUT},
            "elastic": {"minReplicas": 1, "maxReplicas": replicas, "spares": 1},
            "failurePolicy": {
                "rules": [
                    {
                        "action": "RecreateWorker",
                        "onExitCodes": {
                            "containerName": "trainer", "operator": "In", "values": [LOST],
                        },
                    }
                ]
            },
        },
    )  # fmt: skip


def runs(cluster: Cluster, ns: str, pod: str) -> list[str]:
    log = kubectl(cluster, "-n", ns, "logs", pod, "-c", "trainer")
    return [line for line in log.splitlines() if line.startswith("run: ")]


def said(cluster: Cluster, ns: str, pod: str, text: str, timeout: float = 60) -> None:
    """Returns once the trainer container of `pod` logged `text` (its log followed, with a
    deadline): a launcher that just started may not have written it yet."""
    argv = [str(binary("kubectl").path), f"--kubeconfig={cluster.kubeconfig}", "-n", ns]
    follow = [*argv, "logs", "-f", pod, "-c", "trainer"]
    with subprocess.Popen(follow, stdout=subprocess.PIPE, text=True) as proc:
        deadline = threading.Timer(timeout, proc.kill)
        deadline.start()
        try:
            assert proc.stdout is not None
            if any(text in line for line in proc.stdout):
                return
        finally:
            deadline.cancel()
            proc.kill()
    raise AssertionError(f"{pod}'s trainer container did not log {text!r} in {timeout}s")


def container(pod: JsonDict, name: str) -> JsonDict:
    status = pod.get("status") or {}
    every = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    return next((c for c in every if c["name"] == name), {})


def held(pod: JsonDict) -> bool:
    """`Pod` mode, a spare: its sidecar through its startup probe, its launcher running."""
    return bool(
        container(pod, AGENT_CONTAINER).get("started")
        and "running" in container(pod, "trainer").get("state", {})
    )


async def stays(
    kube: Kube, ns: str, name: str, ok: Callable[[JsonDict], str], until: float
) -> None:
    """Watches pod `name` until the wall clock reaches `until`: fails as soon as `ok` names
    something wrong with a version of it."""

    async def watch() -> None:
        pod = await kube.get(PODS, name, ns)
        assert not (wrong := ok(pod)), wrong
        stream = kube.watch(
            PODS, ns, field_selector=f"metadata.name={name}",
            resource_version=pod["metadata"]["resourceVersion"],
        )  # fmt: skip
        async with contextlib.aclosing(stream):
            async for ev in stream:
                assert ev.type != "DELETED", f"{name} deleted"
                if ev.type in ("ADDED", "MODIFIED"):  # not a bookmark, which is no pod
                    assert not (wrong := ok(ev.object)), wrong

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(watch(), max(0.0, until - time.time()))


async def lose_worker_1(kube: Kube, cluster: Cluster, ns: str, spare: int) -> JsonDict:
    """Takes worker 1's "device" away (its trainer exits `LOST`); returns the job's status once
    spare `spare` is in its place at epoch 1 and the barrier opened."""
    kubectl(cluster, "-n", ns, "exec", "sp-1", "-c", "trainer", "--", "touch", "/tmp/lost")

    def swapped(j: JsonDict) -> bool:
        st = j.get("status", {})
        return bool(st.get("barrierEpoch") == 1 and st.get("dropped") == [1])

    job = await watch_job(kube, ns, "sp", swapped, 180, f"spare {spare} in worker 1's place")
    status: JsonDict = job["status"]
    return status


async def test_a_spare_takes_a_recreated_workers_rank_in_its_own_container(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
) -> None:
    # Three workers and spare 3: the spare takes worker 1's rank, and worker 2 keeps its own.
    ns = node_namespace
    await node_kube.create(GANGJOBS, spare_job(replicas=3), ns)

    def running(j: JsonDict) -> bool:
        # The workers past the barrier of epoch 0, the spare arrived there too.
        st = j.get("status", {})
        return bool(st.get("barrierEpoch") == 0 and st.get("workers", {}).get("arrived") == 4)

    job = await watch_job(node_kube, ns, "sp", running, 180, "running with its spare")
    assert (job["status"]["worldSize"], job["status"]["dropped"]) == (3, [3])
    before = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, "sp")}
    st = await lose_worker_1(node_kube, node_cluster, ns, spare=3)
    assert st["worldSize"] == 3
    assert st["places"] == [{"worker": 3, "place": 1}]
    last = st["lastRestart"]
    assert last["trigger"]["action"] == "RecreateWorker"
    assert last["trigger"]["worker"] == 1
    assert last["trigger"]["detail"].endswith("; spare 3 takes worker 1's place")
    assert last["recreated"] == [1]
    assert st["restarts"]["total"] == 1

    # Worker 1's new pod: its agent up and arrived, no trainer run; the next spare.
    def new_spare(j: JsonDict) -> bool:
        return bool((j.get("status") or {}).get("workers", {}).get("arrived") == 4)

    await watch_job(node_kube, ns, "sp", new_spare, 120, "the new spare arrived")
    pods = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, "sp")}
    assert set(pods) == {"sp-0", "sp-1", "sp-2", "sp-3"}
    assert pods["sp-1"]["metadata"]["uid"] != before["sp-1"]["metadata"]["uid"]
    # The spare and workers 0 and 2 are the pods they were: in place, in their containers.
    for name in ("sp-0", "sp-2", "sp-3"):
        assert pods[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
        statuses = pods[name]["status"]["containerStatuses"]
        trainer = next(c for c in statuses if c["name"] == "trainer")
        assert trainer["restartCount"] == 0, name
    # Every kept worker keeps its rank; the spare ran nothing at epoch 0 and worker 1's rank
    # at epoch 1.
    for name, rank in (("sp-0", 0), ("sp-2", 2)):
        assert runs(node_cluster, ns, name) == [
            f"run: rank {rank} of 3 at epoch 0 in {name}",
            f"run: rank {rank} of 3 at epoch 1 in {name}",
        ]
    assert runs(node_cluster, ns, "sp-3") == ["run: rank 1 of 3 at epoch 1 in sp-3"]
    assert runs(node_cluster, ns, "sp-1") == []
    log = kubectl(node_cluster, "-n", ns, "logs", "sp-1", "-c", "trainer")
    assert "is outside the world of epoch 1 (a spare)" in log
    events = (await node_kube.list(CORE_EVENTS, ns)).items
    assert [e["message"] for e in events if e["reason"] == "SpareTookOver"] == [
        "Spare 3 takes worker 1's place at epoch 1; worker 1's new pod will be a spare"
    ]


async def test_a_pod_mode_spare_idles_past_its_probe_and_takes_a_rank_in_place(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
) -> None:
    ns = node_namespace
    await node_kube.create(GANGJOBS, spare_job("Pod"), ns)

    # The spare's sidecar arrived, said in the world file that it is outside the world, and
    # opened its startup probe: the kubelet started the launcher, which holds.
    def spare_held(pods: list[JsonDict]) -> bool:
        return any(p["metadata"]["name"] == "sp-2" and held(p) for p in pods)

    pods = await wait_for_pods(node_kube, ns, spare_held, 180, "the spare's launcher held")
    job = await watch_job(node_kube, ns, "sp", lambda j: (j.get("status") or {}).get(
        "barrierEpoch") == 0, 60, "running")  # fmt: skip
    assert (job["status"]["worldSize"], job["status"]["dropped"]) == (2, [2])

    # It idles well past the probe's failureThreshold, its sidecar never restarted: a startup
    # probe that passed is not run again (a shut one would have been killed at the threshold).
    spare = next(p for p in pods if p["metadata"]["name"] == "sp-2")
    started = container(spare, AGENT_CONTAINER)["state"]["running"]["startedAt"]
    started_at = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    threshold = BARRIER_TIMEOUT + BARRIER_PROBE_SLACK_SECONDS

    def idle(pod: JsonDict) -> str:
        restarts = {c: container(pod, c).get("restartCount") for c in (AGENT_CONTAINER, "trainer")}
        return "" if set(restarts.values()) == {0} else f"sp-2 restarted: {restarts}"

    await stays(node_kube, ns, "sp-2", idle, started_at + threshold + 15)
    said(node_cluster, ns, "sp-2", "outside the world of epoch 0 (a spare): no trainer started")
    assert runs(node_cluster, ns, "sp-2") == []
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await gang_pods(
        node_kube, ns, "sp")}  # fmt: skip

    st = await lose_worker_1(node_kube, node_cluster, ns, spare=2)
    assert st["worldSize"] == 2
    assert st["lastRestart"]["trigger"]["worker"] == 1
    assert st["lastRestart"]["trigger"]["detail"].endswith("; spare 2 takes worker 1's place")
    assert st["lastRestart"]["recreated"] == [1]

    # Worker 1's new pod: its sidecar through its probe, its launcher holding: the next spare.
    def new_spare(pods: list[JsonDict]) -> bool:
        return any(
            p["metadata"]["name"] == "sp-1" and p["metadata"]["uid"] != before["sp-1"] and held(p)
            for p in pods
        )

    await wait_for_pods(node_kube, ns, new_spare, 120, "worker 1's new pod held as a spare")
    pods_now = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, "sp")}
    # Worker 0 and the spare restarted in place: the same pods, their containers restarted.
    for name in ("sp-0", "sp-2"):
        assert pods_now[name]["metadata"]["uid"] == before[name], name
        assert container(pods_now[name], "trainer")["restartCount"] >= 1, name
    await watch_job(node_kube, ns, "sp", lambda j: (j.get("status") or {}).get(
        "workers", {}).get("arrived") == 3, 60, "the new spare arrived")  # fmt: skip

    # The trainer of epoch 1 was told the new world: the spare runs worker 1's rank. Each
    # launcher starts its trainer once it reads the world file: a moment after the barrier.
    said(node_cluster, ns, "sp-0", "run: rank 0 of 2 at epoch 1 in sp-0")
    said(node_cluster, ns, "sp-2", "run: rank 1 of 2 at epoch 1 in sp-2")
    assert runs(node_cluster, ns, "sp-0") == ["run: rank 0 of 2 at epoch 1 in sp-0"]
    assert runs(node_cluster, ns, "sp-2") == ["run: rank 1 of 2 at epoch 1 in sp-2"]
    said(node_cluster, ns, "sp-1", "outside the world of epoch 1 (a spare): no trainer started")
    assert runs(node_cluster, ns, "sp-1") == []
