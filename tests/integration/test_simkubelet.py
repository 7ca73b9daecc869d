"""The simulated kubelet against the real apiserver: what it caches after a relist, which pod
its status writes land on, its status manager (writes on their own timeline, coalesced to the
latest, retried after a conflict), and `Process` mode with its stand-in trainer under the real
controller."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Step
from agent.apiclient import HttpClient, ssl_context
from api import builders
from api.constants import AgentPlacement
from controller.k8s import GANGJOBS, NODES, PODS, JsonDict, Kube, NotFound
from localcluster import simkubelet
from localcluster.cluster import SIMULATED_KUBELET_LABEL, Cluster, Options, kwok_node
from localcluster.simkubelet import SimKubelet
from tests.integration.harness import (
    ControllerProcess,
    controller_kubeconfig,
    install_crd,
    watch_job,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RESTART_DELAY = 0.2
TRAINER = {"name": "trainer", "image": "localhost/busybox:dev", "command": ["python3", "train.py"]}
DRAINED_WITHIN = 30.0


def _api(cluster: Cluster) -> HttpClient:
    pki = cluster.pki
    return HttpClient(
        cluster.server,
        ssl_context=ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key"),
    )


@pytest.fixture
async def sim(sim_cluster: Cluster, namespace: str) -> AsyncIterator[SimKubelet]:
    api = _api(sim_cluster)
    s = SimKubelet(api, namespace, restart_delay=RESTART_DELAY)  # not run: tests drive its steps
    try:
        yield s
    finally:
        await s.close()
        await api.close()


def _pod(name: str) -> JsonDict:
    return {
        "metadata": {"name": name, "labels": {"gangjob.io/name": "g"}},
        "spec": {
            "containers": [{"name": "trainer", "image": "localhost/busybox:dev"}],
            # No node fits: it stays Pending, and no kubelet (KWOK's) writes its status.
            "nodeSelector": {"gangjob-test/no-such-node": "x"},
        },
    }


async def _recreate(kube: Kube, ns: str, name: str) -> JsonDict:
    await kube.delete(PODS, name, ns, grace_period_seconds=0)
    return await kube.create(PODS, _pod(name), ns)


def _bound_pod(name: str) -> JsonDict:
    """A pod on a KWOK node, labelled for the simulated kubelet to finish its deletion."""
    pod = _pod(name)
    pod["metadata"]["labels"][SIMULATED_KUBELET_LABEL] = "true"
    del pod["spec"]["nodeSelector"]
    pod["spec"]["nodeName"] = "kwok-node-0"
    return pod


def _pod_mode_pod(name: str) -> JsonDict:
    """A worker as the controller shapes it for `Pod` mode: the agent a native sidecar, the
    trainer's exit code 1 restarting the whole pod (KEP-5532)."""
    pod = _bound_pod(name)
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"
    spec["initContainers"] = [
        {"name": "gangjob-agent", "image": "localhost/busybox:dev", "restartPolicy": "Always"}
    ]
    spec["containers"][0]["restartPolicy"] = "Never"
    spec["containers"][0]["restartPolicyRules"] = [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}
    ]
    return pod


async def _running(kube: Kube, ns: str, pod: JsonDict) -> JsonDict:
    """Creates the pod on a KWOK node; returns it once KWOK has it Running and Ready."""
    await kube.create(PODS, pod, ns)

    def ready(p: JsonDict) -> bool:
        conds = p.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    return await wait_for(kube, PODS, pod["metadata"]["name"], ns, ready, 30, "Ready")


def _conditions(pod: JsonDict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}


def _containers(pod: JsonDict) -> list[JsonDict]:
    status = pod.get("status", {})
    return [*status.get("containerStatuses", []), *status.get("initContainerStatuses", [])]


async def _drained(sim: SimKubelet) -> None:
    async with asyncio.timeout(DRAINED_WITHIN):
        await sim.status.drained()


# -- the pod watch -------------------------------------------------------------------------


async def test_a_relist_drops_the_pods_deleted_while_no_watch_was_open(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    for name in ("a", "b"):
        await sim_kube.create(PODS, _pod(name), namespace)
    listed = await sim.api.get(sim.pods_path, {"labelSelector": "gangjob.io/name"})
    sim._relisted(listed["items"])
    assert set(sim.pods) == {"a", "b"}

    # Deleted and recreated while the watch was down: neither DELETED event ever arrives.
    await sim_kube.delete(PODS, "a", namespace, grace_period_seconds=0)
    new_b = await _recreate(sim_kube, namespace, "b")
    listed = await sim.api.get(sim.pods_path, {"labelSelector": "gangjob.io/name"})
    sim._relisted(listed["items"])

    assert set(sim.pods) == {"b"}
    assert sim.pods["b"]["metadata"]["uid"] == new_b["metadata"]["uid"]


async def test_the_pod_list_comes_whole_in_pages(
    sim: SimKubelet, sim_kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simkubelet, "LIST_PAGE", 2)
    names = {f"p{i}" for i in range(5)}
    for name in names:
        await sim_kube.create(PODS, _pod(name), namespace)
    items, rv = await sim._list({"labelSelector": "gangjob.io/name"})
    assert sorted(p["metadata"]["name"] for p in items) == sorted(names)
    assert int(rv) > 0  # the snapshot's version, for the watch that follows


async def test_the_simulation_not_kwok_finishes_a_deletion_and_only_for_its_uid(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    old = await sim_kube.create(PODS, _bound_pod("w"), namespace)
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=30)
    # KWOK's pod-delete stage skips the label (KWOK deletes by name only): it stays terminating.
    await asyncio.sleep(3)
    terminating = await sim_kube.get(PODS, "w", namespace)
    assert terminating["metadata"]["deletionTimestamp"]

    # Recreated under the same name (as the controller recreates a worker) while the old pod's
    # deletion was pending: the late finish of the old pod must not remove the new one.
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=0)
    new = await sim_kube.create(PODS, _bound_pod("w"), namespace)
    sim._finish_deletion(terminating)
    await asyncio.gather(*sim._tasks)
    assert (await sim_kube.get(PODS, "w", namespace))["metadata"]["uid"] == new["metadata"]["uid"]
    assert old["metadata"]["uid"] != new["metadata"]["uid"]

    # The new pod's own deletion is finished, as soon as the simulation sees it terminating.
    await sim_kube.delete(PODS, "w", namespace, grace_period_seconds=30)
    sim._seen(await sim_kube.get(PODS, "w", namespace))
    await asyncio.gather(*sim._tasks)
    with pytest.raises(NotFound):
        await sim_kube.get(PODS, "w", namespace)


# -- the status manager --------------------------------------------------------------------


def _restart_condition(status: JsonDict) -> JsonDict:
    status["conditions"] = [{"type": "AllContainersRestarting", "status": "True"}]
    return status


async def test_a_status_write_never_lands_on_a_recreated_pod_of_the_same_name(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    old = await sim_kube.create(PODS, _pod("w"), namespace)
    sim._relisted([old])  # the watch's copy is of the old pod
    new = await _recreate(sim_kube, namespace, "w")

    # The old pod's kubelet, late: its write conflicts on the stale copy, and the fresh read
    # finds another pod: the old pod's status is dropped.
    sim.status.set("w", old["metadata"]["uid"], _restart_condition({}))
    await _drained(sim)
    assert "AllContainersRestarting" not in _conditions(await sim_kube.get(PODS, "w", namespace))
    assert sim.status.latest(old["metadata"]["uid"]) is None

    # The same write for the pod that is there does land.
    sim.status.set("w", new["metadata"]["uid"], _restart_condition({}))
    await _drained(sim)
    assert "AllContainersRestarting" in _conditions(await sim_kube.get(PODS, "w", namespace))


async def test_a_restart_runs_on_the_nodes_timeline_whatever_its_status_writes(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    pod = await _running(sim_kube, namespace, _pod_mode_pod("w"))
    sim._relisted([pod])  # the kubelet sees it Running: its agent starts
    w = sim.workers["w"]
    first = w.agent
    assert first is not None

    sim.status.pause()  # no status write reaches the apiserver
    await sim.crash("w", 1)  # the trainer's code restarts the whole pod

    # The node went on: the old agent ended and a new one runs, `restart_delay` later ...
    assert w.restarts == 1
    assert first.state.step is Step.DONE
    assert w.agent is not None
    assert w.agent is not first
    assert w.agent.state.step is not Step.DONE
    # ... while the apiserver still has the pod as it was, and nothing was marked written.
    now = await sim_kube.get(PODS, "w", namespace)
    assert "AllContainersRestarting" not in _conditions(now)
    assert {c["restartCount"] for c in _containers(now)} == {0}
    assert w.written == {}
    assert sim.status.unsent(w.uid)

    # Let through, the kubelet sends the pod's latest status only: running again.
    sim.status.resume()
    await _drained(sim)
    now = await sim_kube.get(PODS, "w", namespace)
    conditions = _conditions(now)
    assert "AllContainersRestarting" not in conditions
    assert conditions["Ready"] == "True"
    for c in _containers(now):
        assert c["restartCount"] == 1
        assert c["lastState"]["terminated"]["reason"] == "RestartingAllContainers"
        assert "running" in c["state"]
    assert sim.status.writes == 1
    assert set(w.written) == {"restarting", "restarted", "running"}


async def test_a_ready_condition_marked_false_by_another_is_put_back(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    """As the node lifecycle controller does to every pod of a node whose heartbeats lapsed
    (MarkPodsNotReady: Ready False, ContainersReady left True): the kubelet, still running the
    pod, says it is ready again, as the real one's status manager does."""
    pod = await _running(sim_kube, namespace, _pod_mode_pod("w"))
    sim._relisted([pod])
    conditions = [
        {**c, "status": "False"} if c["type"] == "Ready" else c for c in pod["status"]["conditions"]
    ]
    marked = await sim_kube.patch_status(PODS, "w", {"status": {"conditions": conditions}},
                                         namespace)  # fmt: skip
    assert _conditions(marked)["Ready"] == "False"
    sim._seen(marked)  # the kubelet's watch brings it
    await _drained(sim)
    now = _conditions(await sim_kube.get(PODS, "w", namespace))
    assert now["Ready"] == "True"
    assert now["ContainersReady"] == "True"
    assert "Ready put back to True" in sim.workers["w"].events

    # Not Ready by the kubelet's own word (a restart begun) stays so: nothing to put back.
    w = sim.workers["w"]
    sim._set_status(w, "restarting", functools.partial(simkubelet._restarting, simkubelet._now()))
    await _drained(sim)
    restarting = await sim_kube.get(PODS, "w", namespace)
    assert _conditions(restarting)["Ready"] == "False"
    writes = sim.status.writes
    sim._seen(restarting)
    await _drained(sim)
    assert sim.status.writes == writes
    assert [e for e in w.events if e.startswith("Ready")] == ["Ready put back to True"]


async def test_updates_queued_while_writes_are_held_become_one_write_of_the_latest(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    pod = await _running(sim_kube, namespace, _bound_pod("w"))
    uid = pod["metadata"]["uid"]
    sim._relisted([pod])
    sim.status.pause()
    for count in range(1, 6):
        status = {"containerStatuses": [{**pod["status"]["containerStatuses"][0],
                                         "restartCount": count}]}  # fmt: skip
        sim.status.set("w", uid, status)

    events: list[str] = []
    version = pod["metadata"]["resourceVersion"]
    stream = sim_kube.watch(
        PODS, namespace, field_selector="metadata.name=w", resource_version=version
    )
    sim.status.resume()
    await _drained(sim)
    written = await sim_kube.get(PODS, "w", namespace)
    assert written["status"]["containerStatuses"][0]["restartCount"] == 5
    # The apiserver saw one change of the pod, up to the version it has now.
    async with contextlib.aclosing(stream), asyncio.timeout(30):
        async for ev in stream:
            events.append(ev.type)
            if ev.object["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]:
                break
    assert events == ["MODIFIED"]
    assert sim.status.writes == 1


async def test_a_conflicting_write_is_done_again_on_a_fresh_read_keeping_the_others(
    sim: SimKubelet, sim_kube: Kube, namespace: str
) -> None:
    pod = await _running(sim_kube, namespace, _bound_pod("w"))
    sim._relisted([pod])  # the kubelet's copy, soon stale
    # Another writer (a readiness gate's controller) adds a condition of its own first.
    gate = {"type": "example.com/Checked", "status": "True", "reason": "Checked"}
    await sim_kube.patch_status(
        PODS, "w", {"status": {"conditions": [*pod["status"]["conditions"], gate]}},
        namespace,
    )  # fmt: skip

    status = sim.status.latest(pod["metadata"]["uid"]) or dict(pod["status"])
    sim.status.set("w", pod["metadata"]["uid"], _restart_condition(status))
    await _drained(sim)

    conditions = _conditions(await sim_kube.get(PODS, "w", namespace))
    assert conditions["AllContainersRestarting"] == "True"
    assert conditions["example.com/Checked"] == "True"
    assert sim.status.conflicts == 1
    assert sim.status.writes == 1


# -- with the controller -------------------------------------------------------------------


@dataclass
class World:
    """The real controller and a running simulated kubelet on nodes of the test's own."""

    kube: Kube
    ns: str
    sim: SimKubelet
    ctl: ControllerProcess

    async def create(self, name: str, replicas: int, **spec: Any) -> None:
        body = builders.gangjob(
            name,
            replicas,
            containers=[TRAINER],
            pod_labels={SIMULATED_KUBELET_LABEL: "true"},
            pod_spec={"nodeSelector": {"gangjob-test": self.ns}},
            spec=spec,
        )
        await self.kube.create(GANGJOBS, body, self.ns)

    async def barrier_open(self, job: str, epoch: int, replicas: int) -> JsonDict:
        def at(j: JsonDict) -> bool:
            st = j.get("status", {})
            arrived = st.get("workers", {}).get("arrived")
            return bool(st.get("barrierEpoch") == epoch and arrived == replicas)

        return await watch_job(self.kube, self.ns, job, at, 60, f"barrier open at {epoch}")

    async def agents_at(self, epoch: int, names: list[str]) -> None:
        """Every named agent saw the barrier at `epoch` open (`Process` mode: and its trainer
        runs there)."""

        def ok(sim: SimKubelet) -> bool:
            for n in names:
                w = sim.workers.get(n)
                st = w.agent.state if w is not None and w.agent is not None else None
                if st is None or st.epoch != epoch or not st.barrier_open:
                    return False
                assert w is not None
                if w.mode is AgentPlacement.WRAPPER and not (
                    w.trainer is not None and w.trainer.epoch == epoch and w.trainer.running
                ):
                    return False
            return True

        await self.sim.wait(ok, 30)


@contextlib.asynccontextmanager
async def sim_world(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    progress: simkubelet.SimProgress | None = None,
    nodes_count: int = 2,
) -> AsyncIterator[World]:
    """The real controller, a simulated kubelet with `progress`, and `nodes_count` KWOK nodes
    of the test's own (label `gangjob-test: <namespace>`)."""
    await install_crd(kube)
    nodes = [f"{namespace[:40]}-n{i}" for i in range(nodes_count)]
    for name in nodes:
        node = kwok_node(name, Options(gpus_per_node=2))
        node["metadata"]["labels"]["gangjob-test"] = namespace
        await kube.create(NODES, node)
    api = _api(cluster)
    ctl = ControllerProcess(
        controller_kubeconfig(cluster), [f"--namespace={namespace}"], tmp_path / "ctl.log",
        arrivals=True,
    )  # fmt: skip
    sim = SimKubelet(
        api, namespace, restart_delay=RESTART_DELAY, arrival_url=ctl.arrival_url, progress=progress
    )
    sim_task = asyncio.create_task(sim.run())
    ctl.start()
    try:
        yield World(kube, namespace, sim, ctl)
    finally:
        ctl.stop()
        print(ctl.logs()[-4000:])
        sim_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sim_task
        await sim.close()
        await api.close()
        for name in nodes:
            with contextlib.suppress(NotFound):
                await kube.delete(NODES, name)


@pytest.fixture
async def world(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str, tmp_path: Path
) -> AsyncIterator[World]:
    async with sim_world(sim_cluster, sim_kube, namespace, tmp_path) as w:
        yield w


@pytest.fixture
async def reporting_world(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str, tmp_path: Path
) -> AsyncIterator[World]:
    """The stand-in trainers report 4 steps a second, a checkpoint every 8."""
    progress = simkubelet.SimProgress(steps_per_second=4.0, checkpoint_every=8)
    async with sim_world(sim_cluster, sim_kube, namespace, tmp_path, progress) as w:
        yield w


async def test_with_every_status_write_held_back_a_gang_still_restarts_in_place(
    world: World,
) -> None:
    await world.create("held", 3)
    await world.barrier_open("held", 0, 3)
    names = [f"held-{r}" for r in range(3)]
    await world.agents_at(0, names)
    before = {n: (await world.kube.get(PODS, n, world.ns))["metadata"]["uid"] for n in names}

    world.sim.status.pause()
    await world.sim.crash("held-1", 1)
    # No status write goes through: the restarted agent reports its pod's restart itself, the
    # controller restarts the gang, and every agent, restarted on the node's timeline, arrives.
    await world.barrier_open("held", 1, 3)
    await world.agents_at(1, names)
    assert world.sim.status.writes == 0
    assert all(world.sim.workers[n].restarts == 1 for n in names)

    world.sim.status.resume()
    await _drained(world.sim)
    for n in names:
        pod = await world.kube.get(PODS, n, world.ns)
        assert pod["metadata"]["uid"] == before[n]
        assert {c["restartCount"] for c in _containers(pod)} == {1}
        assert _conditions(pod)["Ready"] == "True"
    # Each pod's restarting and running statuses went out as one write.
    assert world.sim.status.writes == len(names)


async def test_process_mode_restarts_the_stand_in_trainer_in_place(world: World) -> None:
    await world.create("proc", 3, restart={"mode": "Process"})
    await world.barrier_open("proc", 0, 3)
    names = [f"proc-{r}" for r in range(3)]
    await world.agents_at(0, names)
    before = {n: (await world.kube.get(PODS, n, world.ns))["metadata"]["uid"] for n in names}

    await world.sim.crash(world.sim.name_of("proc", 1), 7)  # rank 1's trainer exits 7
    job = await world.barrier_open("proc", 1, 3)
    await world.agents_at(1, names)

    assert job["status"]["lastRestart"]["trigger"]["worker"] == 1
    for n in names:
        w = world.sim.workers[n]
        assert (await world.kube.get(PODS, n, world.ns))["metadata"]["uid"] == before[n]
        assert w.restarts == 0  # no kubelet restart: the agent ran the trainer again
        assert [run.epoch for run in w.trainer_runs] == [0, 1]
        # The failed run ended with its code; the others were stopped as SIGTERM stops them.
        assert w.trainer_runs[0].code == (7 if n == "proc-1" else 143)
    assert world.sim.status.writes == 0  # the kubelet had nothing to say


async def test_process_mode_a_trainer_done_ends_its_container_and_pod(world: World) -> None:
    await world.create("done", 2, restart={"mode": "Process"})
    await world.barrier_open("done", 0, 2)
    await world.agents_at(0, ["done-0", "done-1"])

    # Rank 1's trainer is done: the agent reports it and, while the job has not succeeded,
    # waits with its container running (a restart of the gang would run it again in place).
    await world.sim.crash("done-1", 0)
    await watch_job(
        world.kube, world.ns, "done",
        lambda j: [r["succeeded"] for r in j["status"].get("roles") or []] == [1], 30,
    )  # fmt: skip
    assert (await world.kube.get(PODS, "done-1", world.ns))["status"]["phase"] == "Running"

    await world.sim.crash("done-0", 0)
    job = await watch_job(
        world.kube, world.ns, "done", lambda j: j["status"].get("phase") == "Succeeded", 30
    )
    # The job succeeded: every agent ends, and with it its container and (`restartPolicy:
    # Never`) its pod.

    def ended(pod: JsonDict) -> bool:
        return bool(pod.get("status", {}).get("phase") == "Succeeded")

    for name in ("done-0", "done-1"):
        pod = await wait_for(world.kube, PODS, name, world.ns, ended, 30, "Succeeded")
        trainer = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "trainer")
        assert trainer["state"]["terminated"]["exitCode"] == 0
    assert job["status"]["epoch"] == 0


@pytest.mark.parametrize("mode", ["Process", "Pod"])
async def test_a_stand_in_trainer_that_stops_reporting_restarts_its_gang_as_a_hang(
    reporting_world: World, mode: str
) -> None:
    """`Process` mode: the agent's own trainer runs report; `Pod` mode: the stand-in of the
    trainer container the kubelet starts at the barrier, stopped by the pod's restart."""
    world = reporting_world
    job = f"hung-{mode.lower()}"
    await world.create(job, 3, restart={"mode": mode}, progress={"hangSeconds": 5})
    await world.barrier_open(job, 0, 3)
    names = [f"{job}-{r}" for r in range(3)]
    await world.agents_at(0, names)

    def reported(sim: SimKubelet) -> bool:
        runs = [sim.workers[n].trainer for n in names]
        return all(r is not None and r.step is not None and r.step >= 1 for r in runs)

    await world.sim.wait(reported, 30)
    agents = [world.sim.workers[n].agent for n in names]
    hung = world.sim.hang(f"{job}-1")  # alive, no step any more: only its agent can tell

    # The agent reports the stall, the controller restarts the gang in place and names rank 1.
    status = (await world.barrier_open(job, 1, 3))["status"]
    await world.agents_at(1, names)
    trigger = status["lastRestart"]["trigger"]
    assert (trigger["class"], trigger["worker"]) == ("Hang", 1)
    assert hung.code == simkubelet.STOPPED_EXIT_CODE  # stopped by the restart, never exited
    assert [a.progress.stalls if a and a.progress else None for a in agents] == [0, 1, 0]
    # `Pod` mode restarted every pod (same UID), `Process` mode none.
    assert [world.sim.workers[n].restarts for n in names] == [int(mode == "Pod")] * 3
    # The new runs report again: the steps of epoch 1 start from 0.
    await world.sim.wait(
        lambda sim: all((r := sim.workers[n].trainer) is not None and r.epoch == 1
                        and r.step is not None for n in names), 30,
    )  # fmt: skip
