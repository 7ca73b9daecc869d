"""The peer a scale run restarts beside GangJob: JobSet v0.12.0 (`localcluster.jobset`, its
controller run out of cluster at its default client QPS, 500).

The same gang as GangJob's: one replicated Job, Indexed, parallelism = completions = N, on the
size's own KWOK nodes, the workers' image and command; `failurePolicy.maxRestarts` far above
what a run uses. One pod is failed the way the benchmark fails GangJob's workers, by a status
patch as its kubelet would write it (`failed_pod_status`); the restart runs from that failure
seen in this process's watch to all N pods of the next restart attempt
(`jobset.sigs.k8s.io/restart-attempt`) Running. In between: the Job controller fails the Job
(backoffLimit 0), deletes its running pods and takes its tracking finalizer off each, and only
then marks the Job Failed; JobSet counts a restart and deletes the Job (foreground), creates the
Job of the next attempt under the same name once the old one is gone, and the Job controller
creates its N pods, the scheduler binds them and KWOK runs them.

Two rows: with the controller-manager at its default client QPS (20, burst 30: the Job
controller's pod creates and deletes and the garbage collector's deletes each go through a
client of that rate) and with it raised (`controller_manager_qps`), as an operator of large
gangs would. Each repetition creates a JobSet, waits for its N pods Running, fails one,
measures, deletes the JobSet and waits until its pods are gone."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import Progress
from benchmarks.scale.cluster import World
from benchmarks.scale.observer import (
    Check,
    NotReached,
    follow,
    milestones,
    polled,
    running,
    uid,
)
from benchmarks.scale.scenarios import Unfinished, between, print_row, timed, unfinished_row
from benchmarks.scale.settings import BENCH_LABEL
from controller.k8s import PODS, JsonDict, Kube, NotFound, ResourceKind, selector
from localcluster import jobset
from localcluster.cluster import Cluster
from localcluster.outofcluster import AddonProcess

JOBSETS = ResourceKind(jobset.GROUP, jobset.API_VERSION.split("/")[1], jobset.PLURAL, jobset.KIND)
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
MAX_RESTARTS = 1000
VISIBLE_TO_RUNNING = between("visible", "running")

STEPS = {
    "visible->stopped": "the Job controller failing the Job and deleting its running pods "
    "(one DELETE each)",
    "stopped->restarted": "the Job controller taking its tracking finalizer off each old pod "
    "(one PATCH each) before it marks the Job Failed, and JobSet's restart",
    "restarted->deleted": "JobSet's foreground delete of the old Job (the garbage collector)",
    "deleted->first-new": "JobSet creating the Job again once the old one is gone",
    "first-new->created": "the Job controller's pod creates (one POST each)",
    "created->scheduled": "the scheduler's binds",
    "scheduled->running": "KWOK reporting the pods Running",
}
"""What each step of a JobSet restart waits on."""
CONTROLLER_MANAGER_RATES = {
    "old pods deleted": ["visible->stopped"],
    "finalizers removed": ["stopped->restarted"],
    "new pods created": ["first-new->created"],
}
"""Runs of one controller-manager request per pod: what the report calls their rate, and the
steps they span."""
SCHEDULER_RATE = ("scheduled", ["first-new->created", "created->scheduled"])
"""The scheduler's binds run from the first new pod to the last bound."""


def start(cluster: Cluster) -> AddonProcess:
    """The JobSet controller for a run, at its own default client QPS."""
    if not jobset.keeps_pods_running(cluster):
        raise RuntimeError(
            f"KWOK of cluster {cluster.name!r} would complete the peer's pods at once: its "
            f"pod-complete stage must skip pods labelled {jobset.KEEP_RUNNING_LABEL}; bring "
            f"the cluster down (`localcluster down --name {cluster.name}`) and run again"
        )
    return jobset.start_controller(cluster, out=sys.stderr)


class JobSetTracker:
    """Watches one JobSet and its pods: when each value of `status.restarts` was first seen,
    the pods as they are now, and when each pod was first seen Failed."""

    def __init__(self, kube: Kube, ns: str, name: str) -> None:
        self.kube, self.ns, self.name = kube, ns, name
        self.pods: dict[str, JsonDict] = {}
        """By UID."""
        self.failed_at: dict[str, float] = {}
        self.restarts_at: dict[int, float] = {}
        self.gone = False

    def _pod(self, kind: str, pod: JsonDict) -> None:
        if kind == "DELETED":
            self.pods.pop(uid(pod), None)
            return
        self.pods[uid(pod)] = pod
        if pod.get("status", {}).get("phase") == "Failed":
            self.failed_at.setdefault(uid(pod), time.monotonic())

    def _pods_listed(self, items: list[JsonDict]) -> None:
        self.pods.clear()
        for pod in items:
            self._pod("ADDED", pod)

    def _jobset(self, kind: str, js: JsonDict) -> None:
        self.gone = kind == "DELETED"
        restarts = js.get("status", {}).get("restarts", 0)
        self.restarts_at.setdefault(int(restarts), time.monotonic())

    def _jobsets_listed(self, items: list[JsonDict]) -> None:
        self.gone = not items
        for js in items:
            self._jobset("ADDED", js)

    def count(self, attempt: int, pred: Callable[[JsonDict], bool] = lambda p: True) -> int:
        """Pods of restart attempt `attempt` for which `pred` holds."""
        want = str(attempt)
        return sum(
            1 for p in self.pods.values()
            if p["metadata"].get("labels", {}).get(jobset.RESTART_ATTEMPT_LABEL) == want
            and pred(p)
        )  # fmt: skip

    async def run(self) -> None:
        await asyncio.gather(
            follow(
                self.kube, PODS, self.ns, on_list=self._pods_listed, on_event=self._pod,
                label_selector=selector({jobset.JOBSET_NAME_LABEL: self.name}),
            ),
            follow(
                self.kube, JOBSETS, self.ns, on_list=self._jobsets_listed, on_event=self._jobset,
                field_selector=f"metadata.name={self.name}",
            ),
        )  # fmt: skip


def manifest(w: World, name: str) -> JsonDict:
    js = jobset.jobset_manifest(
        name, workers=w.n, max_restarts=MAX_RESTARTS, node_selector={BENCH_LABEL: w.ns}
    )
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["command"] = ["sh", "-c", "sleep infinity"]  # as GangJob's workers
    return js


def _scheduled(p: JsonDict) -> bool:
    return bool(p["spec"].get("nodeName"))


async def restart(w: World, mode: str, rep: int) -> dict[str, Any]:
    """One JobSet restart of a gang of N: created, running, one pod failed, measured, deleted."""
    name, n = f"{mode}-{rep}", w.n
    tracker = JobSetTracker(w.kube, w.ns, name)
    task = asyncio.create_task(tracker.run())
    try:
        t0 = time.monotonic()
        await w.kube.create(JOBSETS, manifest(w, name), w.ns)
        try:
            await milestones(
                {"running": polled(lambda: tracker.count(0, running) == n)},
                w.settings.rep_limit_s or w.timeout(0.5, 180),
                Progress(f"N={n} {mode} #{rep + 1} starting"),
                lambda: f"{tracker.count(0)}/{n} pods, {tracker.count(0, running)}/{n} Running",
            )
        except NotReached as e:
            raise Unfinished(unfinished_row(mode, rep, t0, e, ["injected", "running"])) from e
        await asyncio.sleep(1.0)  # let the start's last watch events drain, as `steady` does
        pods = sorted(
            tracker.pods.values(),
            key=lambda p: int(p["metadata"].get("labels", {}).get(COMPLETION_INDEX, 0)),
        )
        victim = pods[(rep * 7919 + 1) % len(pods)]

        async def fail() -> None:
            body = jobset.failed_pod_status(victim)
            await w.kube.patch_status(PODS, victim["metadata"]["name"], body, w.ns)

        checks: dict[str, Check] = {
            "visible": lambda: tracker.failed_at.get(uid(victim)),
            "stopped": polled(lambda: tracker.count(0, running) == 0),
            "restarted": lambda: tracker.restarts_at.get(1),
            "deleted": polled(lambda: tracker.count(0) == 0),
            "first-new": polled(lambda: tracker.count(1) > 0),
            "created": polled(lambda: tracker.count(1) == n),
            "scheduled": polled(lambda: tracker.count(1, _scheduled) == n),
            "running": polled(lambda: tracker.count(1, running) == n),
        }
        row = await timed(
            w, mode, rep, fail, checks,
            ["visible", "stopped", "restarted", "deleted", "first-new", "created", "scheduled",
             "running"],
            w.timeout(0.6, 180),
            lambda: f"restarts {max(tracker.restarts_at, default=0)}, {tracker.count(0)}/{n} "
            f"old pods left, {tracker.count(1)}/{n} new, {tracker.count(1, _scheduled)}/{n} "
            f"scheduled, {tracker.count(1, running)}/{n} Running",
            VISIBLE_TO_RUNNING,
        )  # fmt: skip
        row["worker"] = victim["metadata"]["name"]
        print_row(w, row)
        return row
    finally:
        try:
            await delete(w, name, tracker)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def delete(w: World, name: str, tracker: JobSetTracker) -> None:
    """The JobSet deleted; returns once it and its pods are gone (the controller-manager
    deletes its Job's pods at its own pace)."""
    with contextlib.suppress(NotFound):
        await w.kube.delete(JOBSETS, name, w.ns, propagation_policy="Background")
    await milestones(
        {"gone": polled(lambda: tracker.gone and not tracker.pods)},
        w.timeout(0.5, 180), Progress(f"N={w.n} deleting JobSet {name}"),
        lambda: f"{len(tracker.pods)} pods left",
    )  # fmt: skip


async def measure(w: World, mode: str, rows: list[dict[str, Any]]) -> None:
    """`reps` JobSet restarts as `mode` (the controller-manager as it runs now), appended to
    `rows` as they are taken; one that overruns ends them."""
    for rep in range(w.settings.reps):
        try:
            rows.append(await restart(w, mode, rep))
        except Unfinished as e:
            rows.append(e.row)
            print(f"  N={w.n} {e}: not Running again within {e.row['limit_s']}s "
                  f"(waiting for {e.row['missing']}; {e.row['state']}); the rest of "
                  f"{mode} is skipped", file=sys.stderr)  # fmt: skip
            return
