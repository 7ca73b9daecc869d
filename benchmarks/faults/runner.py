"""A campaign from end to end: the world up and every gang at its first open barrier, then each
fault of the seeded schedule in turn (injected, the touched gangs waited for until they recover
or the bound passes, the outcome checked), the final checks, the results."""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.faults.inject import INJECTORS, Injected
from benchmarks.faults.observer import INVARIANTS, Checker, FaultOutcome, JobFacts, Violation
from benchmarks.faults.schedule import KINDS, schedule
from benchmarks.faults.world import (
    HANG_SECONDS,
    STRAGGLER,
    Shape,
    World,
    ensure_cluster,
    open_world,
    wait,
)
from controller.k8s import Kube

FULL_SHAPES = [
    Shape("pa", "Pod", 3),
    Shape("pb", "Process", 4, move_stragglers=True),
    Shape("pc", "Pod", 8),
    Shape("pd", "Process", 16),
]
SHORT_SHAPES = [Shape("pa", "Pod", 3), Shape("pb", "Process", 4, move_stragglers=True)]


@dataclass(frozen=True)
class Settings:
    seed: int
    faults: int
    cluster: str
    shapes: list[Shape]
    restart_delay: float = 0.5
    """The simulated kubelet's whole-pod restart (the real one: ~2 s)."""
    recovery_bound: float = 120.0
    """A touched gang must be back at an open barrier (or Failed) this long after its fault."""
    terminating_bound: float = 60.0
    """No pod Terminating longer: the force-delete guard's 2 s plus a controller's failover
    (the Lease's 15 s) and an apiserver restart."""
    hang_bound: float = HANG_SECONDS + 5.0
    """A hung trainer's last step to its gang's epoch raised, at most: `hangSeconds`, the
    agent's 1 s poll (once to see the last step, once to see the stall), the controller's
    1 s wait for the gang's other stalls, its pass, and the observer's watch."""
    straggler_bound: float = STRAGGLER["forSeconds"] + 35.0
    """A slowed device to its worker named, at most: the agent's shift (3 polls, and not
    sooner than 10 s after its previous summary), forSeconds, the controller's pass and its
    write (5 s apart at most), and the observer's watch."""
    lease_duration: float = 15.0
    """The controllers' `--leader-elect-lease-duration` (the renew deadline is 2/3 of it, the
    retry period at most 2 s): what a failover waits for."""
    logs: Path | None = None
    kinds: list[str] | None = None
    """Only these fault kinds (default: all)."""
    keep: bool = False
    """Leave a cluster this run started up."""


@dataclass
class FaultRow:
    index: int
    kind: str
    note: str
    recovered: bool
    seconds: float
    start: float
    """`time.monotonic()` when it was injected."""
    violations: list[Violation] = field(default_factory=list)


@dataclass
class Result:
    settings: Settings
    rows: list[FaultRow]
    violations: list[Violation]
    seconds: float
    revived: list[str] = field(default_factory=list)
    """Control-plane processes that exited on their own during the run and were restarted."""
    collateral: list[tuple[str, int, str]] = field(default_factory=list)
    """`Checker.collateral`: restarts for nodes the control-plane faults made NotReady."""

    @property
    def ok(self) -> bool:
        return not self.violations and all(r.recovered for r in self.rows)

    def by_kind(self) -> list[dict[str, Any]]:
        out = []
        for kind in KINDS:
            rows = [r for r in self.rows if r.kind == kind]
            if not rows:
                continue
            times = sorted(r.seconds for r in rows if r.recovered)
            out.append(
                {
                    "kind": kind,
                    "injected": len(rows),
                    "recovered": sum(r.recovered for r in rows),
                    "median": statistics.median(times) if times else None,
                    "p90": times[min(len(times) - 1, int(0.9 * len(times)))] if times else None,
                    "violations": sum(len(r.violations) for r in rows),
                }
            )
        return out


async def run(settings: Settings) -> Result:
    print(
        f"fault campaign: seed {settings.seed}, {settings.faults} faults, cluster "
        f"{settings.cluster!r}",
        file=sys.stderr,
        flush=True,
    )
    plan = schedule(settings.seed, settings.faults, settings.kinds)
    rng = random.Random(settings.seed)
    cluster, started = await asyncio.to_thread(ensure_cluster, settings.cluster)
    logs = settings.logs or Path(tempfile.mkdtemp(prefix="gangjob-faults-"))
    logs.mkdir(parents=True, exist_ok=True)
    checker = Checker(
        settings.terminating_bound, settings.recovery_bound, settings.hang_bound,
        settings.straggler_bound,
    )  # fmt: skip
    t_start = time.monotonic()
    rows: list[FaultRow] = []
    revived: list[str] = []
    async with (
        await Kube.from_kubeconfig(cluster.kubeconfig, request_timeout=20) as kube,
        await Kube.from_kubeconfig(cluster.kubeconfig, request_timeout=20) as observer_kube,
    ):
        nodes = sum(s.replicas for s in settings.shapes) // 6 + 3
        w = await open_world(
            cluster,
            kube,
            observer_kube,
            checker,
            settings.shapes,
            nodes,
            settings.restart_delay,
            logs,
            settings.lease_duration,
        )
        print(f"namespace {w.ns}; controller logs in {logs}", file=sys.stderr, flush=True)
        try:
            if not await wait(lambda: all(w.steady(g.name) for g in w.gangs.values()), 300):
                raise RuntimeError(f"the gangs never all ran: {_states(w)}")
            for index, kind in enumerate(plan):
                rows.append(await one_fault(w, rng, index, kind, settings))
            await w.observer.final()
        finally:
            revived = w.revived
            await w.close()
            if started and not settings.keep:
                await asyncio.to_thread(cluster.down, sys.stderr)
    result = Result(
        settings, rows, checker.violations, time.monotonic() - t_start, revived,
        checker.collateral,
    )  # fmt: skip
    for row in rows:
        row.violations = [v for v in checker.violations if _window(rows, row, v)]
    return result


def _window(rows: list[FaultRow], row: FaultRow, v: Violation) -> bool:
    """The violation fell within this fault's time (its start to the next one's)."""
    starts = [r.start for r in rows]
    i = rows.index(row)
    end = starts[i + 1] if i + 1 < len(starts) else float("inf")
    return bool(starts[i] <= v.at < end)


def _stuck(w: World, jobs: list[str]) -> str:
    """Where each worker of the gangs that did not recover stands: for the investigation."""
    lines = []
    for job in jobs:
        for rank, name in sorted(w.workers(job).items()):
            wk = w.sim.workers.get(name)
            pod = w.sim.pods.get(name, {})
            notes = {k: v for k, v in (pod["metadata"].get("annotations") or {}).items()
                     if k.startswith("gangjob.io/")} if pod else {}  # fmt: skip
            state = wk.agent.state if wk is not None and wk.agent is not None else None
            events = wk.events[-3:] if wk is not None else []
            lines.append(f"    {name} rank {rank}: agent {state}; {notes}; {events}")
    return "\n".join(lines)


def _states(w: World) -> str:
    out = []
    for g in w.gangs.values():
        facts = w.observer.facts(g.name)
        opened = w.agents_open(g.name, facts.epoch)
        out.append(f"{g.name}: {facts} {opened}/{g.shape.replicas} open")
    return "; ".join(out)


async def one_fault(
    w: World, rng: random.Random, index: int, kind: str, settings: Settings
) -> FaultRow:
    # Each fault starts from a steady world: every gang at an open barrier, and a replica
    # leading (a kill after the barrier leaves the gangs running while the Lease runs out).
    def quiet() -> bool:
        leader = w.leader()
        steady = all(w.steady(g.name) for g in w.gangs.values())
        return steady and leader is not None and leader.alive()

    await wait(quiet, settings.recovery_bound)
    seen, seen_collateral = len(w.checker.violations), len(w.checker.collateral)
    seen_hangs = len(w.checker.hang_detections)
    seen_stragglers = len(w.checker.straggler_detections)
    before = {g.name: w.observer.facts(g.name) for g in w.gangs.values()}
    t0 = time.monotonic()
    try:
        injected: Injected = await INJECTORS[kind](w, rng)
    except Exception as e:  # the campaign's own step failed: reported, and the run goes on
        print(f"[{index + 1}] {kind}: injection failed: {e!r}", file=sys.stderr, flush=True)
        return FaultRow(index, kind, f"injection failed: {e!r}", False, 0.0, t0)
    jobs = sorted(injected.jobs)

    def recovered() -> bool:
        # Every fault restarts each gang it touched: back at an open barrier of a later epoch;
        # but a straggler only reported restarts nothing: its gang named it and runs on.
        def back(j: str) -> bool:
            if j in injected.failing:
                return w.failed(j)
            if j in injected.reported:
                return w.steady(j) and w.checker.named(j, *injected.reported[j])
            return w.steady(j) and w.observer.facts(j).epoch > before.get(j, JobFacts()).epoch

        return all(back(j) for j in jobs)

    ok = await wait(recovered, settings.recovery_bound)
    seconds = time.monotonic() - t0
    after = {j: w.observer.facts(j) for j in jobs}
    if injected.after is not None:
        said = await injected.after()
        injected.note += f"; {said}" if said else ""
    w.checker.fault_done(
        time.monotonic(),
        FaultOutcome(
            kind,
            tuple(jobs),
            {j: before.get(j, JobFacts()) for j in jobs},
            after,
            ok,
            crashes=injected.crashes,
            failing=frozenset(injected.failing),
            single=frozenset(injected.single),
            infra=injected.infra,
            hung=injected.hung,
            slowed=injected.slowed,
        ),
    )
    if not ok:
        print(_stuck(w, jobs), file=sys.stderr, flush=True)
    status = f"recovered in {seconds:.1f}s" if ok else f"NOT recovered in {seconds:.0f}s"
    print(
        f"[{index + 1}] {kind}: {injected.note}: {status}{'' if ok else ' — ' + _states(w)}",
        file=sys.stderr,
        flush=True,
    )
    for job, epoch, took in w.checker.hang_detections[seen_hangs:]:
        print(f"  {job}: epoch {epoch} raised {took:.1f}s after the hung trainer's last step "
              f"(bound {w.checker.hang_bound:g}s)", file=sys.stderr)  # fmt: skip
    for job, worker, took in w.checker.straggler_detections[seen_stragglers:]:
        print(f"  {job}: worker {worker} named a straggler {took:.1f}s after its device slowed "
              f"(forSeconds {STRAGGLER['forSeconds']})", file=sys.stderr)  # fmt: skip
    for job, epoch, node in w.checker.collateral[seen_collateral:]:
        print(f"  collateral: {job} epoch {epoch}: node {node} lost, not by the campaign",
              file=sys.stderr)  # fmt: skip
    # As they are found, not only in the report: a long run's first one is worth a look at once.
    for v in w.checker.violations[seen:]:
        print(f"  VIOLATION {v.invariant} {v.job}: {v.detail}", file=sys.stderr, flush=True)
        # The kubelet's side of it: what each of the gang's pods went through, latest last.
        for rank, name in sorted(w.workers(v.job).items()):
            wk = w.sim.workers.get(name)
            if wk is not None:
                print(f"    {rank} {name}: {'; '.join(wk.events[-4:])}", file=sys.stderr)
    for job in jobs:
        gang = next((g for g in w.gangs.values() if g.name == job), None)
        if gang is not None and (job in injected.failing or not w.steady(job)):
            await w.replace_gang(gang)
    return FaultRow(index, kind, injected.note, ok, seconds, t0)


__all__ = ["FULL_SHAPES", "INVARIANTS", "SHORT_SHAPES", "Result", "Settings", "run"]
