"""The controller core on a real apiserver: create, run, finish, suspend, TTL, crash recovery,
leader election. The controller runs as a subprocess with the RBAC of manifests/rbac."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.apiclient import ApiError, HttpClient
from api.constants import LABEL_NAME, LABEL_RANK
from controller.k8s import (
    GANGJOBS,
    LEASES,
    PODS,
    SERVICES,
    Invalid,
    JsonDict,
    Kube,
    NotFound,
)
from controller.manager import LEADER_LABEL
from localcluster.cluster import Cluster
from tests.integration.harness import (
    SYSTEM_NS,
    ControllerProcess,
    controller_kubeconfig,
    gang_pods,
    gangjob,
    install_crd,
    kubectl,
    phase_is,
    watch_job,
)
from tests.waiting import wait_for, wait_gone

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ctl_kubeconfig(sim_cluster: Cluster) -> Path:
    return controller_kubeconfig(sim_cluster)


@pytest.fixture
async def crd(sim_kube: Kube) -> None:
    await install_crd(sim_kube)


@pytest.fixture
def ctl_log(tmp_path: Path) -> Path:
    return tmp_path / "controller.log"


@pytest.fixture
async def controller(
    crd: None, ctl_kubeconfig: Path, namespace: str, ctl_log: Path
) -> AsyncIterator[ControllerProcess]:
    ctl = ControllerProcess(ctl_kubeconfig, [f"--namespace={namespace}"], ctl_log)
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-3000:])


def ready_workers(n: int) -> Any:
    def check(job: JsonDict) -> bool:
        st = job.get("status", {})
        return bool(st.get("phase") == "Running" and st.get("workers", {}).get("ready") == n)

    return check


async def finish_pod(kube: Kube, ns: str, pod: JsonDict, code: int = 0) -> None:
    """What the kubelet reports when a worker's container exits."""
    phase = "Succeeded" if code == 0 else "Failed"
    name = pod["metadata"]["name"]
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": "2026-01-01T00:00:00Z",
                    "finishedAt": "2026-01-01T00:00:01Z",
                }
            },
        }
        for c in pod["spec"]["containers"]
    ]
    await kube.patch_status(
        PODS, name, {"status": {"phase": phase, "containerStatuses": statuses}}, ns
    )


async def test_gang_of_4_runs_with_its_pods_and_headless_service(
    sim_kube: Kube, namespace: str, controller: ControllerProcess, sim_cluster: Cluster
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("ddp", 4, masterPort=23456), namespace)
    job = await watch_job(sim_kube, namespace, "ddp", ready_workers(4), what="Running, 4 ready")
    assert job["status"]["workers"]["total"] == 4
    assert job["status"]["epoch"] == 0
    pods = await gang_pods(sim_kube, namespace, "ddp")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"ddp-{r}" for r in range(4)]
    for pod in pods:
        rank = pod["metadata"]["labels"][LABEL_RANK]
        assert pod["metadata"]["name"] == f"ddp-{rank}"
        assert pod["metadata"]["labels"][LABEL_NAME] == "ddp"
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("GangJob", "ddp", True)
        assert owner["uid"] == job["metadata"]["uid"]
        assert pod["spec"]["hostname"] == f"ddp-{rank}"
        assert pod["spec"]["subdomain"] == "ddp"
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["RANK"] == rank
        assert env["WORLD_SIZE"] == "4"
        assert env["MASTER_PORT"] == "23456"
        assert env["MASTER_ADDR"].startswith("ddp-0.ddp")
        assert env["GANGJOB_NAME"] == "ddp"
    svc = await sim_kube.get(SERVICES, "ddp", namespace)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {LABEL_NAME: "ddp"}
    # The printer columns of the CRD, as `kubectl get gj` shows them.
    out = kubectl(sim_cluster, "-n", namespace, "get", "gj")
    header = ["NAME", "PHASE", "READY", "EPOCH", "WORLD", "RESTARTS", "AGE"]
    assert out.split("\n")[0].split() == header
    assert out.split("\n")[1].split()[:5] == ["ddp", "Running", "4", "0", "4"]
    assert controller.metric("controller_runtime_reconcile_total") > 0
    assert controller.metric("controller_runtime_max_concurrent_reconciles") >= 1


@pytest.mark.parametrize(("policy", "finish"), [("All", [0, 1, 2]), ("Rank0", [0])])
async def test_success_policy(
    sim_kube: Kube, namespace: str, controller: ControllerProcess, policy: str, finish: list[int]
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("done", 3, successPolicy=policy), namespace)
    await watch_job(sim_kube, namespace, "done", ready_workers(3), what="Running")
    pods = {p["metadata"]["name"]: p for p in await gang_pods(sim_kube, namespace, "done")}
    for rank in finish[:-1]:
        await finish_pod(sim_kube, namespace, pods[f"done-{rank}"])
    # Not done until the last worker the policy waits for has succeeded.
    job = await sim_kube.get(GANGJOBS, "done", namespace)
    assert job["status"].get("phase") != "Succeeded"
    await finish_pod(sim_kube, namespace, pods[f"done-{finish[-1]}"])
    job = await watch_job(sim_kube, namespace, "done", phase_is("Succeeded"), what="Succeeded")
    conds = {c["type"]: c for c in job["status"]["conditions"]}
    assert conds["Succeeded"]["status"] == "True"
    assert job["status"]["completionTime"]


async def test_invalid_manifests_are_refused_naming_the_field(
    sim_kube: Kube, namespace: str, crd: None
) -> None:
    cases: list[tuple[JsonDict, str]] = []
    zero = gangjob("zero", 0)
    cases.append((zero, "spec.replicas"))
    no_template = gangjob("notemplate", 2)
    del no_template["spec"]["template"]
    cases.append((no_template, "spec.template"))
    bad_mode = gangjob("badmode", 2, restart={"mode": "Teleport"})
    cases.append((bad_mode, "spec.restart.mode"))
    for body, field in cases:
        with pytest.raises(Invalid) as err:
            await sim_kube.create(GANGJOBS, body, namespace)
        assert field in str(err.value), err.value


async def test_suspend_removes_the_pods_and_resume_brings_them_back(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("sus", 3), namespace)
    await watch_job(sim_kube, namespace, "sus", ready_workers(3), what="Running")
    await sim_kube.patch(GANGJOBS, "sus", {"spec": {"suspend": True}}, namespace)
    job = await watch_job(sim_kube, namespace, "sus", phase_is("Suspended"), what="Suspended")
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Suspended"] == "True"
    for r in range(3):
        await wait_gone(sim_kube, PODS, f"sus-{r}", namespace)
    await sim_kube.patch(GANGJOBS, "sus", {"spec": {"suspend": False}}, namespace)
    job = await watch_job(sim_kube, namespace, "sus", ready_workers(3), what="Running again")
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Suspended"] == "False"
    assert len(await gang_pods(sim_kube, namespace, "sus")) == 3


async def test_deleting_the_gangjob_removes_its_pods(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("gone", 2), namespace)
    await watch_job(sim_kube, namespace, "gone", ready_workers(2), what="Running")
    await sim_kube.delete(GANGJOBS, "gone", namespace, propagation_policy="Foreground")
    for r in range(2):
        await wait_gone(sim_kube, PODS, f"gone-{r}", namespace, timeout=60)
    await wait_gone(sim_kube, GANGJOBS, "gone", namespace, timeout=60)


async def test_ttl_after_finished_deletes_the_job(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    await sim_kube.create(GANGJOBS, gangjob("ttl", 1, ttlSecondsAfterFinished=2), namespace)
    await watch_job(sim_kube, namespace, "ttl", ready_workers(1), what="Running")
    pod = (await gang_pods(sim_kube, namespace, "ttl"))[0]
    await finish_pod(sim_kube, namespace, pod)
    await watch_job(sim_kube, namespace, "ttl", phase_is("Succeeded"), what="Succeeded")
    await wait_gone(sim_kube, GANGJOBS, "ttl", namespace, timeout=30)


async def test_controller_killed_while_creating_pods_converges(
    sim_kube: Kube, namespace: str, crd: None, ctl_kubeconfig: Path, ctl_log: Path
) -> None:
    n = 150
    ctl = ControllerProcess(ctl_kubeconfig, [f"--namespace={namespace}"], ctl_log)
    await sim_kube.create(GANGJOBS, gangjob("big", n), namespace)
    ctl.start()
    try:
        # Kill it mid-creation: once some, but not all, of the pods exist.
        stream = sim_kube.watch(PODS, namespace, label_selector=f"{LABEL_NAME}=big")
        seen: set[str] = set()
        async with contextlib.aclosing(stream):
            async with asyncio.timeout(60):
                async for ev in stream:
                    if ev.type == "BOOKMARK":
                        continue
                    seen.add(ev.object["metadata"]["name"])
                    if len(seen) >= 20:
                        break
        ctl.kill()
        before = len(await gang_pods(sim_kube, namespace, "big"))
        assert 0 < before < n, f"killed too late to test anything: {before} pods"
        ctl.start()
        await watch_job(sim_kube, namespace, "big", ready_workers(n), timeout=120, what="Running")
        pods = await gang_pods(sim_kube, namespace, "big")
        ranks = sorted(int(p["metadata"]["labels"][LABEL_RANK]) for p in pods)
        assert ranks == list(range(n)), "a rank is missing or doubled"
        assert len({p["metadata"]["uid"] for p in pods}) == n
    finally:
        ctl.stop()


async def test_two_controllers_with_leader_election_never_both_act(
    sim_kube: Kube, namespace: str, crd: None, ctl_kubeconfig: Path, tmp_path: Path
) -> None:
    lease = f"gj-{namespace}"[:60]
    args = [f"--namespace={namespace}", "--leader-elect", f"--leader-election-id={lease}",
            f"--leader-election-namespace={SYSTEM_NS}"]  # fmt: skip
    # Each "runs in" a pod of the controller's namespace (the downward API's POD_NAME): the
    # leader labels its own for the arrival Service.
    pods = {}
    for who in ("a", "b"):
        pod = {
            "metadata": {"name": f"{lease[:50]}-{who}"},
            "spec": {"containers": [{"name": "c", "image": "localhost/busybox:dev"}]},
        }
        pods[who] = (await sim_kube.create(PODS, pod, SYSTEM_NS))["metadata"]["name"]

    def controller(who: str) -> ControllerProcess:
        env = {"POD_NAME": pods[who], "POD_NAMESPACE": SYSTEM_NS}
        return ControllerProcess(ctl_kubeconfig, args, tmp_path / f"{who}.log", arrivals=True,
                                 env=env)  # fmt: skip

    def labelled() -> Callable[[JsonDict], bool]:
        return lambda p: p["metadata"].get("labels", {}).get(LEADER_LABEL) == "leader"

    a, b = controller("a"), controller("b")
    a.start()
    b.start()
    try:
        # Both up (caches synced, metrics served) before the race: the one that reconciles
        # must have won the Lease, not merely started first.
        await asyncio.gather(asyncio.to_thread(a.wait_ready), asyncio.to_thread(b.wait_ready))
        await sim_kube.create(GANGJOBS, gangjob("le", 2), namespace)
        await watch_job(sim_kube, namespace, "le", ready_workers(2), what="Running")
        holder = (await sim_kube.get(LEASES, lease, SYSTEM_NS))["spec"]["holderIdentity"]
        active = [c for c in (a, b) if c.metric("controller_runtime_reconcile_total") > 0]
        assert len(active) == 1, "both controllers reconciled"
        leader, standby = active[0], (b if active[0] is a else a)
        assert standby.metric("leader_election_master_status") == 0
        assert leader.metric("leader_election_master_status") == 1
        # The arrival Service selects the leader's pod alone; the standby turns reports away.
        who = "a" if leader is a else "b"
        await wait_for(sim_kube, PODS, pods[who], SYSTEM_NS, labelled(), 10, "labelled")
        other = await sim_kube.get(PODS, pods["b" if who == "a" else "a"], SYSTEM_NS)
        assert LEADER_LABEL not in other["metadata"].get("labels", {})
        assert standby.arrival_url is not None
        async with HttpClient(standby.arrival_url) as client:
            with pytest.raises(ApiError, match="503"):
                async for _ in client.stream("POST", "/v1/arrivals", {}, token="t"):
                    pass
        # The leader dies without releasing the Lease: the standby takes over once it expires.
        leader.kill()
        await sim_kube.create(GANGJOBS, gangjob("le2", 1), namespace)
        await watch_job(sim_kube, namespace, "le2", ready_workers(1), timeout=60, what="Running")
        new_holder = (await sim_kube.get(LEASES, lease, SYSTEM_NS))["spec"]["holderIdentity"]
        assert new_holder != holder
        assert standby.metric("controller_runtime_reconcile_total") > 0
        new = "b" if who == "a" else "a"
        await wait_for(sim_kube, PODS, pods[new], SYSTEM_NS, labelled(), 10, "labelled")
    finally:
        a.stop()
        b.stop()
        for name in pods.values():
            with contextlib.suppress(NotFound):
                await sim_kube.delete(PODS, name, SYSTEM_NS, grace_period_seconds=0)
