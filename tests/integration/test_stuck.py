"""A stuck gang says why, on a real apiserver (controller/policy/stuck.py): the worker
ClusterRole deleted, a ResourceQuota refusing a worker pod, a barrier no agent arrives at, and
the agent's container unable to pull its image or crash-looping, each as the condition `Stuck`
with the cause and the fix, and a Warning Event. The controller runs as a subprocess with the
RBAC of manifests/rbac.

KWOK pods have no kubelet and no agent: nobody arrives at the barrier, and the agent
container's waiting states are patched into the pod's status as the kubelet writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from controller.k8s import CORE_EVENTS, GANGJOBS, PODS, JsonDict, Kube, ResourceKind
from localcluster.cluster import Cluster
from localcluster.tools import REPO
from tests.integration.harness import (
    ControllerProcess,
    controller_kubeconfig,
    gang_pods,
    gangjob,
    install_crd,
    kubectl,
    watch_job,
)

pytestmark = pytest.mark.integration

RESOURCE_QUOTAS = ResourceKind("", "v1", "resourcequotas", "ResourceQuota")
WORKER_ROLE = REPO / "manifests" / "rbac" / "worker_role.yaml"


@pytest.fixture(scope="module")
def ctl_kubeconfig(sim_cluster: Cluster) -> Path:
    return controller_kubeconfig(sim_cluster)  # applies manifests/rbac, the worker role too


@pytest.fixture
async def crd(sim_kube: Kube) -> None:
    await install_crd(sim_kube)


def start_controller(kubeconfig: Path, namespace: str, log: Path, *args: str) -> ControllerProcess:
    ctl = ControllerProcess(kubeconfig, [f"--namespace={namespace}", *args], log)
    ctl.start()
    ctl.wait_ready()
    return ctl


@pytest.fixture
async def controller(
    crd: None, ctl_kubeconfig: Path, namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerProcess]:
    """A controller that calls a barrier stalled after 3 s."""
    ctl = start_controller(
        ctl_kubeconfig, namespace, tmp_path / "controller.log", "--barrier-stall-seconds=3"
    )
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-3000:])


def stuck(reason: str | None) -> Callable[[JsonDict], bool]:
    """`Stuck` is True for `reason`; None: False."""

    def check(job: JsonDict) -> bool:
        for c in (job.get("status") or {}).get("conditions") or []:
            if c["type"] == "Stuck":
                if reason is None:
                    return bool(c["status"] == "False")
                return bool(c["status"] == "True" and c["reason"] == reason)
        return False

    return check


def stuck_message(job: JsonDict) -> str:
    return str(next(c["message"] for c in job["status"]["conditions"] if c["type"] == "Stuck"))


async def warning_event(kube: Kube, ns: str, job: str, reason: str) -> JsonDict:
    """The job's Warning Event of this reason, once there: Events follow the status write."""
    selector = f"involvedObject.name={job},reason={reason},type=Warning"

    async def first() -> JsonDict:
        listed = await kube.list(CORE_EVENTS, ns, field_selector=selector)
        if listed.items:
            return listed.items[0]
        stream = kube.watch(
            CORE_EVENTS, ns, field_selector=selector, resource_version=listed.resource_version
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type == "ADDED":
                    return ev.object
        raise AssertionError("watch ended")

    try:
        return await asyncio.wait_for(first(), 30)
    except TimeoutError:
        raise AssertionError(f"no Warning Event {reason} on {ns}/{job} within 30s") from None


async def test_worker_role_deleted_says_why_within_a_minute(
    sim_kube: Kube,
    sim_cluster: Cluster,
    crd: None,
    ctl_kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    kubectl(sim_cluster, "delete", "-f", str(WORKER_ROLE), "--ignore-not-found")
    log = tmp_path / "controller.log"
    # RBAC is reviewed again every 5 s here, not 30: the fix below is seen sooner.
    ctl = start_controller(ctl_kubeconfig, namespace, log, "--recheck-seconds=5")
    try:
        await sim_kube.create(GANGJOBS, gangjob("norbac", 2), namespace)
        job = await watch_job(
            sim_kube, namespace, "norbac", stuck("WorkerRBACMissing"), timeout=60,
            what="Stuck: WorkerRBACMissing",
        )  # fmt: skip
        message = stuck_message(job)
        assert f"ServiceAccount {namespace}/gangjob-worker, which may not get pods" in message
        assert "install the ClusterRole gangjob-worker (manifests/rbac/worker_role.yaml" in message
        event = await warning_event(sim_kube, namespace, "norbac", "WorkerRBACMissing")
        assert event["message"] == message
        # Said at start-up too, before any GangJob.
        assert "ClusterRole gangjob-worker not found" in ctl.logs()
        # Installed again: the gang is no longer stuck (checked again within 5 s).
        kubectl(sim_cluster, "apply", "-f", str(WORKER_ROLE))
        job = await watch_job(
            sim_kube, namespace, "norbac", stuck(None), timeout=90, what="Stuck False"
        )
    finally:
        kubectl(sim_cluster, "apply", "-f", str(WORKER_ROLE))
        ctl.stop()
        print(ctl.logs()[-3000:])


async def test_a_quota_refusing_a_worker_pod_is_said_until_it_is_lifted(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    quota = {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "1"}}}
    await sim_kube.create(RESOURCE_QUOTAS, quota, namespace)
    await sim_kube.create(GANGJOBS, gangjob("quota", 2), namespace)
    job = await watch_job(
        sim_kube, namespace, "quota", stuck("PodCreationRefused"), timeout=60,
        what="Stuck: PodCreationRefused",
    )  # fmt: skip
    message = stuck_message(job)
    assert 'worker pod(s) is refused: 403 Forbidden: pods "quota-' in message
    assert "exceeded quota: two-pods" in message
    assert "ResourceQuota" in message
    await warning_event(sim_kube, namespace, "quota", "PodCreationRefused")
    assert len(await gang_pods(sim_kube, namespace, "quota")) == 1
    # Lifted: the controller tries again on its own (no event tells it) and creates the pod.
    await sim_kube.delete(RESOURCE_QUOTAS, "two-pods", namespace)
    job = await watch_job(
        sim_kube, namespace, "quota",
        lambda j: (j.get("status") or {}).get("workers", {}).get("total") == 2
        and not stuck("PodCreationRefused")(j),
        timeout=60, what="both workers created",
    )  # fmt: skip


def agent_waiting(pod: JsonDict, reason: str, message: str, **last: object) -> JsonDict:
    """The agent sidecar's status as the kubelet writes it while it waits."""
    agent = next(c for c in pod["spec"]["initContainers"] if c["name"] == "gangjob-agent")
    status: JsonDict = {
        "name": agent["name"],
        "image": agent["image"],
        "imageID": "",
        "ready": False,
        "restartCount": 3 if last else 0,
        "started": False,
        "state": {"waiting": {"reason": reason, "message": message}},
    }
    if last:
        status["lastState"] = {"terminated": last}
    return {"status": {"initContainerStatuses": [status]}}


async def test_a_stalled_barrier_then_the_agents_image_then_its_crashes_are_said(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("stall", 2), namespace)
    job = await watch_job(
        sim_kube, namespace, "stall", stuck("BarrierStalled"), timeout=60,
        what="Stuck: BarrierStalled",
    )  # fmt: skip
    assert stuck_message(job).startswith(
        "2 of 2 workers have not arrived at epoch 0 for more than 3s: worker 0 (pod stall-0): "
    )
    await warning_event(sim_kube, namespace, "stall", "BarrierStalled")

    pod = await sim_kube.get(PODS, "stall-1", namespace)
    image = 'Back-off pulling image "localhost/gangjob-agent:missing"'
    await sim_kube.patch_status(
        PODS, "stall-1", agent_waiting(pod, "ImagePullBackOff", image), namespace
    )
    job = await watch_job(
        sim_kube, namespace, "stall", stuck("AgentImagePullFailed"), timeout=30,
        what="Stuck: AgentImagePullFailed",
    )  # fmt: skip
    message = stuck_message(job)
    assert "container gangjob-agent of worker 1 (pod stall-1): ImagePullBackOff: " in message
    assert image in message

    crash = agent_waiting(
        pod, "CrashLoopBackOff", "back-off 40s restarting failed container", exitCode=1
    )
    await sim_kube.patch_status(PODS, "stall-1", crash, namespace)
    job = await watch_job(
        sim_kube, namespace, "stall", stuck("AgentCrashLooping"), timeout=30,
        what="Stuck: AgentCrashLooping",
    )  # fmt: skip
    assert "kubectl logs stall-1 -c gangjob-agent --previous" in stuck_message(job)
    for reason in ("AgentImagePullFailed", "AgentCrashLooping"):
        await warning_event(sim_kube, namespace, "stall", reason)
