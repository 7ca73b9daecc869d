"""The restarts a scale run measures on a running gang, each from its injected failure to every
worker past the barrier of the new epoch: in-place (a trainer exits 1), process (the same exit
in a `Process` gang, whose agents restart their trainers themselves), node-lost (a worker's
node dies) and recreate (the same exit in a `Recreate` gang); hang (in a `Process` gang whose
trainers report progress, one trainer stops reporting and keeps running), from its last step;
and what one repetition records, finished or not."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.agent import Step
from api.v1alpha1 import RestartRecord
from benchmarks.common import Progress
from benchmarks.scale.cluster import World, lose_node, steady
from benchmarks.scale.cpu import BENCH, CpuSampler
from benchmarks.scale.observer import (
    AgentTally,
    ApiSample,
    Check,
    CtlSample,
    JobTracker,
    NotReached,
    agents_at,
    milestones,
    pods_where,
    polled,
    running,
    uid,
    written_after,
)
from benchmarks.scale.profile import profiled
from benchmarks.scale.settings import (
    BULK_TAINT,
    FULL_TAINT,
    NODE_LOST_SHRINK,
    NODE_LOST_SPARES,
    NODE_LOST_WAIT,
)
from controller.k8s import GANGJOBS, NODES, JsonDict
from localcluster.simkubelet import SimTrainer


class Unfinished(Exception):
    """A repetition that overran its limit. Its row says how far it got; the run records it
    and goes on with the next gang, since this gang's state is no longer known."""

    def __init__(self, row: dict[str, Any]):
        super().__init__(f"{row['mode']} #{row['rep'] + 1} unfinished")
        self.row = row


Window = tuple[float, float]


@dataclass(frozen=True)
class Span:
    """What a repetition's `seconds` are: the time windows between its milestones that count
    (their CPU is accounted over the same windows)."""

    label: str
    windows: Callable[[dict[str, float]], list[Window]]

    def seconds(self, marks: dict[str, float]) -> float:
        return sum(end - start for start, end in self.windows(marks))


def between(start: str, end: str) -> Span:
    """From milestone `start` to milestone `end`."""
    return Span(f"{start}->{end}", lambda marks: [(marks[start], marks[end])])


VISIBLE_TO_BARRIER = between("visible", "barrier")
"""A restart: from the failure visible in the API to the barrier of the new epoch written."""
EXITED_TO_BARRIER = between("exited", "barrier")
"""A `Process`-mode restart: the kubelet writes no status for a trainer's exit (the agent
reports it to the controller), so its failure is visible from the exit itself."""


def _steps(marks: dict[str, float], order: list[str]) -> dict[str, float]:
    return {f"{a}->{b}": round(marks[b] - marks[a], 3) for a, b in itertools.pairwise(order)}


@contextlib.asynccontextmanager
async def no_collector() -> AsyncIterator[None]:
    """No garbage collection in this process while a repetition runs.

    This one process holds every simulated kubelet and the real agent of every worker, so its
    heap is N agents' heaps in one, and a full collection walks all of them: at N=5000, with
    the heap frozen at the gang's start, the collector still took 1.1-1.8 s of this process's
    CPU in a 3-4 s `Process` restart (four or five full collections of 0.25-0.4 s each). That
    is the simulation's cost, not the agents': a pod's agent is a process of its own, whose
    collections walk a heap of a few thousand objects. So the heap is collected and frozen
    before the repetition (outside its times), and the collector is off while it runs
    (reference counting still frees everything but cycles, a repetition's worth)."""
    gc.collect()
    gc.freeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def timed(
    w: World,
    mode: str,
    rep: int,
    inject: Callable[[], Any],
    checks: dict[str, Check],
    order: list[str],
    timeout: float,
    state: Callable[[], str],
    span: Span,
) -> dict[str, Any]:
    """Inject, wait for every milestone, and return the repetition's row: its `seconds` over
    `span`, the `steps` between milestones in `order`, and the CPU each process spent within
    the span (`cpu_s`; this process's, the simulation's, also as `bench_cpu_s`). Raises
    `Unfinished` if a milestone is not reached within `timeout`."""
    timeout = w.settings.rep_limit_s or timeout
    order = ["injected", *order]
    name = f"N{w.n}-{mode}-{rep + 1}.txt"
    spy, spy_ctl = w.settings.py_spy, w.settings.py_spy_controller
    out = spy / name if spy is not None else None
    ctl_out = spy_ctl / name if spy_ctl is not None else None
    ctl_pid = w.cpu_pids()["controller"]
    async with (
        no_collector(),
        profiled(out),
        profiled(ctl_out, ctl_pid),
        CpuSampler.running(w.cpu_pids()) as sampler,
    ):
        t0 = time.monotonic()
        injected = asyncio.ensure_future(inject())
        try:
            marks = await milestones(checks, timeout, Progress(f"N={w.n} {mode} #{rep + 1}"), state)
        except NotReached as e:
            injected.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await injected
            raise Unfinished(unfinished_row(mode, rep, t0, e, order)) from e
        await injected
    marks["injected"] = t0
    seconds = round(span.seconds(marks), 3)
    cpu = sampler.spent(span.windows(marks))
    bench = cpu.get(BENCH)
    return {
        "mode": mode,
        "rep": rep,
        "seconds": seconds,
        "span": span.label,
        "steps": _steps(marks, order),
        "cpu_s": cpu,
        "bench_cpu_s": bench,
        "seconds_minus_bench_cpu": None if bench is None else round(seconds - bench, 3),
    }


async def measure_restart(
    w: World,
    tracker: JobTracker,
    mode: str,
    rep: int,
    inject: Callable[[], Any],
    checks: dict[str, Check],
    order: list[str],
    timeout: float,
    state: Callable[[], str],
    span: Span = VISIBLE_TO_BARRIER,
) -> dict[str, Any]:
    """One restart from epoch E to E+1: inject, wait for every milestone, collect numbers."""
    api_before = await ApiSample.take(w.cluster)
    before = CtlSample.take(w.ctl)
    row = await timed(w, mode, rep, inject, checks, order, timeout, state, span)
    rss = w.sample_rss()
    after = CtlSample.take(w.ctl)
    api = (await ApiSample.take(w.cluster)).since(api_before)
    last = tracker.status.get("lastRestart") or {}
    if last.get("epoch") != tracker.status.get("epoch"):
        last = {}  # a restart the controller did not record (floor raises the epoch itself)
    ctl = after.since(before)
    row |= {
        "controller_duration_s": last.get("durationSeconds"),
        "recreated": RestartRecord.model_validate(last).recreated_ranks(w.n) if last else None,
        "trigger": (last.get("trigger") or {}).get("class"),
        "controller": ctl,
        "controller_rss_mib": round(rss, 1),
        "apiserver": api,
    }
    print_row(
        w,
        row,
        f"ctl share {ctl['share_s']}  ctl API {ctl['requests'].get('all', 0)}  "
        f"ctl CPU {row['cpu_s'].get('controller')}s ({ctl['passes']} passes "
        f"{ctl['pass_s']}s, gc {'/'.join(map(str, ctl['gc']))})  "
        f"ctl RSS {row['controller_rss_mib']} MiB",
    )
    return row


def print_row(w: World, row: dict[str, Any], extra: str = "") -> None:
    """A repetition's line on stderr, as it finishes."""
    print(
        f"  N={w.n} {row['mode']} #{row['rep'] + 1}: {row['seconds']:.2f}s {row['span']}  "
        + "  ".join(f"{k} {v:.2f}" for k, v in row["steps"].items())
        + f"  bench CPU {row['bench_cpu_s']}s  {extra}",
        file=sys.stderr,
    )


def unfinished_row(
    mode: str, rep: int, t0: float, e: NotReached, order: list[str]
) -> dict[str, Any]:
    """The row of a repetition that overran: the steps it completed and what it waited for."""
    marks = {**e.reached, "injected": t0}
    done = [m for m in order if m in marks]
    return {
        "mode": mode,
        "rep": rep,
        "unfinished": True,
        "seconds": None,
        "limit_s": round(e.timeout, 1),
        "steps": _steps(marks, done),
        "missing": e.missing,
        "state": e.state,
    }


async def in_place(
    w: World, tracker: JobTracker, rep: int, gang: str, mode: str = "in-place"
) -> dict[str, Any]:
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    # A worker on a big node, a different one each time.
    names = sorted(
        (p["metadata"]["name"] for p in w.s.pods.values()
         if p["spec"].get("nodeName") not in w.victims),
        key=lambda s: int(s.rsplit("-", 1)[1]),
    )  # fmt: skip
    victim = names[(rep * 7919 + 1) % len(names)]
    worker = w.s.workers[victim]
    checks: dict[str, Check] = {
        "visible": written_after(worker, "restarting", time.monotonic()),
        "epoch": lambda: tracker.epoch_at.get(e1),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }
    row = await measure_restart(
        w, tracker, mode, rep, lambda: w.s.crash(victim, 1), checks,
        ["visible", "epoch", "arrived", "barrier", "open"], w.timeout(0.2),
        lambda: f"epoch {tracker.status.get('epoch')}, {tally.arrived()}/{n} "
        f"arrived, {tally.opened()}/{n} open",
    )  # fmt: skip
    row["worker"] = victim
    await steady(w, tracker, e1)
    return row


async def process(w: World, tracker: JobTracker, rep: int, mode: str = "process") -> dict[str, Any]:
    """In a `Process` gang: one worker's trainer exits 1; every agent stops its trainer, arrives
    at E+1 and starts it again behind the barrier, in the same pod."""
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    names = sorted(w.s.workers, key=lambda s: int(s.rsplit("-", 1)[1]))
    victim = names[(rep * 7919 + 1) % len(names)]
    worker = w.s.workers[victim]
    agent, trainer = worker.agent, worker.trainer
    assert agent is not None, victim
    assert trainer is not None, victim
    assert trainer.running, victim
    uids = {name: uid(p) for name, p in w.s.pods.items()}
    # When the agent's report of the exit was accepted: the step it waits in after it begins
    # then, and may last less than a poll.
    reported = asyncio.ensure_future(
        agent.wait_for(lambda s: s.last_exit == (epoch, 1) and s.step is Step.WAITING_FOR_EPOCH)
    )
    checks: dict[str, Check] = {
        "exited": lambda: trainer.ended_at,
        "epoch": lambda: tracker.epoch_at.get(e1),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }
    try:
        row = await measure_restart(
            w, tracker, mode, rep, lambda: w.s.crash(victim, 1), checks,
            ["exited", "epoch", "arrived", "barrier", "open"], w.timeout(0.2),
            lambda: f"epoch {tracker.status.get('epoch')}, {tally.arrived()}/{n} "
            f"arrived, {tally.opened()}/{n} open",
            EXITED_TO_BARRIER,
        )  # fmt: skip
    finally:
        reported.cancel()
    ended = trainer.ended_at
    row |= {
        "worker": victim,
        "exit_code": trainer.code,
        "exited->reported": (
            round(reported.result().since - ended, 3)
            if ended is not None and reported.done() and not reported.cancelled()
            else None
        ),
        # In place: no pod of the gang replaced.
        "pods_replaced": sum(1 for name, p in w.s.pods.items() if uids.get(name) != uid(p)),
    }
    await steady(w, tracker, e1)
    return row


async def steady_cost(
    w: World, tracker: JobTracker, mode: str, window: float, settle: float
) -> dict[str, Any]:
    """The controller's cost while the running gang trains and nothing fails: after `settle`
    seconds (every agent's summaries come at their period by then), its CPU, API requests, the
    GangJob's writes and the progress summaries it accepted over `window` seconds."""
    await asyncio.sleep(settle)
    accepted = {"result": "accepted"}
    before, reports0, writes0 = (
        CtlSample.take(w.ctl), w.ctl.metric(REPORTS, accepted), tracker.writes,
    )  # fmt: skip
    passes0 = w.ctl.metric(PASSES)
    t0 = time.monotonic()
    ticker = Progress(f"N={w.n} {mode}: {window:.0f}s steady window")
    while (left := window - (time.monotonic() - t0)) > 0:
        ticker.tick(f"{left:.0f}s left, {tracker.writes - writes0} GangJob writes")
        await asyncio.sleep(min(left, 5.0))
    took = time.monotonic() - t0
    ctl = CtlSample.take(w.ctl).since(before)
    reports = int(w.ctl.metric(REPORTS, accepted) - reports0)
    passes = int(w.ctl.metric(PASSES) - passes0)
    writes = tracker.writes - writes0
    w.sample_rss()
    row = {
        "mode": mode,
        "rep": 0,
        "window_s": round(took, 1),
        "controller": ctl,
        "cpu_share": round(ctl["cpu_s"] / took, 4),
        "job_writes": writes,
        "job_writes_per_30s": round(writes * 30.0 / took, 2),
        "reports": reports,
        "reports_per_s": round(reports / took, 1),
        "passes": passes,
    }
    print(
        f"  N={w.n} {mode}: {took:.0f}s: controller CPU {ctl['cpu_s']}s "
        f"({100 * row['cpu_share']:.2f}% of a core), {passes} passes, {writes} GangJob writes, "
        f"{reports} progress summaries ({row['reports_per_s']}/s), API {ctl['requests']}",
        file=sys.stderr,
    )
    return row


REPORTS = "gangjob_progress_reports_total"
PASSES = "controller_runtime_reconcile_total"
"""The controller's passes (reconciles) of every gang, by their result: in a steady window, the
progress refreshes and whatever else woke a gang."""


LAST_STEP_TO_BARRIER = between("last-step", "barrier")
"""A hang: from the hung trainer's last step to the barrier of the new epoch written."""


async def hang(w: World, tracker: JobTracker, rep: int, hang_seconds: float) -> dict[str, Any]:
    """In a `Process` gang whose trainers report steps: one worker's trainer stops reporting
    and keeps running; its agent tells the stall `hangSeconds` after it saw the last step, the
    controller restarts the gang in place as `Hang`. Detection is the last step to the epoch
    written, restart the epoch to the barrier."""
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    names = sorted(w.s.workers, key=lambda s: int(s.rsplit("-", 1)[1]))
    victim = names[(rep * 7919 + 1) % len(names)]
    agent = w.s.workers[victim].agent
    assert agent is not None, victim
    monitor = agent.progress
    assert monitor is not None, victim
    stalls = monitor.stalls
    hung: list[SimTrainer] = []

    async def inject() -> None:
        hung.append(w.s.hang(victim))

    checks: dict[str, Check] = {
        "last-step": lambda: hung[0].reported_at if hung else None,
        "stalled": polled(lambda: monitor.stalls > stalls),
        "epoch": lambda: tracker.epoch_at.get(e1),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }
    row = await measure_restart(
        w, tracker, "hang", rep, inject, checks,
        ["last-step", "stalled", "epoch", "arrived", "barrier", "open"],
        w.timeout(0.2) + hang_seconds,
        lambda: f"stalled {monitor.stalls > stalls}, epoch {tracker.status.get('epoch')}, "
        f"{tally.arrived()}/{n} arrived",
        LAST_STEP_TO_BARRIER,
    )  # fmt: skip
    steps = row["steps"]
    trigger = (tracker.status.get("lastRestart") or {}).get("trigger") or {}
    row |= {
        "worker": victim,
        "hang_seconds": hang_seconds,
        "detection_s": round(steps["last-step->stalled"] + steps["stalled->epoch"], 3),
        "restart_s": round(steps["epoch->arrived"] + steps["arrived->barrier"], 3),
        "named_worker": trigger.get("worker"),
    }
    print(
        f"  N={w.n} hang #{rep + 1}: detection {row['detection_s']:.2f}s (last step -> epoch), "
        f"restart {row['restart_s']:.2f}s (epoch -> barrier), hangSeconds {hang_seconds:g}; "
        f"trigger {row['trigger']} of worker {row['named_worker']} (hung: {victim})",
        file=sys.stderr,
    )
    await steady(w, tracker, e1)
    return row


RESIZE_SHARE = 0.8
"""`resize` shrinks the gang to this share of N, then grows it back to N."""


async def resize(w: World, tracker: JobTracker, rep: int, gang: str) -> list[dict[str, Any]]:
    """An elastic gang resized by `replicas`, N -> 0.8 N -> N, each in place (rows
    `resize-down`, `resize-up`; the kept pods restart in place, the surplus go, the new ones
    are created). Its time is what the gang stops training for, as an in-place restart's: from
    the new epoch written (the kept trainers stop) to its barrier written; a grow's new pods
    are created and started before that, while the gang trains on (step `injected->epoch`)."""
    n = w.n
    down = max(1, int(n * RESIZE_SHARE))
    return [
        await _resize_to(w, tracker, rep, gang, down, "resize-down"),
        await _resize_to(w, tracker, rep, gang, n, "resize-up"),
    ]


async def _resize_to(
    w: World, tracker: JobTracker, rep: int, gang: str, size: int, mode: str
) -> dict[str, Any]:
    e1 = int(tracker.status.get("epoch", 0)) + 1

    async def inject() -> None:
        await w.kube.patch(GANGJOBS, gang, {"spec": {"replicas": size}}, w.ns)

    def open_count() -> int:
        return agents_at(w.s, e1, opened=True)

    def state() -> str:
        return f"epoch {tracker.status.get('epoch')}, {open_count()}/{size} open"

    checks: dict[str, Check] = {
        "epoch": lambda: tracker.epoch_at.get(e1),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: open_count() == size),
    }
    row = await measure_restart(
        w, tracker, mode, rep, inject, checks, ["epoch", "barrier", "open"], w.timeout(0.2),
        state, between("epoch", "barrier"),
    )  # fmt: skip
    row["size"] = size
    if size == w.n:
        await steady(w, tracker, e1)
    else:
        await milestones(
            {"running": polled(lambda: pods_where(w.s, running) == size)},
            w.timeout(0.1),
            Progress(f"N={w.n} settling at {size}"),
            lambda: f"{pods_where(w.s, running)}/{size} running",
        )
    return row


def _alone_on(w: World, node: str) -> JsonDict | None:
    """The one worker pod on `node`, whose loss loses exactly one worker; None (and said) if
    the node holds none or several."""
    on_node = [p for p in w.s.pods.values() if p["spec"].get("nodeName") == node]
    if len(on_node) != 1:
        print(f"  node {node} holds {len(on_node)} workers: skipped", file=sys.stderr)
        return None
    return on_node[0]


def _losing(w: World, victim: str, node: str) -> tuple[Callable[[], Awaitable[None]], list[float]]:
    """What loses `node` and the agent of `victim` on it, and the list its time goes to once
    the loss is written (the failure visible)."""
    visible: list[float] = []

    async def inject() -> None:
        w.s.lose(victim)
        await lose_node(w.kube, node)
        w.lost.add(node)
        visible.append(time.monotonic())

    return inject, visible


async def node_lost(w: World, tracker: JobTracker, rep: int, node: str) -> dict[str, Any] | None:
    pod = _alone_on(w, node)
    if pod is None:
        return None
    victim, old_uid = pod["metadata"]["name"], uid(pod)
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    inject, visible = _losing(w, victim, node)

    def recreated() -> bool:
        p = w.s.pods.get(victim)
        return p is not None and uid(p) != old_uid and running(p)

    checks: dict[str, Check] = {
        "visible": lambda: visible[0] if visible else None,
        "epoch": lambda: tracker.epoch_at.get(e1),
        "recreated": polled(recreated),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }
    row = await measure_restart(
        w, tracker, "node-lost", rep, inject, checks,
        ["visible", "epoch", "recreated", "arrived", "barrier", "open"], w.timeout(0.2),
        lambda: f"epoch {tracker.status.get('epoch')}, recreated {recreated()}, "
        f"{tally.arrived()}/{n} arrived",
    )  # fmt: skip
    row["worker"] = victim
    await steady(w, tracker, e1)
    return row


async def recreate(w: World, tracker: JobTracker, rep: int) -> dict[str, Any]:
    epoch = int(tracker.status.get("epoch", 0))
    e1, n = epoch + 1, w.n
    tally = AgentTally(w.s, e1)
    old = {uid(p) for p in w.s.pods.values()}
    names = sorted(w.s.workers, key=lambda s: int(s.rsplit("-", 1)[1]))
    victim = names[(rep * 7919 + 1) % len(names)]
    worker = w.s.workers[victim]

    def new(pred: Callable[[JsonDict], bool]) -> Callable[[], bool]:
        return lambda: pods_where(w.s, lambda p: uid(p) not in old and pred(p)) == n

    checks: dict[str, Check] = {
        "visible": written_after(worker, "failed", time.monotonic()),
        "epoch": lambda: tracker.epoch_at.get(e1),
        "deleted": polled(lambda: pods_where(w.s, lambda p: uid(p) in old) == 0),
        "scheduled": polled(new(lambda p: bool(p["spec"].get("nodeName")))),
        "running": polled(new(running)),
        "arrived": polled(lambda: tally.arrived() == n),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == n),
    }

    def state() -> str:
        gone = n - pods_where(w.s, lambda p: uid(p) in old)
        sched = pods_where(w.s, lambda p: uid(p) not in old and bool(p["spec"].get("nodeName")))
        run = pods_where(w.s, lambda p: uid(p) not in old and running(p))
        return f"{gone}/{n} old gone, {sched}/{n} scheduled, {run}/{n} Running"

    row = await measure_restart(
        w, tracker, "recreate", rep, lambda: w.s.crash(victim, 1), checks,
        ["visible", "epoch", "deleted", "scheduled", "running", "arrived", "barrier", "open"],
        w.timeout(0.2, 180), state,
    )  # fmt: skip
    row["worker"] = victim
    await steady(w, tracker, e1)
    return row


async def node_loss(
    w: World, tracker: JobTracker, rep: int, node: str, mode: str, *, capacity_returns: bool
) -> dict[str, Any] | None:
    """A worker's node dies with no room left for its new pod (the bulk nodes taken out of
    scheduling, `no_capacity`), in a gang of its own (`NODE_LOSS_GANGS`): an elastic gang with a
    spare, whose spare takes the worker's place in place (`node-lost-spare`, `Process` mode;
    `node-lost-spare-pod`, `Pod` mode, where every pod restarts in place); an elastic gang
    with `waitSeconds: 0`, which goes on without the worker (`node-lost-shrink`); a gang that
    is not elastic, which waits for the worker's new pod (`node-lost-wait`): the wait is
    reported, bounded by `Settings.wait_bound`, as an unfinished repetition. From the node lost to
    the barrier of the new epoch written, then every member past it. Unless the caller keeps
    capacity away for every repetition (`capacity_returns` False: the shrinking gang's lost
    workers stay pending, else the next loss would find one placed, a spare), capacity then
    returns and the gang settles, its spare placed and arrived, before the next repetition."""
    pod = _alone_on(w, node)
    if pod is None:
        return None
    victim = pod["metadata"]["name"]
    status = tracker.status
    epoch = int(status.get("epoch", 0))
    e1 = epoch + 1
    world = int(status.get("worldSize") or w.n)
    members = world - 1 if mode == NODE_LOST_SHRINK else world
    tally = AgentTally(w.s, e1)
    inject, visible = _losing(w, victim, node)

    checks: dict[str, Check] = {
        "visible": lambda: visible[0] if visible else None,
        "epoch": lambda: tracker.epoch_at.get(e1),
        "arrived": polled(lambda: tally.arrived() == members),
        "barrier": lambda: tracker.barrier_at.get(e1),
        "open": polled(lambda: tally.opened() == members),
    }
    order = ["visible", "epoch", "arrived", "barrier", "open"]

    def state() -> str:
        return f"epoch {tracker.status.get('epoch')}, {tally.arrived()}/{members} arrived"

    if mode in NODE_LOST_SPARES:
        await spare_ready(w, tracker)
    room = no_capacity(w) if capacity_returns else contextlib.nullcontext()
    async with room:
        if mode == NODE_LOST_WAIT:
            # The barrier never opens without the worker: the wait is the figure.
            row = await waited(w, tracker, rep, inject, checks, order, state)
        else:
            row = await measure_restart(
                w, tracker, mode, rep, inject, checks, order, w.timeout(0.2), state
            )
    last = tracker.status.get("lastRestart") or {}
    row |= {"worker": victim, "detail": (last.get("trigger") or {}).get("detail")}
    # Capacity returned: the worker's new pod is placed (a spare again, or the gang's
    # barrier waited for it), and the gang settles at the epoch it reached.
    world = int(tracker.status.get("worldSize") or w.n)
    await steady(
        w, tracker, int(tracker.status.get("epoch", e1)), members=world,
        pods=gang_pods(w, tracker) if capacity_returns else world,
    )  # fmt: skip
    return row


async def spare_ready(w: World, tracker: JobTracker) -> None:
    """Until every pod of the gang, its spare's too, has arrived at the gang's epoch: a spare
    takes a worker's place only once its agent is up."""
    pods = gang_pods(w, tracker)

    def arrived() -> int:
        st = tracker.status
        return int((st.get("workers") or {}).get("arrived") or 0)

    await milestones(
        {"spare": polled(lambda: arrived() == pods)},
        w.timeout(0.1),
        Progress(f"N={w.n} spare arriving"),
        lambda: f"{arrived()}/{pods} arrived",
    )


def gang_pods(w: World, tracker: JobTracker) -> int:
    """The gang's pods: its workers and spares."""
    spec = tracker.job.get("spec") or {}
    spares = int((spec.get("elastic") or {}).get("spares") or 0)
    return int(spec.get("replicas") or w.n) + spares


async def waited(
    w: World,
    tracker: JobTracker,
    rep: int,
    inject: Callable[[], Any],
    checks: dict[str, Check],
    order: list[str],
    state: Callable[[], str],
) -> dict[str, Any]:
    """`timed` bounded by `Settings.wait_bound` after the epoch was raised; a gang still waiting
    then gives an unfinished row (`limit_s`: how long it was seen waiting)."""
    before = dict(checks)
    first = {k: v for k, v in before.items() if k in ("visible", "epoch")}
    t0 = time.monotonic()
    injected = asyncio.ensure_future(inject())
    marks = await milestones(first, w.timeout(0.2), Progress(f"N={w.n} {NODE_LOST_WAIT}"), state)
    await injected
    rest = {k: v for k, v in before.items() if k not in first}
    try:
        marks |= await milestones(
            rest, w.settings.wait_bound, Progress(f"N={w.n} {NODE_LOST_WAIT} waiting"), state
        )
    except NotReached as e:
        e.reached |= marks
        row = unfinished_row(NODE_LOST_WAIT, rep, t0, e, order)
        row["limit_s"] = round(time.monotonic() - marks["epoch"], 1)
        print(
            f"  N={w.n} {NODE_LOST_WAIT} #{rep + 1}: still waiting {row['limit_s']} s after "
            f"the epoch was raised (missing {e.missing}; {state()})",
            file=sys.stderr,
        )
        return row
    marks["injected"] = t0
    row = {
        "mode": NODE_LOST_WAIT,
        "rep": rep,
        "seconds": round(VISIBLE_TO_BARRIER.seconds(marks), 3),
        "span": VISIBLE_TO_BARRIER.label,
        "steps": _steps(marks, ["injected", *order]),
    }
    print_row(w, row | {"bench_cpu_s": None})
    return row


NO_CAPACITY_SETTLE_S = 2.0


@contextlib.asynccontextmanager
async def no_capacity(w: World) -> AsyncIterator[None]:
    """No room for a new pod while inside: every node of the run tainted NoSchedule (their
    pods keep running), but the lost ones, whose taints say they are lost. The taint is
    lifted on the way out."""
    full = {"key": FULL_TAINT, "effect": "NoSchedule"}

    def taints(node: str) -> list[JsonDict]:
        return [{"key": BULK_TAINT, "effect": "PreferNoSchedule"}] if node in w.bulk else []

    held = [node for node in w.nodes if node not in w.lost]
    for node in held:
        await w.kube.patch(NODES, node, {"spec": {"taints": [*taints(node), full]}})
    # The node changes wake the controller (a pass of every gang on them) and the
    # controller-manager: the loss measured after them is the loss alone.
    await asyncio.sleep(NO_CAPACITY_SETTLE_S)
    try:
        yield
    finally:
        for node in held:
            if node not in w.lost:
                await w.kube.patch(NODES, node, {"spec": {"taints": taints(node)}})
