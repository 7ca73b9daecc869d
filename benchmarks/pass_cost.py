"""The CPU of one reconcile pass over a `Process` gang of N during a restart, without a
cluster, for each kind of pass a restart runs:

- `bump`: a gang running at epoch 1, every agent arrived there, one trainer's exit reported:
  the pass that raises the epoch (the failure's share of the controller's);
- `refresh`: the epoch raised, its barrier shut, N/2 reports coming in over the timed passes,
  each pass joining new ones: the passes that only refresh the arrived counts;
- `barrier`: every agent has reported the restart (a new incarnation at epoch 1): the pass
  that opens the barrier (the last arrival's share).

    python -m benchmarks.pass_cost [--workers 5000] [--passes 5] [--kind all] [--profile]

The real `Reconciler` over real informer caches (`Store`, with the controller's transforms)
filled with N worker pods and the GangJob, and a real `ArrivalBook`; the status write answers
at once, and is not fed back to the cache, so every timed `bump` or `barrier` pass decides the
same again. Prints the CPU (process time) per pass, the median of `--passes`: observe + plan +
act's bookkeeping, the part of a pass that holds the event loop. `--profile` prints cProfile's
top functions (the times are then cProfile's).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from typing import Any, cast

from api.v1alpha1 import dump_status
from controller.arrivals.book import ArrivalBook, Report
from controller.k8s import GANGJOBS, NODES, PODS, SERVICES, JsonDict
from controller.k8s.store import BY_GANGJOB, BY_NODE, Store, gangjob_index, node_index
from controller.k8s.transforms import strip_managed_fields, trim_node, trim_pod
from controller.policy.plan import PlanConfig
from controller.reconcile import Caches, Reconciler
from tests.unit.builders import job_dict, make_node
from tests.unit.gangs import running_status, worker

NODE_COUNT = 500
KINDS = ("bump", "refresh", "barrier")


class _Api:
    """Answers the pass's writes at once, and keeps the last status written."""

    version = 1000
    status: JsonDict | None = None

    async def patch_status(self, kind: Any, name: str, body: Any, ns: Any = None) -> JsonDict:
        self.version += 1
        self.status = body.get("status")
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}

    async def create(self, *args: Any, **kw: Any) -> JsonDict:
        return {}


class Setup:
    """A reconciler over caches of a `Process` gang of N, before the pass of `kind`."""

    def __init__(self, n: int, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        self.api = _Api()
        api = cast(Any, self.api)
        jobs = Store(api, GANGJOBS, transform=strip_managed_fields)
        indexers = {BY_GANGJOB: gangjob_index, BY_NODE: node_index}
        pods = Store(api, PODS, indexers=indexers, transform=trim_pod)
        nodes = Store(api, NODES, transform=trim_node)
        services = Store(api, SERVICES)
        # Running at epoch 1 (bump), or restarting to it from 0 (refresh, barrier).
        running = dump_status(running_status(epoch=1 if kind == "bump" else 0))
        status = running | {"epoch": 1, "mode": "Process"}
        job = job_dict(n, status=status, restart={"mode": "Process"})
        job["metadata"]["resourceVersion"] = "10"
        jobs.replace([job], "10")
        self.workers: list[JsonDict] = []
        for rank in range(n):
            pod = worker(rank, 0, node=f"node-{rank % NODE_COUNT}")
            pod["metadata"]["resourceVersion"] = str(100 + rank)
            pod["metadata"]["annotations"]["gangjob.io/restart-mode"] = "Process"
            self.workers.append(pod)
        pods.replace(self.workers, "10")
        made = [make_node(f"node-{i}") for i in range(NODE_COUNT)]
        for i, node in enumerate(made):
            node["metadata"] |= {"uid": f"n{i}", "resourceVersion": "1"}
        nodes.replace(made, "10")
        meta = job["metadata"]
        service = {"metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": "s"}}
        services.replace([service], "10")
        self.book = ArrivalBook()
        caches = Caches(jobs, pods, nodes, services)
        self.reconciler = Reconciler(api, caches, arrivals=self.book, config=PlanConfig())
        self.reconciler.progress_interval = 0.0
        self.key = f"{meta['namespace']}/{meta['name']}"
        self.reported = 0
        if kind == "refresh":
            return
        # Every agent arrived at epoch 0, then (restarted: a new incarnation) at epoch 1.
        for pod in self.workers:
            self.report(pod, Report(pod["metadata"]["uid"], 0, incarnation="old"))
            self.report(pod, Report(pod["metadata"]["uid"], 1, incarnation="new"))
        if kind == "bump":
            failed = self.workers[n // 2]
            self.report(failed, Report(failed["metadata"]["uid"], 1, (1, 1), incarnation="new"))

    def report(self, pod: JsonDict, report: Report) -> None:
        meta = pod["metadata"]
        self.book.record(meta["namespace"], meta["name"], report, job=self.key)

    def report_more(self, count: int) -> None:
        """The next `count` workers report arriving at epoch 1 (`refresh`)."""
        for pod in self.workers[self.reported : self.reported + count]:
            self.report(pod, Report(pod["metadata"]["uid"], 1, incarnation="bench"))
        self.reported += count


async def measure(n: int, kind: str, passes: int, profile: bool = False) -> tuple[float, Setup]:
    """The median CPU seconds of `passes` passes of `kind` (`refresh`: each after N/(2*passes)
    new reports), and the setup, its last status written."""
    setup = Setup(n, kind)
    batch = max(1, n // (2 * passes))

    async def one() -> float:
        if kind == "refresh":
            setup.report_more(batch)
        started = time.process_time()
        out = await setup.reconciler.reconcile(setup.key)
        if out.created or out.deleted:
            raise RuntimeError("the gang must restart in place, with nothing to create or delete")
        return time.process_time() - started

    await one()  # the first pass parses every pod's view
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    spent = [await one() for _ in range(passes)]
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return statistics.median(spent), setup


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=5000)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--kind", choices=(*KINDS, "all"), default="all")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    for kind in KINDS if a.kind == "all" else (a.kind,):
        per_pass, _ = asyncio.run(measure(a.workers, kind, a.passes, a.profile))
        print(f"N={a.workers}: CPU per {kind} pass {per_pass * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
