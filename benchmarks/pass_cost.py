"""The CPU of one reconcile pass over a `Process` gang of N in the middle of a restart, without a
cluster: what each arrival-refreshing pass and the barrier's own pass cost the controller.

    python -m benchmarks.pass_cost [--workers 5000] [--passes 5] [--profile]

The real `Reconciler` over real informer caches (`Store`, with the controller's transforms)
filled with N worker pods at epoch 0 and a GangJob at epoch 1 whose barrier is shut; an
`ArrivalBook` gets N/2 reports over the timed passes, so each pass joins new reports as during
a restart; the status write answers at once. Prints the CPU (process time) per pass: observe +
plan + act's bookkeeping, the part of a pass that holds the event loop. `--profile` prints
cProfile's top functions (the times are then cProfile's).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
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


class _Api:
    """Answers the pass's writes at once."""

    version = 1000

    async def patch_status(self, kind: Any, name: str, body: Any, ns: Any = None) -> JsonDict:
        self.version += 1
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}

    async def create(self, *args: Any, **kw: Any) -> JsonDict:
        return {}


def _reconciler(n: int) -> tuple[Reconciler, ArrivalBook, list[JsonDict], str]:
    api = cast(Any, _Api())
    jobs = Store(api, GANGJOBS, transform=strip_managed_fields)
    indexers = {BY_GANGJOB: gangjob_index, BY_NODE: node_index}
    pods = Store(api, PODS, indexers=indexers, transform=trim_pod)
    nodes = Store(api, NODES, transform=trim_node)
    services = Store(api, SERVICES)
    status = dump_status(running_status(epoch=0)) | {"epoch": 1, "mode": "Process"}
    job = job_dict(n, status=status, restart={"mode": "Process"})
    job["metadata"]["resourceVersion"] = "10"
    jobs.replace([job], "10")
    workers = []
    for rank in range(n):
        pod = worker(rank, 0, node=f"node-{rank % NODE_COUNT}")
        pod["metadata"]["resourceVersion"] = str(100 + rank)
        pod["metadata"]["annotations"]["gangjob.io/restart-mode"] = "Process"
        workers.append(pod)
    pods.replace(workers, "10")
    made = [make_node(f"node-{i}") for i in range(NODE_COUNT)]
    for i, node in enumerate(made):
        node["metadata"] |= {"uid": f"n{i}", "resourceVersion": "1"}
    nodes.replace(made, "10")
    meta = job["metadata"]
    service = {"metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": "s"}}
    services.replace([service], "10")
    book = ArrivalBook()
    caches = Caches(jobs, pods, nodes, services)
    reconciler = Reconciler(api, caches, arrivals=book, config=PlanConfig())
    reconciler.progress_interval = 0.0
    return reconciler, book, workers, f"{meta['namespace']}/{meta['name']}"


async def measure(n: int, passes: int, profile: bool) -> float:
    """CPU seconds per pass, over `passes` passes each after N/(2*passes) new reports."""
    reconciler, book, workers, key = _reconciler(n)
    batch = max(1, n // (2 * passes))
    reported = 0

    async def one() -> float:
        nonlocal reported
        for pod in workers[reported : reported + batch]:
            meta = pod["metadata"]
            report = Report(meta["uid"], 1, incarnation="bench")
            book.record(meta["namespace"], meta["name"], report, job=key)
        reported += batch
        started = time.process_time()
        out = await reconciler.reconcile(key)
        if out.created or out.deleted:
            raise RuntimeError("the gang must be mid-restart, with nothing to create or delete")
        return time.process_time() - started

    await one()  # the first pass parses every pod's view
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    spent = [await one() for _ in range(passes)]
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return sum(spent) / len(spent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=5000)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    per_pass = asyncio.run(measure(a.workers, a.passes, a.profile))
    print(f"N={a.workers}: CPU per pass mid-restart {per_pass * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
