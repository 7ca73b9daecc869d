"""The floors a scale run holds its restarts against, each measured on the running in-place
gang.

floor: the protocol's physical limit in place, with the real pieces and without the controller's
decisions. One GangJob write of `status.epoch` seen by every agent, the kubelet's restart of
every pod (the simulated kubelet's restart delay), every agent's arrival report accepted by the
controller's endpoint, and one write of `status.barrierEpoch` seen by every agent. This process
writes the epoch itself, so no failure is detected, classified or decided on; everything after
that write is the deployed path (the controller's cache fans the write out on the agents' report
streams; the simulated kubelet restarts the pods; the agents report to the endpoint), except that
the time from the last report accepted to the barrier write seen in a watch, the controller's
barrier decision, is not counted.

annotation-floor: N pod annotation patches by a bare client and one GangJob write seen by N
watches of the job (the agent's watch code, one per pod): the least that arrival by annotation
costs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from typing import Any

from agent.apiclient import ApiError
from agent.config import Config
from agent.watch import JobWatcher
from benchmarks.common import Progress
from benchmarks.scale.cluster import World, steady
from benchmarks.scale.cpu import BENCH, CpuSampler
from benchmarks.scale.observer import (
    AgentTally,
    Check,
    CtlSample,
    JobTracker,
    milestones,
    polled,
)
from benchmarks.scale.scenarios import Span, measure_restart, no_collector
from benchmarks.scale.settings import ANNOTATION_FLOOR_CONCURRENCY
from controller.k8s import GANGJOBS

WATCH_WAVE = 100
"""annotation-floor: watches opened at once, before its clock starts."""
FLOOR_SPAN = Span(
    "epoch write->arrived + barrier->open",
    lambda m: [(m["injected"], m["arrived"]), (max(m["barrier"], m["arrived"]), m["open"])],
)
"""floor's seconds: its milestones but the gap from the last report accepted to the barrier
write seen (a poll may see the last arrival after the barrier: no gap then, and no overlap)."""


async def floor(w: World, tracker: JobTracker, rep: int, gang: str) -> dict[str, Any]:
    """One in-place restart of the gang from epoch E to E+1, raised by writing `status.epoch`
    here: milestones `seen` (every agent saw E+1, through its report's stream or its watch),
    `restarted` (every pod restarted in place: its new agent runs), `arrived` (every report at
    E+1 accepted), `barrier` (`barrierEpoch` E+1 seen in this process's watch), `open` (every
    agent saw the barrier open)."""
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    before = {name: wk.agent for name, wk in w.s.workers.items()}

    def saw() -> int:
        """Agents of epoch E that saw E+1 (what they saw last stays with them once ended)."""
        return sum(
            1 for agent in before.values()
            if agent is not None and agent.job is not None and agent.job.epoch >= e1
        )  # fmt: skip

    def restarted() -> int:
        """Pods whose agent of epoch E has been replaced by a new one."""
        return sum(
            1 for name, agent in before.items()
            if (wk := w.s.workers.get(name)) is not None and wk.agent not in (None, agent)
        )  # fmt: skip

    async def write_epoch() -> None:
        await w.kube.patch_status(GANGJOBS, gang, {"status": {"epoch": e1}}, w.ns)

    checks: dict[str, Check] = {
        "seen": polled(lambda: saw() == n),
        "restarted": polled(lambda: restarted() == n),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }
    row = await measure_restart(
        w, tracker, "floor", rep, write_epoch, checks,
        ["seen", "restarted", "arrived", "barrier", "open"], w.timeout(0.2),
        lambda: f"{saw()}/{n} saw epoch {e1}, {restarted()}/{n} restarted, "
        f"{tally.arrived()}/{n} arrived, "
        f"{tally.opened()}/{n} open",
        span=FLOOR_SPAN,
    )  # fmt: skip
    await steady(w, tracker, e1)
    return row


def all_read(watchers: list[JobWatcher]) -> bool:
    return all(jw.state is not None for jw in watchers)


async def annotation_floor(w: World, tracker: JobTracker, rep: int, gang: str) -> dict[str, Any]:
    """N pod annotation patches and one GangJob write seen by N watches of the job, by a bare
    client (the same shared HTTP client the agents use): what arrival by annotation costs at
    the least. The watches are the agent's own code (`JobWatcher`), one per pod, as agents
    arriving by annotation hold them; agents reporting to the endpoint hold none, so the floor
    opens its own (before the clock starts)."""
    names = list(w.s.pods)
    slots = asyncio.Semaphore(ANNOTATION_FLOOR_CONCURRENCY)
    path = f"/api/v1/namespaces/{w.ns}/pods"
    body = {"metadata": {"annotations": {"bench.gangjob.io/floor": str(rep)}}}
    progress = Progress(f"N={w.n} annotation-floor #{rep + 1}")
    done = 0
    quiet = logging.LoggerAdapter(logging.getLogger("agent"), {})
    watchers = [
        JobWatcher(w.api, Config(job_name=gang, pod_name=name, namespace=w.ns), quiet)
        for name in names
    ]
    watching: list[asyncio.Task[None]] = []

    async def one(name: str) -> None:
        nonlocal done
        async with slots:
            for _ in range(20):
                try:
                    await w.api.merge_patch(f"{path}/{name}", body)
                    break
                except ApiError as e:
                    if e.status not in (409, 429, 500, 503, 504):
                        raise
                    await asyncio.sleep(0.1)
            done += 1
            progress.tick(f"{done}/{len(names)} patched")

    n = w.n
    try:
        # In waves: 5000 lists and watches at once swamp the apiserver for minutes, long
        # enough on a loaded machine for KWOK's node heartbeats to lapse (nodes lost).
        opening = Progress(f"N={w.n} annotation-floor #{rep + 1} opening watches")
        for i in range(0, n, WATCH_WAVE):
            wave = watchers[i : i + WATCH_WAVE]
            watching += [asyncio.create_task(jw.run()) for jw in wave]
            await milestones(
                {"watching": polled(functools.partial(all_read, wave))}, w.timeout(0.05),
                opening, lambda: f"{sum(jw.state is not None for jw in watchers)}/{n} read the job",
            )  # fmt: skip
        before = CtlSample.take(w.ctl)
        async with no_collector(), CpuSampler.running(w.cpu_pids()) as sampler:
            t0 = time.monotonic()
            await asyncio.gather(*(one(n) for n in names))
            t1 = time.monotonic()
            obj = await w.kube.patch(GANGJOBS, gang, body, w.ns)
            rv = int(obj["metadata"]["resourceVersion"])

            def seen() -> int:
                return sum(
                    1 for jw in watchers
                    if jw.state is not None and int(jw.state.resource_version or 0) >= rv
                )  # fmt: skip

            marks = await milestones(
                {"seen": polled(lambda: seen() == n)}, w.timeout(0.05), progress,
                lambda: f"{seen()}/{n} watches saw the write",
            )  # fmt: skip
        after = CtlSample.take(w.ctl)
    finally:
        for task in watching:
            task.cancel()
        await asyncio.gather(*watching, return_exceptions=True)
    seconds = round(marks["seen"] - t0, 3)
    cpu = sampler.spent([(t0, marks["seen"])])
    bench = cpu.get(BENCH)
    row = {
        "mode": "annotation-floor",
        "rep": rep,
        "seconds": seconds,
        "span": "patches->seen",
        "steps": {
            "pod-patches": round(t1 - t0, 3),
            "job-write->seen-by-all": round(marks["seen"] - t1, 3),
        },
        "cpu_s": cpu,
        "bench_cpu_s": bench,
        "seconds_minus_bench_cpu": None if bench is None else round(seconds - bench, 3),
        "controller": after.since(before),
    }
    print(f"  N={w.n} annotation-floor #{rep + 1}: {row['seconds']:.2f}s {row['steps']}",
          file=sys.stderr)  # fmt: skip
    return row
