"""Stragglers on the sim cluster, end to end through the real controller: the simulated kubelet's
stand-in trainers report their compute per step, one pod's device is made slow, its agent says
so, and the controller finds the straggler. By default it is only reported (the Warning Event
naming pod and node, the `Stragglers` condition, `status.progress.stragglers`), and caught up
it is no longer one; with a `RecreateWorker` rule on class `Straggler` the worker is recreated
off its node and the rest restart in place."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.k8s import PODS, JsonDict, Kube
from localcluster import simkubelet
from localcluster.cluster import Cluster
from localcluster.simkubelet import SimKubelet
from tests.integration.harness import watch_job
from tests.integration.test_simkubelet import World, sim_world
from tests.integration.test_stuck import warning_event

pytestmark = pytest.mark.integration

REPLICAS = 4
FOR_SECONDS = 10
PROGRESS = simkubelet.SimProgress(steps_per_second=4.0, compute_seconds=0.15, jitter=0.1, seed=28)
STRAGGLER = {"straggler": {"ratio": 1.5, "forSeconds": FOR_SECONDS}}
# The agents' first summaries come within their 30 s period; then forSeconds, and the shift.
DETECTED_WITHIN = 90.0


@pytest.fixture
async def world(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str, tmp_path: Path
) -> AsyncIterator[World]:
    async with sim_world(sim_cluster, sim_kube, namespace, tmp_path, PROGRESS, 3) as w:
        yield w


async def running(world: World, job: str) -> list[str]:
    """The gang's barrier open, every agent's trainer stepping and each one summary sent: from
    then on an agent tells a shift of its compute at once."""
    await world.barrier_open(job, 0, REPLICAS)
    names = [f"{job}-{r}" for r in range(REPLICAS)]
    await world.agents_at(0, names)

    def summarised(sim: SimKubelet) -> bool:
        agents = [sim.workers[n].agent for n in names]
        return all(
            a is not None and a.progress is not None and a.progress.summaries for a in agents
        )

    await world.sim.wait(summarised, 60)
    return names


def stragglers(job: JsonDict) -> list[int] | None:
    return ((job.get("status") or {}).get("progress") or {}).get("stragglers")


def condition(job: JsonDict, type_: str) -> JsonDict | None:
    return next((c for c in job["status"].get("conditions", []) if c["type"] == type_), None)


async def test_a_slow_device_is_reported_and_by_default_nothing_restarts(world: World) -> None:
    await world.create("slow", REPLICAS, restart={"mode": "Process"}, progress=STRAGGLER)
    names = await running(world, "slow")
    node = world.sim.node_of("slow-2")
    world.sim.slow("slow-2", 2.5)

    job = await watch_job(
        world.kube, world.ns, "slow", lambda j: stragglers(j) == [2], DETECTED_WITHIN,
        "worker 2 found straggling",
    )  # fmt: skip
    event = await warning_event(world.kube, world.ns, "slow", "Straggler")
    assert event["message"].startswith(f"worker 2 (pod slow-2) on node {node}: compute")
    found = condition(job, "Stragglers")
    assert found is not None
    assert (found["status"], found["reason"]) == ("True", "StragglersFound")
    assert "slow-2" in found["message"]
    # Report only: the gang runs on, slowly, at its epoch.
    assert job["status"]["epoch"] == 0
    assert job["status"]["restarts"]["total"] == 0
    assert world.sim.step_seconds["slow"] > 0.3

    # The device recovers: its agent says so at once, and the worker is no straggler any more.
    world.sim.slow("slow-2", 1.0)
    job = await watch_job(
        world.kube, world.ns, "slow", lambda j: stragglers(j) is None, DETECTED_WITHIN,
        "worker 2 caught up",
    )  # fmt: skip
    found = condition(job, "Stragglers")
    assert found is not None
    assert (found["status"], found["reason"]) == ("False", "NoStragglers")
    assert job["status"]["epoch"] == 0
    assert all(world.sim.workers[n].trainer is not None for n in names)


async def test_a_rule_recreates_the_straggler_off_its_node(world: World) -> None:
    rules = [{"action": "RecreateWorker", "onFailureClasses": ["Straggler"]}]
    await world.create(
        "move", REPLICAS, restart={"mode": "Process"}, progress=STRAGGLER,
        failurePolicy={"rules": rules},
    )  # fmt: skip
    names = await running(world, "move")
    before = await world.kube.get(PODS, "move-1", world.ns)
    node = before["spec"]["nodeName"]
    world.sim.slow("move-1", 2.5)

    job = await world.barrier_open("move", 1, REPLICAS)
    last = job["status"]["lastRestart"]
    assert (last["trigger"]["class"], last["trigger"]["worker"]) == ("Straggler", 1)
    assert last["trigger"]["action"] == "RecreateWorker"
    assert last["recreated"] == [1]
    assert not last.get("counted")
    assert job["status"]["avoidNodes"] == [node]
    await world.agents_at(1, names)
    after = await world.kube.get(PODS, "move-1", world.ns)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["spec"]["nodeName"] != node  # moved off the slow device's node
    # The rest restarted in place: same pods, their trainers run again at epoch 1.
    for n in names:
        if n != "move-1":
            assert [run.epoch for run in world.sim.workers[n].trainer_runs] == [0, 1]
    # The gang steps at a healthy pace again.
    healthy = PROGRESS.step_seconds()
    await world.sim.wait(lambda sim: sim.step_seconds["move"] == pytest.approx(healthy), 10)
    await warning_event(world.kube, world.ns, "move", "Straggler")
