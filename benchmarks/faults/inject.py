"""One injector per fault kind (`INJECTORS`, keyed as `schedule.KINDS`): each does its harm to
the world, with any waits the kind needs (a bump seen, a Lease taken), and says what it did:
which gangs it touched, how many crashes it gave each, which must fail and which must restart
exactly once. Waiting for the recovery is the runner's."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.agent import Step
from benchmarks.faults.world import FATAL_CODE, World, wait
from benchmarks.scale.cluster import lose_node
from controller.k8s import PODS, JsonDict

RETRIABLE_CODE = 1
STEP_TIMEOUT = 60.0
"""The longest an injector waits for a protocol step it means to strike at."""
ETCD_DOWN_SECONDS = 3.0
OVERLOAD_FLAGS = ["--max-requests-inflight=5", "--max-mutating-requests-inflight=2"]


@dataclass
class Injected:
    jobs: set[str] = field(default_factory=set)
    crashes: dict[str, int] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    single: set[str] = field(default_factory=set)
    hung: dict[str, tuple[int, float]] = field(default_factory=dict)
    """The gang whose worker's trainer hung: its worker number and its last step's time."""
    slowed: dict[str, tuple[int, str, bool, float]] = field(default_factory=dict)
    """The gang whose worker's device was slowed: its worker number, its node, whether the
    gang's rule moves a straggler, and when (`time.monotonic()`)."""
    reported: dict[str, tuple[int]] = field(default_factory=dict)
    """Gangs whose straggler is only reported: recovered once the worker is named."""
    after: Callable[[], Awaitable[str | None]] | None = None
    """Undoes a lasting fault once the gangs recovered under it (overload, endpoint); may say
    what the fault did meanwhile."""
    note: str = ""

    @property
    def infra(self) -> bool:
        return not self.crashes and not self.failing

    def crashed(self, job: str, n: int = 1) -> None:
        self.jobs.add(job)
        self.crashes[job] = self.crashes.get(job, 0) + n


Injector = Callable[[World, random.Random], Awaitable[Injected]]


def _job(w: World, rng: random.Random) -> str:
    return rng.choice(sorted(g.name for g in w.gangs.values()))


def _rank(w: World, job: str, rng: random.Random, avoid: frozenset[int] = frozenset()) -> int:
    return rng.choice(sorted(set(w.workers(job)) - avoid))


async def _crash(w: World, job: str, rank: int, code: int = RETRIABLE_CODE) -> None:
    await w.sim.crash(w.workers(job)[rank], code)


def _crash_soon(w: World, job: str, rank: int) -> asyncio.Task[None]:
    """The crash as a task: in `Pod` mode it lasts the whole simulated pod restart."""
    return asyncio.create_task(_crash(w, job, rank))


async def _bumped(w: World, job: str, epoch: int) -> bool:
    return await wait(lambda: w.observer.facts(job).epoch > epoch, STEP_TIMEOUT)


async def crash(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    await _crash(w, job, rank)
    i = Injected(single={job}, note=f"{job} rank {rank}")
    i.crashed(job)
    return i


async def crash_fatal(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    await _crash(w, job, rank, FATAL_CODE)
    return Injected(jobs={job}, failing={job}, note=f"{job} rank {rank} exit {FATAL_CODE}")


async def crash_three(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    ranks = rng.sample(sorted(w.workers(job)), 3)
    await asyncio.gather(*(_crash(w, job, r) for r in ranks))
    i = Injected(single={job}, note=f"{job} ranks {sorted(ranks)}")
    i.crashed(job, 3)
    return i


async def crash_during_restart(w: World, rng: random.Random) -> Injected:
    """A second failure while the gang restarts: `Pod` mode, a worker already arrived at the
    new epoch restarts again before the barrier opens; `Process` mode (no trainer runs before
    the barrier), the first trainer run of the new epoch crashes at once."""
    job = _job(w, rng)
    epoch = w.observer.facts(job).epoch
    first = _rank(w, job, rng)
    task = _crash_soon(w, job, first)
    await _bumped(w, job, epoch)
    workers = w.workers(job)

    def arrived() -> str | None:
        for rank, name in workers.items():
            wk = w.sim.workers.get(name)
            if rank == first or wk is None or wk.agent is None:
                continue
            st = wk.agent.state
            if st.epoch == epoch + 1 and st.step is Step.AT_BARRIER:
                return name
        return None

    await wait(lambda: arrived() is not None or w.observer.facts(job).barrier == epoch + 1, 30)
    second = arrived() or workers[_rank(w, job, rng, frozenset({first}))]
    await w.sim.crash(second, RETRIABLE_CODE)
    await task
    i = Injected(note=f"{job} rank {first}, then {second}")
    i.crashed(job, 2)
    return i


def _lose(w: World, node: str) -> set[str]:
    """The simulation's side of a node's death: every agent on it falls silent."""
    w.checker.lost_nodes.add(node)
    jobs = set()
    for name, pod in list(w.sim.pods.items()):
        if pod["spec"].get("nodeName") == node:
            w.sim.lose(name)
            jobs.add(pod["metadata"]["labels"].get("gangjob.io/name", ""))
    return {j for j in jobs if any(g.name == j for g in w.gangs.values())}


async def node_lost(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    node = w.node_of(w.workers(job)[_rank(w, job, rng)])
    jobs = _lose(w, node)
    await lose_node(w.kube, node)
    await w.add_node()  # the capacity back, as a repaired or new node would bring
    return Injected(jobs=jobs, single=jobs, note=f"{node} ({', '.join(sorted(jobs))})")


async def node_lost_during_restart(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    epoch = w.observer.facts(job).epoch
    first = _rank(w, job, rng)
    task = _crash_soon(w, job, first)
    await _bumped(w, job, epoch)
    node = w.node_of(w.workers(job)[_rank(w, job, rng, frozenset({first}))])
    jobs = _lose(w, node)
    await lose_node(w.kube, node)
    await task
    await w.add_node()
    i = Injected(jobs=jobs | {job}, note=f"{job} rank {first}, then {node}")
    i.crashed(job)
    i.single = jobs - {job}
    return i


async def device_unhealthy(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    name = w.workers(job)[_rank(w, job, rng)]
    pod = await w.kube.get(PODS, name, w.ns)
    status: JsonDict = pod["status"]
    for c in status.get("containerStatuses", []):
        if c["name"] == "trainer":
            c["allocatedResourcesStatus"] = [
                {
                    "name": "nvidia.com/gpu",
                    "resources": [{"resourceID": "gpu-0", "health": "Unhealthy"}],
                }
            ]
    await w.kube.patch_status(PODS, name, {"status": status}, w.ns)
    await w.add_node()  # the gang keeps off the bad node from now on
    return Injected(jobs={job}, single={job}, note=f"{name} on {pod['spec'].get('nodeName')}")


async def hang(w: World, rng: random.Random) -> Injected:
    """A `Process`-mode worker's trainer stops reporting its steps and keeps running (only the
    stand-in trainers report). A `Hang` counts against the budget as a crash does."""
    job = rng.choice(sorted(g.name for g in w.gangs.values() if g.shape.mode == "Process"))
    rank = _rank(w, job, rng)
    name = w.workers(job)[rank]

    def reported() -> bool:
        wk = w.sim.workers.get(name)
        return wk is not None and wk.trainer is not None and wk.trainer.step is not None

    await wait(reported, STEP_TIMEOUT)
    run = w.sim.hang(name)
    if run.reported_at is None:
        raise RuntimeError(f"{name}'s trainer never reported a step")
    i = Injected(single={job}, hung={job: (rank, run.reported_at)},
                 note=f"{job} rank {rank} at step {run.step}")  # fmt: skip
    i.crashed(job)
    return i


SUMMARISED_TIMEOUT = 100.0
"""How long `slow-device` waits for every agent of its gang to have told its compute."""
SLOW_FACTOR = 3.0
"""How many times its healthy compute a slowed device's trainer takes (`slow-device`)."""


async def slow_device(w: World, rng: random.Random) -> Injected:
    """A `Process`-mode worker's device runs slow: its trainer computes `SLOW_FACTOR` times as
    long per step, and its gang steps at its pace. A gang whose rule moves stragglers recreates
    it off its node (one restart, not counted); another names it and runs on, and the device
    recovers once it was named (`after`)."""
    job = rng.choice(sorted(g.name for g in w.gangs.values() if g.shape.mode == "Process"))
    gang = next(g for g in w.gangs.values() if g.name == job)
    # Every agent has told its compute at this epoch: a slowdown shows as a shift at once. Its
    # first summary comes within a period (30 s) of the barrier, and a failed one (the
    # controller away, after a control-plane fault) is tried again a period later.
    if not await wait(lambda: w.summarised(job), SUMMARISED_TIMEOUT):
        raise RuntimeError(f"{job}'s agents sent no summary of their compute")
    rank = _rank(w, job, rng)
    name = w.workers(job)[rank]
    node = w.node_of(name)
    moves = gang.shape.move_stragglers
    w.checker.expect_straggler(job, rank)
    at = time.monotonic()
    w.sim.slow(name, SLOW_FACTOR)
    i = Injected(
        jobs={job}, single={job} if moves else set(), slowed={job: (rank, node, moves, at)},
        note=f"{name} on {node} ({'moved' if moves else 'reported'})",
    )  # fmt: skip
    if moves:
        await w.add_node()  # the gang keeps off the slow node from now on
        return i
    i.reported[job] = (rank,)

    async def recover() -> str:
        w.sim.slow(name, 1.0)
        ok = await wait(lambda: not w.checker.listed(job, rank), STEP_TIMEOUT)
        return "its device recovered, no longer named" if ok else "STILL named once recovered"

    i.after = recover
    return i


async def _kill_leader(w: World) -> str:
    """SIGKILL of the replica holding the Lease; the supervisor starts it again."""
    leader = w.leader()
    if leader is None:
        return "no leader known"
    pid = leader.proc.pid if leader.proc else None
    leader.kill()
    return f"leader pid {pid}"


def _kill_at(step: str) -> Injector:
    async def inject(w: World, rng: random.Random) -> Injected:
        job = _job(w, rng)
        epoch = w.observer.facts(job).epoch
        rank = _rank(w, job, rng)
        task = _crash_soon(w, job, rank)
        if step == "epoch":
            await _bumped(w, job, epoch)
        elif step == "arrival":
            workers = list(w.workers(job).values())

            def arriving() -> bool:
                for name in workers:
                    wk = w.sim.workers.get(name)
                    st = wk.agent.state if wk is not None and wk.agent is not None else None
                    if st is not None and st.epoch == epoch + 1 and st.step is Step.AT_BARRIER:
                        return True
                return w.observer.facts(job).barrier == epoch + 1

            await wait(arriving, STEP_TIMEOUT)
        else:
            await wait(lambda: w.observer.facts(job).barrier == epoch + 1, STEP_TIMEOUT)
        killed = await _kill_leader(w)
        await task
        i = Injected(single={job}, note=f"{job} rank {rank}; {killed}")
        i.crashed(job)
        return i

    return inject


async def leader_failover(w: World, rng: random.Random) -> Injected:
    """The leader killed and kept down until the other replica holds the Lease; then a crash
    that the new leader must restart."""
    old = w.leader_index
    if old is None:
        await wait(lambda: w.leader_index is not None, STEP_TIMEOUT)
        old = w.leader_index
    assert old is not None
    w.held.add(old)
    w.replicas[old].kill()
    took = await wait(lambda: w.leader_index not in (None, old), STEP_TIMEOUT)
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    await _crash(w, job, rank)

    async def release() -> None:
        w.held.discard(old)
        return None

    i = Injected(
        single={job},
        after=release,
        note=f"{job} rank {rank}; replica {old} killed, standby took over: {took}",
    )
    i.crashed(job)
    return i


async def apiserver_restart(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    task = _crash_soon(w, job, rank)
    await w.restart_component("kube-apiserver")
    await task
    i = Injected(single={job}, note=f"{job} rank {rank}")
    i.crashed(job)
    return i


async def etcd_stop(w: World, rng: random.Random) -> Injected:
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    task = _crash_soon(w, job, rank)
    await w.restart_component("etcd", None, ETCD_DOWN_SECONDS)
    await task
    i = Injected(single={job}, note=f"{job} rank {rank}; etcd down {ETCD_DOWN_SECONDS:g}s")
    i.crashed(job)
    return i


async def apiserver_overload(w: World, rng: random.Random) -> Injected:
    before = w.cluster.command_of("kube-apiserver")
    low = [
        a
        for a in before
        if not a.startswith(("--max-requests-inflight=", "--max-mutating-requests-inflight="))
    ]
    await w.restart_component("kube-apiserver", low + OVERLOAD_FLAGS)
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    await _crash(w, job, rank)

    async def restore() -> str:
        # Read before the restart that restores the flags resets the apiserver's counters.
        metrics = str(await asyncio.to_thread(w.cluster.api, "GET", "/metrics", None, 30.0))
        await w.restart_component("kube-apiserver", before)
        return f"{too_many(metrics)} requests answered 429"

    i = Injected(single={job}, after=restore, note=f"{job} rank {rank}; {' '.join(OVERLOAD_FLAGS)}")
    i.crashed(job)
    return i


def too_many(metrics: str) -> int:
    """Requests the apiserver answered 429, from its Prometheus text."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("apiserver_request_total{") and 'code="429"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def endpoint_lost(w: World, rng: random.Random) -> Injected:
    await w.proxy.cut()
    job = _job(w, rng)
    rank = _rank(w, job, rng)
    await _crash(w, job, rank)

    async def restore() -> None:
        await w.proxy.restore()
        return None

    i = Injected(single={job}, after=restore, note=f"{job} rank {rank}")
    i.crashed(job)
    return i


INJECTORS: dict[str, Injector] = {
    "crash": crash,
    "crash-fatal": crash_fatal,
    "crash-three": crash_three,
    "crash-during-restart": crash_during_restart,
    "node-lost": node_lost,
    "node-lost-during-restart": node_lost_during_restart,
    "device-unhealthy": device_unhealthy,
    "hang": hang,
    "slow-device": slow_device,
    "controller-kill-after-epoch": _kill_at("epoch"),
    "controller-kill-mid-arrival": _kill_at("arrival"),
    "controller-kill-after-barrier": _kill_at("barrier"),
    "leader-failover": leader_failover,
    "apiserver-restart": apiserver_restart,
    "etcd-stop": etcd_stop,
    "apiserver-overload": apiserver_overload,
    "endpoint-lost": endpoint_lost,
}
