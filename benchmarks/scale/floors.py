"""The floor: what the protocol cannot avoid, measured by a bare client on a running gang, as
the reference its restarts are held against."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from agent.apiclient import ApiError
from benchmarks.common import Progress
from benchmarks.scale.cluster import World
from benchmarks.scale.observer import CtlSample, JobTracker, milestones, polled
from benchmarks.scale.settings import FLOOR_CONCURRENCY
from controller.k8s import GANGJOBS


async def floor(w: World, tracker: JobTracker, rep: int, gang: str) -> dict[str, Any]:
    """The physical reference: N pod annotation patches and one GangJob write seen by N
    watchers, by a bare client (the same shared HTTP client the agents use)."""
    names = list(w.s.pods)
    slots = asyncio.Semaphore(FLOOR_CONCURRENCY)
    path = f"/api/v1/namespaces/{w.ns}/pods"
    body = {"metadata": {"annotations": {"bench.gangjob.io/floor": str(rep)}}}
    progress = Progress(f"N={w.n} floor #{rep + 1}")
    done = 0

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

    before = CtlSample.take(w.ctl)
    t0 = time.monotonic()
    await asyncio.gather(*(one(n) for n in names))
    t1 = time.monotonic()
    obj = await w.kube.patch(GANGJOBS, gang, body, w.ns)
    rv = int(obj["metadata"]["resourceVersion"])
    n = w.n

    def seen() -> int:
        return sum(
            1 for wk in w.s.workers.values()
            if wk.agent is not None and wk.agent.job is not None
            and int(wk.agent.job.resource_version or 0) >= rv
        )  # fmt: skip

    marks = await milestones(
        {"seen": polled(lambda: seen() == n)}, w.timeout(0.05), progress,
        lambda: f"{seen()}/{n} agents saw the write",
    )  # fmt: skip
    after = CtlSample.take(w.ctl)
    row = {
        "mode": "floor",
        "rep": rep,
        "seconds": round(marks["seen"] - t0, 3),
        "steps": {
            "pod-patches": round(t1 - t0, 3),
            "job-write->seen-by-all": round(marks["seen"] - t1, 3),
        },
        "controller": after.since(before),
    }
    print(f"  N={w.n} floor #{rep + 1}: {row['seconds']:.2f}s {row['steps']}", file=sys.stderr)
    return row
