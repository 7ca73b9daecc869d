"""The restart protocol end to end on the sim cluster: the real controller (a subprocess, its own
RBAC), the real agent for every pod (in this process), and failures injected the way the
kubelet or the node controller report them (localcluster.simkubelet plays the kubelet)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.apiclient import HttpClient, ssl_context
from api.builders import gangjob
from benchmarks.scale.cluster import lose_node
from controller.k8s import CORE_EVENTS, GANGJOBS, NODES, PODS, JsonDict, Kube, NotFound
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet
from tests.integration.harness import (
    ControllerProcess,
    controller_kubeconfig,
    gang_pods,
    install_crd,
    watch_job,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# The kubelet's whole-pod restart takes ~2 s on the real node; tests need not wait that long.
RESTART_DELAY = 0.3


@dataclass
class Gang:
    """One test's world: its own KWOK nodes, the controller, the simulated kubelet."""

    kube: Kube
    ns: str
    nodes: list[str]
    sim: SimKubelet
    ctl: ControllerProcess

    async def create(self, name: str, replicas: int, **spec: Any) -> JsonDict:
        body = gangjob(
            name, replicas,
            image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
            container=spec.pop("trainer", {}),
            pod_spec={"nodeSelector": {"gangjob-test": self.ns}},
            # The simulated kubelet, not KWOK, finishes these pods' deletion (by UID).
            pod_labels={SIMULATED_KUBELET_LABEL: "true"},
            spec=spec,
        )  # fmt: skip
        return await self.kube.create(GANGJOBS, body, self.ns)

    async def pods(self, job: str) -> dict[str, JsonDict]:
        return {p["metadata"]["name"]: p for p in await gang_pods(self.kube, self.ns, job)}

    async def running_at(
        self, job: str, epoch: int, replicas: int, timeout: float = 60
    ) -> JsonDict:
        """The job once every worker arrived at `epoch` and the barrier opened there."""

        def at(j: JsonDict) -> bool:
            st = j.get("status", {})
            return bool(
                st.get("epoch") == epoch
                and st.get("barrierEpoch") == epoch
                and st.get("workers", {}).get("arrived") == replicas
            )

        return await watch_job(self.kube, self.ns, job, at, timeout, f"barrier open at {epoch}")

    async def agents_at(self, epoch: int, names: list[str], timeout: float = 30) -> None:
        """Every named worker's agent has seen the barrier open at `epoch`."""

        def ok(sim: SimKubelet) -> bool:
            for n in names:
                w = sim.workers.get(n)
                if w is None or w.agent is None:
                    return False
                st = w.agent.state
                if not (st.epoch == epoch and st.barrier_open):
                    return False
            return True

        try:
            await self.sim.wait(ok, timeout)
        except TimeoutError:
            states = {
                n: (w.agent.state if w.agent else None, w.restarts, w.events)
                for n, w in self.sim.workers.items()
            }
            raise AssertionError(f"agents not all at epoch {epoch}: {states}") from None


@pytest.fixture(scope="module")
def ctl_kubeconfig(sim_cluster: Cluster) -> Path:
    return controller_kubeconfig(sim_cluster)


@pytest.fixture(params=["direct"])
async def gang(
    request: pytest.FixtureRequest,
    sim_cluster: Cluster,
    sim_kube: Kube,
    namespace: str,
    ctl_kubeconfig: Path,
    tmp_path: Path,
) -> AsyncIterator[Gang]:
    """`direct`: agents report arrivals to the controller's endpoint (as the manifests deploy
    it); `annotation`: the controller serves none, and agents write their pods."""
    direct = request.param == "direct"
    await install_crd(sim_kube)
    # Nodes of this test only (the namespace's random suffix included: two parametrizations
    # share its first 40 characters), so losing one touches no other test.
    names = [f"{namespace}-n{i}" for i in range(3)]
    for name in names:
        node = kwok_node(name, Options(gpus_per_node=2))
        node["metadata"]["labels"]["gangjob-test"] = namespace
        await sim_kube.create(NODES, node)
    for name in names:
        await wait_for(sim_kube, NODES, name, None, _node_ready, 30, "Ready")
    api = HttpClient(
        sim_cluster.server,
        ssl_context=ssl_context(
            sim_cluster.pki / "ca.crt", sim_cluster.pki / "admin.crt", sim_cluster.pki / "admin.key"
        ),
    )
    ctl = ControllerProcess(
        ctl_kubeconfig, [f"--namespace={namespace}"], tmp_path / "ctl.log", arrivals=direct
    )
    sim = SimKubelet(api, namespace, restart_delay=RESTART_DELAY, arrival_url=ctl.arrival_url)
    sim_task = asyncio.create_task(sim.run())
    ctl.start()
    try:
        yield Gang(sim_kube, namespace, names, sim, ctl)
    finally:
        ctl.stop()
        print(ctl.logs()[-4000:])
        sim_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sim_task
        await sim.close()
        await api.close()
        for name in names:
            with contextlib.suppress(NotFound):
                await sim_kube.delete(NODES, name)


def _node_ready(node: JsonDict) -> bool:
    conds = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def uids(pods: dict[str, JsonDict]) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in pods.items()}


BOTH_CHANNELS = pytest.mark.parametrize("gang", ["direct", "annotation"], indirect=True)


@BOTH_CHANNELS
async def test_one_worker_crashes_and_the_gang_restarts_in_place_once(gang: Gang) -> None:
    await gang.create("one", 4)
    await gang.running_at("one", 0, 4)
    before = uids(await gang.pods("one"))
    await gang.agents_at(0, list(before))

    await gang.sim.crash("one-2", 1)
    job = await gang.running_at("one", 1, 4)

    st = job["status"]
    assert st["restarts"]["total"] == 1
    assert st["restarts"]["inPlace"] == 1
    last = st["lastRestart"]
    assert last["epoch"] == 1
    assert last["trigger"]["worker"] == 2
    assert last["durationSeconds"] > 0
    assert last["recreated"] == []
    # In place: the same four pods, every agent now past the barrier of epoch 1.
    assert uids(await gang.pods("one")) == before
    await gang.agents_at(1, list(before))
    pods = await gang.pods("one")
    epochs = {p["metadata"].get("annotations", {}).get("gangjob.io/epoch") for p in pods.values()}
    if gang.ctl.arrival_url:
        # Reported to the controller: no agent wrote its pod.
        assert epochs == {None}
        assert gang.ctl.metric("gangjob_arrival_reports_total", {"result": "accepted"}) >= 8
    else:
        assert epochs == {"1"}
    # Reported: metrics, and Events on the GangJob (as `kubectl describe gj` shows them).
    ctl = gang.ctl
    assert (
        ctl.metric("gangjob_restarts_total", {"class": "ProcessExit", "action": "RestartGang"}) == 1
    )
    assert ctl.metric("gangjob_restart_duration_seconds_count", {"mode": "Pod"}) == 1
    assert ctl.metric("gangjob_epoch", {"name": "one"}) == 1
    events = (await gang.kube.list(CORE_EVENTS, gang.ns)).items
    reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == "one"]
    assert reasons.count("GangRestarting") == 1
    assert reasons.count("GangRestarted") == 1


async def test_three_crash_at_once_cause_one_bump(gang: Gang) -> None:
    await gang.create("three", 4)
    await gang.running_at("three", 0, 4)
    await gang.agents_at(0, [f"three-{r}" for r in range(4)])
    await asyncio.gather(*(gang.sim.crash(f"three-{r}", 1) for r in (0, 1, 3)))
    job = await gang.running_at("three", 1, 4)
    assert job["status"]["restarts"]["total"] == 1
    # ... and it stays there: nothing further to restart for.
    await gang.agents_at(1, [f"three-{r}" for r in range(4)])
    job = await gang.kube.get(GANGJOBS, "three", gang.ns)
    assert job["status"]["epoch"] == 1


async def test_non_retriable_exit_code_fails_the_job_with_the_reason(gang: Gang) -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]
    await gang.create("bug", 2, failurePolicy={"rules": rules})
    await gang.running_at("bug", 0, 2)
    await gang.agents_at(0, ["bug-0", "bug-1"])
    await gang.sim.crash("bug-1", 3)
    job = await watch_job(gang.kube, gang.ns, "bug", _phase("Failed"), 30, "Failed")
    failed = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
    assert failed["status"] == "True"
    assert "3" in failed["message"]
    assert "bug-1" in failed["message"] or "rank 1" in failed["message"]
    assert job["status"]["epoch"] == 0


async def test_budget_exhausted_fails_the_job(gang: Gang) -> None:
    await gang.create("budget", 2, restart={"maxRestarts": 1})
    await gang.running_at("budget", 0, 2)
    await gang.agents_at(0, ["budget-0", "budget-1"])
    await gang.sim.crash("budget-0", 1)
    await gang.running_at("budget", 1, 2)
    await gang.agents_at(1, ["budget-0", "budget-1"])
    await gang.sim.crash("budget-1", 1)
    job = await watch_job(gang.kube, gang.ns, "budget", _phase("Failed"), 30, "Failed")
    failed = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
    assert failed["reason"] == "MaxRestartsExceeded"
    assert job["status"]["epoch"] == 1


async def test_process_mode_restarts_the_process_not_the_pod(gang: Gang) -> None:
    await gang.create("proc", 3, restart={"mode": "Process"})
    await gang.running_at("proc", 0, 3)
    names = [f"proc-{r}" for r in range(3)]
    await gang.agents_at(0, names)
    before = uids(await gang.pods("proc"))
    await gang.sim.crash("proc-1", 7)
    job = await gang.running_at("proc", 1, 3)
    assert job["status"]["lastRestart"]["trigger"]["worker"] == 1
    await gang.agents_at(1, names)
    assert uids(await gang.pods("proc")) == before
    # No kubelet restart at all: the trainer process ran again inside the same container.
    assert all(gang.sim.workers[n].restarts == 0 for n in names)
    runs = {n: gang.sim.workers[n].agent.state.trainer_runs for n in names}  # type: ignore[union-attr]
    assert all(r >= 2 for r in runs.values()), runs


@pytest.mark.parametrize("gang_scheduling", ["Auto", "Off"])
async def test_node_lost_worker_is_force_deleted_and_recreated_alone(
    gang: Gang, gang_scheduling: str
) -> None:
    await gang.create(
        "lost", 3, nodeLoss={"forceDeleteAfterSeconds": 2}, scheduling={"gang": gang_scheduling}
    )
    await gang.running_at("lost", 0, 3)
    await gang.agents_at(0, [f"lost-{r}" for r in range(3)])
    before = await gang.pods("lost")
    victim = before["lost-1"]
    node = victim["spec"]["nodeName"]
    others = [n for n, p in before.items() if p["spec"]["nodeName"] != node]
    # The node dies: KWOK stops playing its kubelet (so a deleted pod stays Terminating), its
    # agent falls silent, and the node controller marks it unreachable.
    gang.sim.lose("lost-1")
    for n, p in before.items():
        if p["spec"]["nodeName"] == node and n != "lost-1":
            gang.sim.lose(n)
    await _lose_node(gang.kube, node)
    lost_names = [n for n, p in before.items() if p["spec"]["nodeName"] == node]

    job = await gang.running_at("lost", 1, 3, timeout=90)
    after = await gang.pods("lost")
    for n in lost_names:
        assert after[n]["metadata"]["uid"] != before[n]["metadata"]["uid"], "not recreated"
        assert after[n]["spec"]["nodeName"] != node
    for n in others:
        assert after[n]["metadata"]["uid"] == before[n]["metadata"]["uid"], "should stay in place"
    # With gang scheduling the recreated worker joins the gang's PodGroup: the workers still
    # bound count towards its quorum (minCount 3), so it is placed alone, at once.
    group = {"podGroupName": "lost-of-3"} if gang_scheduling == "Auto" else None
    for n, pod in after.items():
        assert pod["spec"].get("schedulingGroup") == group, n
    last = job["status"]["lastRestart"]
    print(f"node loss, gang scheduling {gang_scheduling}: {last['durationSeconds']} s")
    assert last["trigger"]["class"] == "NodeLost"
    assert sorted(last["recreated"]) == sorted(int(n.rsplit("-", 1)[1]) for n in lost_names)
    assert job["status"]["restarts"]["counted"] == 0  # infrastructure does not count


async def test_unhealthy_device_recreates_the_worker_on_another_node(gang: Gang) -> None:
    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    await gang.create("dev", 2, trainer=gpu)
    await gang.running_at("dev", 0, 2)
    await gang.agents_at(0, ["dev-0", "dev-1"])
    before = await gang.pods("dev")
    bad_node = before["dev-0"]["spec"]["nodeName"]

    def unhealthy(status: JsonDict) -> None:
        for c in status.get("containerStatuses", []):
            if c["name"] == "trainer":
                c["allocatedResourcesStatus"] = [
                    {"name": "nvidia.com/gpu",
                     "resources": [{"resourceID": "gpu-0", "health": "Unhealthy"}]}
                ]  # fmt: skip

    await _patch_pod_status(gang.kube, gang.ns, "dev-0", unhealthy)
    job = await gang.running_at("dev", 1, 2, timeout=60)
    after = await gang.pods("dev")
    assert after["dev-0"]["metadata"]["uid"] != before["dev-0"]["metadata"]["uid"]
    assert after["dev-0"]["spec"]["nodeName"] != bad_node
    assert after["dev-1"]["metadata"]["uid"] == before["dev-1"]["metadata"]["uid"]
    assert job["status"]["lastRestart"]["trigger"]["class"] == "DeviceUnhealthy"


@BOTH_CHANNELS
@pytest.mark.parametrize("kill_at", ["before-detection", "after-bump", "mid-arrival"])
async def test_controller_killed_during_a_restart_converges_without_a_second_bump(
    gang: Gang, kill_at: str
) -> None:
    await gang.create("kill", 4)
    await gang.running_at("kill", 0, 4)
    names = [f"kill-{r}" for r in range(4)]
    await gang.agents_at(0, names)
    if kill_at == "before-detection":
        gang.ctl.kill()
        await gang.sim.crash("kill-0", 1)
        await gang.sim.wait(lambda s: s.workers["kill-0"].restarts >= 1)
        gang.ctl.start()
    else:
        await gang.sim.crash("kill-0", 1)
        if kill_at == "after-bump":
            await watch_job(gang.kube, gang.ns, "kill", lambda j: j["status"]["epoch"] == 1)
        else:
            await watch_job(
                gang.kube, gang.ns, "kill",
                lambda j: j["status"]["epoch"] == 1 and j["status"]["workers"]["arrived"] >= 1,
            )  # fmt: skip
        gang.ctl.kill()
        gang.ctl.start()
    job = await gang.running_at("kill", 1, 4)
    await gang.agents_at(1, names)
    job = await gang.kube.get(GANGJOBS, "kill", gang.ns)
    assert job["status"]["epoch"] == 1
    assert job["status"]["restarts"]["total"] == 1
    # The new controller knows every worker is at epoch 1, whichever way they told the old one:
    # a crash now is a failure of the gang, restarted once more.
    await gang.sim.crash("kill-3", 1)
    job = await gang.running_at("kill", 2, 4)
    assert job["status"]["restarts"]["total"] == 2


# -- injecting what the node controller and the kubelet report ---------------------------


def _phase(phase: str) -> Callable[[JsonDict], bool]:
    return lambda j: j.get("status", {}).get("phase") == phase


async def _patch_pod_status(
    kube: Kube, ns: str, name: str, mutate: Callable[[JsonDict], None]
) -> None:
    pod = await kube.get(PODS, name, ns)
    status = pod["status"]
    mutate(status)
    await kube.patch_status(PODS, name, {"status": status}, ns)


async def _lose_node(kube: Kube, node: str) -> None:
    """The node dies, as the benchmark injects it (`lose_node`: KWOK stops playing its kubelet,
    Ready Unknown, the unreachable taints); returns once the node shows it."""
    await lose_node(kube, node)
    await wait_for(kube, NODES, node, None, lambda n: not _node_ready(n), 10, "not Ready")


async def test_nodes_without_restart_all_containers_fall_back_to_process_mode(gang: Gang) -> None:
    # This test's nodes stop declaring KEP-5532's feature (an older kubelet, or the gate off).
    for node in gang.nodes:
        await gang.kube.patch_status(NODES, node, {"status": {"declaredFeatures": None}})
    await gang.create("old", 2)  # asks for Pod mode
    job = await gang.running_at("old", 0, 2)
    assert job["status"]["mode"] == "Process"
    degraded = {c["type"]: c for c in job["status"]["conditions"]}["ModeDegraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "NodesLackRestartAllContainers")
    pods = await gang.pods("old")
    for pod in pods.values():
        assert pod["spec"]["containers"][0]["command"][:3] == [
            "python3",
            "/gangjob/agent.pyz",
            "wrap",
        ]
    # ... and the fallback restarts in place as Process mode does.
    await gang.agents_at(0, list(pods))
    await gang.sim.crash("old-0", 1)
    await gang.running_at("old", 1, 2)
