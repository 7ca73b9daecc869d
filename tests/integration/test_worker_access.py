"""What a worker's agent may do, on a real apiserver: the ServiceAccount and RoleBinding the
controller creates (with its own least-privilege RBAC), the ClusterRole of manifests/rbac, and
the ValidatingAdmissionPolicy of manifests/policy that narrows pod patches to the two protocol
annotations of the agent's own pod. Also: the apiserver accepts the worker pods of every mode.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from api.constants import ANNOTATION_CREATED_EPOCH as CREATED_EPOCH
from api.constants import ANNOTATION_EPOCH, ANNOTATION_EXIT, LABEL_NAME, WORKER_SERVICE_ACCOUNT
from api.v1alpha1 import GangJob, RestartMode, parse_gangjob
from controller.k8s import GANGJOBS, PODS, ApiError, Forbidden, Invalid, JsonDict, Kube
from controller.policy.podspec import build_pod
from controller.workeraccess import ROLE_BINDINGS, SERVICE_ACCOUNTS, WorkerAccess
from localcluster.cluster import Cluster
from localcluster.tools import token_kubeconfig
from tests.integration.harness import controller_kubeconfig, gangjob, install_crd, kubectl
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENT_IMAGE = "localhost/gangjob-agent:dev"
POLICY = "ValidatingAdmissionPolicy 'gangjob-worker-pods'"
JOB = "access"


def kubeconfig_with_token(cluster: Cluster, token: str, path: Path) -> Path:
    return token_kubeconfig(cluster, token, path, "worker")


@pytest.fixture(scope="module")
def worker_manifests(sim_cluster: Cluster) -> None:
    kubectl(sim_cluster, "apply", "-f", str(REPO / "manifests" / "rbac" / "worker_role.yaml"))
    kubectl(sim_cluster, "apply", "-k", str(REPO / "manifests" / "policy"))


@pytest.fixture
async def job(sim_kube: Kube, namespace: str, worker_manifests: None) -> GangJob:
    """A suspended GangJob: no controller that may run on the cluster acts on it."""
    await install_crd(sim_kube)
    body = gangjob(JOB, 2, suspend=True)
    return parse_gangjob(await sim_kube.create(GANGJOBS, body, namespace))


@pytest.fixture
async def access(sim_cluster: Cluster, namespace: str, job: GangJob) -> None:
    """The worker ServiceAccount and RoleBinding, created as the controller does: with the
    controller's own token, so a verb missing from manifests/rbac/role.yaml fails here."""
    ctl_config = controller_kubeconfig(sim_cluster)
    async with await Kube.from_kubeconfig(ctl_config, request_timeout=10) as ctl:
        await WorkerAccess().ensure(ctl, namespace)
        await WorkerAccess().ensure(ctl, namespace)  # a second controller process: no error


def worker_pod(job: GangJob, rank: int, name: str) -> JsonDict:
    """A worker pod as podspec builds it (Pod mode), renamed and not owned by the job, so that
    no controller takes it for one of its workers."""
    pod = build_pod(job, rank, AGENT_IMAGE)
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"][LABEL_NAME] = f"not-{JOB}"
    del pod["metadata"]["ownerReferences"]
    return pod


@pytest.fixture
async def pods(sim_kube: Kube, namespace: str, job: GangJob, access: None) -> list[JsonDict]:
    created = [
        await sim_kube.create(PODS, worker_pod(job, rank, name), namespace)
        for rank, name in enumerate(("worker-a", "worker-b"))
    ]
    for pod in created:
        assert pod["spec"]["serviceAccountName"] == WORKER_SERVICE_ACCOUNT
    return created


@pytest.fixture
async def agent_kube(
    sim_cluster: Cluster, namespace: str, pods: list[JsonDict], tmp_path: Path
) -> AsyncIterator[Kube]:
    """A client with a token bound to worker-a, as the kubelet projects into the pod."""
    pod_a = pods[0]
    token = kubectl(
        sim_cluster,
        "create",
        "token",
        WORKER_SERVICE_ACCOUNT,
        "-n",
        namespace,
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod_a['metadata']['name']}",
        f"--bound-object-uid={pod_a['metadata']['uid']}",
    ).strip()
    path = kubeconfig_with_token(sim_cluster, token, tmp_path / "agent.kubeconfig")
    async with await Kube.from_kubeconfig(path, request_timeout=10) as kube:
        yield kube


async def refused(
    kube: Kube, namespace: str, name: str, patch: JsonDict, error: type[ApiError] = Forbidden
) -> ApiError:
    with pytest.raises(error) as caught:
        await kube.patch(PODS, name, patch, namespace)
    return caught.value


async def policy_in_force(kube: Kube, namespace: str, timeout: float = 90.0) -> None:
    """A policy just created (or changed) takes a moment to reach the apiserver's admission:
    probe with a patch it refuses until it refuses it as this version says. A probe that gets
    through only sets a label. Usually a second or two; once, in a full CI run, more than 30 s."""
    deadline = time.monotonic() + timeout
    last = "(no answer)"
    while time.monotonic() < deadline:
        try:
            await kube.patch(PODS, "worker-a", {"metadata": {"labels": {"probe": "1"}}}, namespace)
            last = "the probe patch got through"
        except ApiError as error:
            if POLICY in error.message and "may not change a pod's labels" in error.message:
                return
            last = str(error)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{POLICY} not in force after {timeout}s: {last}")


def annotate(key: str, value: str | None) -> JsonDict:
    return {"metadata": {"annotations": {key: value}}}


async def test_the_agent_may_write_only_its_own_protocol_annotations(
    sim_kube: Kube, agent_kube: Kube, namespace: str
) -> None:
    await policy_in_force(agent_kube, namespace)

    # Allowed: its own pod's epoch and exit report.
    got = await agent_kube.patch(PODS, "worker-a", annotate(ANNOTATION_EPOCH, "1"), namespace)
    assert got["metadata"]["annotations"][ANNOTATION_EPOCH] == "1"
    got = await agent_kube.patch(PODS, "worker-a", annotate(ANNOTATION_EXIT, "1:3"), namespace)
    assert got["metadata"]["annotations"][ANNOTATION_EXIT] == "1:3"
    await agent_kube.patch(PODS, "worker-a", annotate(ANNOTATION_EPOCH, "2"), namespace)
    assert (await agent_kube.get(PODS, "worker-a", namespace))["metadata"]["name"] == "worker-a"

    # Refused, each with the policy's word for it.
    error = await refused(agent_kube, namespace, "worker-a", {"metadata": {"labels": {"x": "y"}}})
    assert "may not change a pod's labels" in error.message
    error = await refused(agent_kube, namespace, "worker-a", annotate("note", "changed"))
    assert "may change only the annotations gangjob.io/epoch and gangjob.io/exit" in error.message
    assert "not note" in error.message
    error = await refused(agent_kube, namespace, "worker-a", annotate(CREATED_EPOCH, "7"))
    assert f"not {CREATED_EPOCH}" in error.message
    error = await refused(agent_kube, namespace, "worker-a", annotate(CREATED_EPOCH, None))
    assert f"not {CREATED_EPOCH}" in error.message
    error = await refused(agent_kube, namespace, "worker-a", {"spec": {"activeDeadlineSeconds": 5}})
    assert "may not change a pod's spec" in error.message
    error = await refused(
        agent_kube,
        namespace,
        "worker-a",
        {"metadata": {"finalizers": ["example.com/keep"]}},
    )
    assert "ownerReferences or finalizers" in error.message
    error = await refused(
        agent_kube, namespace, "worker-a", annotate(ANNOTATION_EPOCH, "1"), Invalid
    )
    assert "never goes down" in error.message
    error = await refused(agent_kube, namespace, "worker-b", annotate(ANNOTATION_EPOCH, "1"))
    assert "only its own pod (worker-a), not worker-b" in error.message

    # Nothing of the refused patches reached the pods.
    a = await sim_kube.get(PODS, "worker-a", namespace)
    assert a["metadata"]["annotations"][ANNOTATION_EPOCH] == "2"
    assert "note" not in a["metadata"]["annotations"]
    assert a["metadata"]["annotations"][CREATED_EPOCH] == "0"
    assert "x" not in a["metadata"]["labels"]
    assert "activeDeadlineSeconds" not in a["spec"]
    b = await sim_kube.get(PODS, "worker-b", namespace)
    assert ANNOTATION_EPOCH not in b["metadata"].get("annotations", {})


async def test_the_agent_reads_its_gangjob_and_nothing_more(
    agent_kube: Kube, namespace: str
) -> None:
    got = await agent_kube.get(GANGJOBS, JOB, namespace)
    assert got["metadata"]["name"] == JOB
    listed = await agent_kube.list(GANGJOBS, namespace, field_selector=f"metadata.name={JOB}")
    assert [j["metadata"]["name"] for j in listed.items] == [JOB]
    # RBAC: no writes to the job, no pod deletion, nothing in another namespace.
    with pytest.raises(Forbidden):
        await agent_kube.patch(GANGJOBS, JOB, {"spec": {"suspend": False}}, namespace)
    with pytest.raises(Forbidden):
        await agent_kube.patch_status(GANGJOBS, JOB, {"status": {"epoch": 9}}, namespace)
    with pytest.raises(Forbidden):
        await agent_kube.delete(PODS, "worker-b", namespace)
    with pytest.raises(Forbidden):
        await agent_kube.list(GANGJOBS, "default")


async def test_a_token_bound_to_no_pod_patches_nothing(
    sim_cluster: Cluster, agent_kube: Kube, namespace: str, tmp_path: Path
) -> None:
    await policy_in_force(agent_kube, namespace)
    token = kubectl(sim_cluster, "create", "token", WORKER_SERVICE_ACCOUNT, "-n", namespace)
    path = kubeconfig_with_token(sim_cluster, token.strip(), tmp_path / "unbound.kubeconfig")
    async with await Kube.from_kubeconfig(path, request_timeout=10) as kube:
        error = await refused(kube, namespace, "worker-a", annotate(ANNOTATION_EPOCH, "5"))
    assert "this token is bound to no pod" in error.message


async def test_worker_access_objects(sim_kube: Kube, namespace: str, access: None) -> None:
    sa = await sim_kube.get(SERVICE_ACCOUNTS, WORKER_SERVICE_ACCOUNT, namespace)
    assert sa["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gangjob-controller"
    binding = await sim_kube.get(ROLE_BINDINGS, WORKER_SERVICE_ACCOUNT, namespace)
    assert binding["roleRef"]["name"] == "gangjob-worker"


@pytest.mark.parametrize("mode", list(RestartMode))
async def test_the_apiserver_accepts_worker_pods_of_every_mode(
    sim_cluster: Cluster, namespace: str, job: GangJob, access: None, mode: RestartMode
) -> None:
    """Server-side dry run: the apiserver validates the pod (restart rules, native sidecar,
    probes) and keeps every field podspec wrote, the rules included (the gates are on)."""
    spec: dict[str, Any] = {**job.spec.model_dump(by_alias=True), "restart": {"mode": mode}}
    shaped = job.model_copy(update={"spec": type(job.spec).model_validate(spec)})
    pod = worker_pod(shaped, 0, f"dry-{mode.lower()}")
    out = kubectl(
        sim_cluster,
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(pod),
    )
    created = json.loads(out)
    trainer = created["spec"]["containers"][0]
    ours = created["spec"]["initContainers"][-1]
    assert trainer["restartPolicy"] == "Never"
    assert trainer.get("restartPolicyRules") == pod["spec"]["containers"][0].get(
        "restartPolicyRules"
    )
    assert ours.get("restartPolicyRules") == pod["spec"]["initContainers"][-1].get(
        "restartPolicyRules"
    )
    if mode is RestartMode.POD:
        assert trainer["restartPolicyRules"][0]["action"] == "RestartAllContainers"
        assert ours["restartPolicy"] == "Always"


async def test_pods_are_scheduled_and_run(
    sim_kube: Kube, namespace: str, pods: list[JsonDict]
) -> None:
    """KWOK nodes declare RestartAllContainersOnContainerExits, so Pod-mode workers schedule."""
    for pod in pods:
        await wait_for(
            sim_kube,
            PODS,
            pod["metadata"]["name"],
            namespace,
            lambda p: p.get("status", {}).get("phase") == "Running",
            timeout=60,
            what="Running",
        )
