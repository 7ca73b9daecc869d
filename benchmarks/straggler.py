"""Stragglers at scale: a degraded device in a gang of N on the sim cluster, found and moved; and
a seeded soak of healthy jitter that must find none.

    python -m benchmarks.straggler [--size 1000] [--reps 3] [--for-seconds 30] [--ratio 1.5]
        [--slow 2.0] [--soak-hours 1] [--soak-only] [--cluster bench] [--name straggler]

**The degraded device.** A `Process`-mode gang of `--size` workers on KWOK nodes, run by the
simulated kubelet (localcluster/simkubelet.py) with the real agents and the real controller:
its stand-in trainers step as a synchronous gang, a step a second, 0.6 s of it each worker's
own compute with +-10% jitter, reported as `step=<n> compute=<s>`; `spec.progress.straggler`
with `--ratio` and `--for-seconds`, and the rule `onFailureClasses: [Straggler]` ->
`RecreateWorker`. Each repetition waits until every agent has sent a summary and the gang's
`status.progress` shows its healthy rate, then makes the device of a node that holds exactly
one worker `--slow` times slower (the gang steps at its pace), and times:

- detect: the device slowed -> the worker listed in `status.progress.stragglers` (seen in a
  watch), against the goal forSeconds + 10 s;
- move: the device slowed -> the barrier of the new epoch open, the worker recreated on another
  node and the rest restarted in place;
- the gang's step rate: healthy, slowed and after the move, as the simulation runs it (its
  truth) and as `status.progress.stepsPerSecond` reports it (the first write 60 s after the
  barrier: every worker's rate then is of the new epoch), against the goal within 5% of healthy;
- every other rank named as a straggler during the run: false positives (goal 0).

**The soak** runs on simulated time, not the cluster: an hour of a gang of N (`--soak-hours`,
`--size`) through the agent's real `Tracker` (one poll a second, each at a new step whose
compute is 1 s +-10%, uniform, seeded; rank 0 checkpoints every 100 steps at 5x; one step in
2000 of any worker is a 3x hiccup), summaries every 30 s at each agent's own random phase (and
at once on a shift of the compute), over the wire format into the book's real fold, and the
controller's real judgement every 5 s. It reports how many times a worker was found straggling
(goal 0). An hour of N=1000 takes a few minutes of CPU this way; on the cluster it would take
the hour.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.apiclient import HttpClient, ssl_context
from agent.config import Config
from agent.direct import progress_body
from agent.progress import SHIFT_MIN_SECONDS, Reading, Tracker
from api.constants import LABEL_RANK
from api.v1alpha1 import StragglerSpec
from benchmarks.common import RESULTS, Progress, markdown_table, until_terminated, write_json
from benchmarks.scale.cluster import (
    World,
    ensure_cluster,
    make_nodes,
    start_gang,
    steady,
    teardown_gang,
)
from benchmarks.scale.observer import JobTracker, milestones, polled
from benchmarks.scale.settings import Settings
from controller.arrivals.book import ProgressReport
from controller.arrivals.server import parse_progress
from controller.k8s import NAMESPACES, NODES, JsonDict, Kube, NotFound
from controller.policy.straggler import judge
from localcluster.simkubelet import SimKubelet, SimProgress
from localcluster.tools import ControllerProcess, controller_kubeconfig, install_crd

STEPS_PER_SECOND = 1.0
COMPUTE_SECONDS = 0.6
JITTER = 0.1
SUMMARY_SECONDS = 30.0
"""The agents' summary period at N <= 1500 (`podspec.summary_seconds`)."""
RATE_SETTLE_SECONDS = 60.0
"""`status.progress.stepsPerSecond` read this long after a barrier: every worker's rate is then
of the epoch (each agent's first summary of it comes within its period)."""
GANG = "sg"


# -- the soak, on simulated time ------------------------------------------------------------


def soak(
    n: int,
    hours: float,
    spec: StragglerSpec,
    seed: int = 2026,
    pass_seconds: float = 5.0,
    slow: tuple[int, float, float] | None = None,
) -> dict[str, Any]:
    """Healthy workers with jitter, checkpoints and hiccups, through the real agent tracker,
    wire format, book fold and judgement on simulated time; how many stragglers were found.
    `slow` = (worker, from second, factor): one degraded device, the control that the soak
    would find one (`first_found_s`: when)."""
    rng = random.Random(seed)
    config = Config(job_name="soak", pod_name="soak-0", namespace="bench",
                    dir=Path(tempfile.gettempdir()), probe_port=None, pod_uid="u")  # fmt: skip
    trackers = [Tracker(None) for _ in range(n)]
    next_summary = [rng.uniform(0, SUMMARY_SECONDS) for _ in range(n)]
    sent_at = [-1e9] * n
    held: list[ProgressReport | None] = [None] * n
    t0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    found: list[tuple[float, int]] = []
    summaries = shifts = passes = 0
    seconds = int(hours * 3600)
    next_pass = pass_seconds
    for t in range(seconds):
        now = float(t)
        for r, tracker in enumerate(trackers):
            compute = COMPUTE_SECONDS * (1 + rng.uniform(-JITTER, JITTER))
            if r == 0 and t % 100 == 99:
                compute *= 5  # its checkpoint step
            elif rng.random() < 1 / 2000:
                compute *= 3  # a data-loader hiccup
            if slow is not None and r == slow[0] and t >= slow[1]:
                compute *= slow[2]
            tracker.observe(now, Reading(t + 1, compute=compute))
            due = now >= next_summary[r]
            shifted = not due and now - sent_at[r] >= SHIFT_MIN_SECONDS and tracker.shifted()
            if not (due or shifted):
                continue
            summary = tracker.summary(now)
            assert summary is not None
            posted = parse_progress(progress_body(config, 0, summary))
            report = posted.progress(t0 + now).folded(held[r])
            held[r] = report
            tracker.sent(now, summary)
            sent_at[r] = now
            summaries += 1
            shifts += shifted
            if due:
                next_summary[r] = now + SUMMARY_SECONDS
        if now >= next_pass:
            next_pass += pass_seconds
            passes += 1
            at = datetime.fromtimestamp(t0 + now, UTC)
            workers = [(r, h.view()) for r, h in enumerate(held) if h is not None]
            for s in judge([workers], spec, at, fresh_seconds=2 * SUMMARY_SECONDS + 10).stragglers:
                found.append((now, s.worker))
    return {
        "workers": n,
        "simulated_seconds": seconds,
        "seed": seed,
        "summaries": summaries,
        "shift_summaries": shifts,
        "passes": passes,
        "judgements": passes * n,
        "false_positives": len([w for _, w in found if slow is None or w != slow[0]]),
        "workers_named": sorted({w for _, w in found}),
        "first_found_s": min((t for t, _ in found), default=None),
    }


# -- the degraded device, on the sim cluster -------------------------------------------------


class StragglerTracker(JobTracker):
    """The job's epochs and barriers, when each rank was first listed a straggler at each epoch,
    and each `status.progress` write with its rate."""

    def __init__(self, kube: Kube, ns: str, name: str) -> None:
        super().__init__(kube, ns, name)
        self.listed_at: dict[int, float] = {}
        """Rank -> when it was first seen listed (the benchmark clears it before each rep)."""
        self.victims: set[int] = set()
        """The ranks whose device the benchmark slowed: expected in the list."""
        self.rates: list[tuple[float, int, float | None]] = []
        """(seen at, epoch, stepsPerSecond) of each new `status.progress` write."""
        self._written: Any = None

    def _seen(self, job: JsonDict) -> None:
        super()._seen(job)
        now = time.monotonic()
        st = self.status
        progress = st.get("progress") or {}
        for rank in progress.get("stragglers") or ():
            self.listed_at.setdefault(rank, now)
        if progress.get("updatedAt") != self._written:
            self._written = progress.get("updatedAt")
            self.rates.append((now, st.get("epoch", 0), progress.get("stepsPerSecond")))

    def rate_after(self, epoch: int, since: float) -> float | None:
        """The first rate written at `epoch` after `since`."""
        for seen, at, rate in self.rates:
            if at == epoch and seen >= since and rate is not None:
                return rate
        return None


def spec_of(ratio: float, for_seconds: int) -> JsonDict:
    return {
        "progress": {"straggler": {"ratio": ratio, "forSeconds": for_seconds}},
        "failurePolicy": {
            "rules": [{"action": "RecreateWorker", "onFailureClasses": ["Straggler"]}]
        },
    }


def summarised(sim: SimKubelet, epoch: int) -> int:
    """Agents at `epoch` that have sent a summary of it."""
    count = 0
    for w in sim.workers.values():
        a = w.agent
        if a is not None and a.state.epoch == epoch and a.progress is not None:
            count += a.progress.summaries > 0 and a.progress.tracker.reading is not None
    return count


async def degrade_once(
    w: World, tracker: StragglerTracker, rep: int, victim: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One repetition: the device of `victim` (a node of one worker) slowed, found, moved.
    Any other rank listed meanwhile, or while the gang was healthy before, is a false
    positive."""
    epoch = rep
    n = w.n
    await milestones(
        {"summarised": polled(lambda: summarised(w.s, epoch) == n)}, 120,
        Progress(f"N={n} #{rep + 1} agents' first summaries"),
        lambda: f"{summarised(w.s, epoch)}/{n} summarised",
    )  # fmt: skip
    barrier = tracker.barrier_at[epoch]
    await milestones(
        {"rate": lambda: time.monotonic() if tracker.rate_after(epoch, barrier +
                                                                RATE_SETTLE_SECONDS) else None},
        RATE_SETTLE_SECONDS + 90, Progress(f"N={n} #{rep + 1} healthy rate"), lambda: "",
    )  # fmt: skip
    healthy = tracker.rate_after(epoch, barrier + RATE_SETTLE_SECONDS)
    healthy_truth = 1 / w.s.step_seconds[GANG]
    name = next(p for p, pod in w.s.pods.items() if pod["spec"].get("nodeName") == victim)
    rank = int(w.s.pods[name]["metadata"]["labels"][LABEL_RANK])
    old_uid = w.s.pods[name]["metadata"]["uid"]
    # Named while the gang was healthy (an earlier rep's straggler is no news).
    others_before = set(tracker.listed_at) - tracker.victims
    tracker.listed_at.clear()
    tracker.victims.add(rank)
    t0 = time.monotonic()
    w.s.degrade(victim, args.slow)
    await asyncio.sleep(3.0)
    slowed_truth = 1 / w.s.step_seconds[GANG]
    marks = await milestones(
        {
            "listed": lambda: tracker.listed_at.get(rank),
            "epoch": lambda: tracker.epoch_at.get(epoch + 1),
            "barrier": lambda: tracker.barrier_at.get(epoch + 1),
        },
        args.for_seconds + 180,
        Progress(f"N={n} #{rep + 1} straggler {name} on {victim}"),
        lambda: f"epoch {tracker.status.get('epoch')}",
    )
    await steady(w, tracker, epoch + 1)
    moved = w.s.pods.get(name)
    after_truth = 1 / w.s.step_seconds[GANG]
    settled = marks["barrier"] + RATE_SETTLE_SECONDS
    await milestones(
        {"rate": lambda: time.monotonic() if tracker.rate_after(epoch + 1, settled) else None},
        RATE_SETTLE_SECONDS + 90, Progress(f"N={n} #{rep + 1} rate after"), lambda: "",
    )  # fmt: skip
    after = tracker.rate_after(epoch + 1, settled)
    last = tracker.status.get("lastRestart") or {}
    others = sorted(others_before | (set(tracker.listed_at) - tracker.victims))
    row = {
        "rep": rep,
        "victim": name,
        "node": victim,
        "detect_s": round(marks["listed"] - t0, 2),
        "move_s": round(marks["barrier"] - t0, 2),
        "restart_s": round(marks["barrier"] - marks["epoch"], 2),
        "trigger": (last.get("trigger") or {}).get("class"),
        "trigger_worker": (last.get("trigger") or {}).get("worker"),
        "recreated": last.get("recreated"),
        "moved_off": moved is not None
        and moved["metadata"]["uid"] != old_uid
        and moved["spec"].get("nodeName") != victim,
        "rate_truth": [round(healthy_truth, 4), round(slowed_truth, 4), round(after_truth, 4)],
        "rate_status": [healthy, after],
        "others_named": others,
    }
    print(
        f"  N={n} #{rep + 1}: {name} on {victim} listed after {row['detect_s']}s (forSeconds "
        f"{args.for_seconds}), moved after {row['move_s']}s; rate {healthy_truth:.3f} -> "
        f"{slowed_truth:.3f} -> {after_truth:.3f} steps/s (status {healthy} -> {after})",
        file=sys.stderr,
    )
    return row


async def on_cluster(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(sizes=[args.size], reps=args.reps, cluster=args.cluster, name=args.name)
    cluster, started = ensure_cluster(settings)
    install_crd(cluster)
    ctl = ControllerProcess(
        controller_kubeconfig(cluster), ["--log-level=info"],
        cluster.logs / "bench-straggler-controller.log", arrivals=True,
    )  # fmt: skip
    ctl.start()
    api = HttpClient(
        cluster.server,
        ssl_context=ssl_context(
            cluster.pki / "ca.crt", cluster.pki / "admin.crt", cluster.pki / "admin.key"
        ),
        max_idle=256,
        request_timeout=60.0,
    )
    rows: list[dict[str, Any]] = []
    try:
        ctl.wait_ready()
        async with await Kube.from_kubeconfig(cluster.kubeconfig, request_timeout=60) as kube:
            w = World(args.size, settings, cluster, kube, api, ctl)
            w.ns = f"bench-sg-{args.size}-{uuid.uuid4().hex[:6]}"
            await kube.create(NAMESPACES, {"metadata": {"name": w.ns}})
            await make_nodes(w)
            progress = SimProgress(STEPS_PER_SECOND, compute_seconds=COMPUTE_SECONDS,
                                   jitter=JITTER, seed=args.seed)  # fmt: skip
            w.sim = SimKubelet(
                api, w.ns, arrival_url=ctl.arrival_url, start_delay=1.3, progress=progress
            )
            sim_task = asyncio.create_task(w.sim.run())
            tracker = StragglerTracker(kube, w.ns, GANG)
            track_task = asyncio.create_task(tracker.run())
            try:
                spec = spec_of(args.ratio, args.for_seconds)
                took = await start_gang(w, GANG, "Process", tracker, spec=spec)
                print(f"  N={w.n} gang running in {took:.1f}s", file=sys.stderr)
                await steady(w, tracker, 0)
                for rep, victim in enumerate(w.victims[: args.reps]):
                    rows.append(await degrade_once(w, tracker, rep, victim, args))
                await teardown_gang(w, GANG)
            finally:
                track_task.cancel()
                sim_task.cancel()
                for task in (track_task, sim_task):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await w.s.close()
                for node in w.nodes:
                    with contextlib.suppress(NotFound):
                        await kube.delete(NODES, node)
                with contextlib.suppress(NotFound):
                    await kube.delete(NAMESPACES, w.ns)
    finally:
        ctl.stop()
        await api.close()
        if started and not args.keep:
            cluster.down(sys.stderr)
    return {"size": args.size, "rows": rows}


# -- the report -------------------------------------------------------------------------------


def report(args: argparse.Namespace, data: dict[str, Any]) -> str:
    lines = [f"# Stragglers at N = {args.size} ({datetime.now(UTC):%Y-%m-%d})", ""]
    lines.append(
        f"`spec.progress.straggler`: ratio {args.ratio}, forSeconds {args.for_seconds}; "
        f"rule `onFailureClasses: [Straggler]` -> `RecreateWorker`. Trainers: a step a second, "
        f"{COMPUTE_SECONDS} s of own compute +-{JITTER:.0%}; the slowed device computes "
        f"{args.slow}x. Agents summarise every {SUMMARY_SECONDS:g} s."
    )
    cluster = data.get("cluster")
    if cluster is not None:
        rows = cluster["rows"]
        table = [
            [
                r["rep"] + 1, r["victim"], r["detect_s"], r["move_s"], r["restart_s"],
                f"{r['trigger']} {r['trigger_worker']}", "yes" if r["moved_off"] else "NO",
                " -> ".join(f"{x:.3f}" for x in r["rate_truth"]),
                " -> ".join("-" if x is None else f"{x:.3f}" for x in r["rate_status"]),
                len(r["others_named"]),
            ]
            for r in rows
        ]  # fmt: skip
        lines += [
            "",
            "## The degraded device",
            "",
            markdown_table(
                [
                    "rep",
                    "worker",
                    "detect (s)",
                    "move (s)",
                    "epoch->barrier (s)",
                    "trigger",
                    "off its node",
                    "steps/s truth: healthy -> slowed -> after",
                    "status stepsPerSecond: before -> after",
                    "others named",
                ],
                table,
            ),
        ]
        if rows:
            detect = [r["detect_s"] for r in rows]
            recovered = [
                abs(r["rate_status"][1] / r["rate_status"][0] - 1)
                for r in rows
                if None not in r["rate_status"]
            ]
            lines += [
                "",
                f"Detection: median {statistics.median(detect):.1f} s, max {max(detect):.1f} s "
                f"(goal: forSeconds + 10 = {args.for_seconds + 10} s). Moved (device slowed -> "
                f"new barrier): median {statistics.median(r['move_s'] for r in rows):.1f} s. "
                "Step rate after the move against before, by the status: "
                + (f"within {max(recovered):.1%}" if recovered else "not measured")
                + " (goal: within 5%). Other workers named: "
                f"{sum(len(r['others_named']) for r in rows)} (goal 0).",
            ]
    soaked = data.get("soak")
    if soaked is not None:
        lines += [
            "",
            "## The soak (simulated time)",
            "",
            f"{soaked['workers']} workers for {soaked['simulated_seconds']} s of simulated time "
            f"(seed {soaked['seed']}): {soaked['summaries']} summaries "
            f"({soaked['shift_summaries']} sent early on a shift), {soaked['passes']} "
            f"judgements of the gang ({soaked['judgements']} of a worker): "
            f"**{soaked['false_positives']} stragglers found** (goal 0)"
            + (f", workers {soaked['workers_named']}" if soaked["workers_named"] else "")
            + ".",
        ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> int:
    data: dict[str, Any] = {"args": vars(args)}
    spec = StragglerSpec(ratio=args.ratio, for_seconds=args.for_seconds)
    if args.soak_hours > 0:
        started = time.monotonic()
        data["soak"] = soak(args.size, args.soak_hours, spec, seed=args.seed)
        data["soak"]["cpu_s"] = round(time.monotonic() - started, 1)
        print(f"soak: {data['soak']}", file=sys.stderr)
    if not args.soak_only:
        data["cluster"] = await on_cluster(args)
    text = report(args, data)
    write_json(args.name, data)
    path = RESULTS / f"{args.name}.md"
    path.write_text(text)
    print("\n" + text)
    print(f"results: {RESULTS / (args.name + '.json')}, {path}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.straggler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--size", type=int, default=1000, help="workers in the gang")
    p.add_argument("--reps", type=int, default=3, help="devices slowed, one after another")
    p.add_argument("--ratio", type=float, default=1.5, help="spec.progress.straggler.ratio")
    p.add_argument("--for-seconds", type=int, default=30, help="spec.progress.straggler.forSeconds")
    p.add_argument("--slow", type=float, default=2.0, help="the slowed device's compute factor")
    p.add_argument("--soak-hours", type=float, default=1.0, help="simulated hours (0: no soak)")
    p.add_argument("--soak-only", action="store_true", help="the soak alone, no cluster")
    p.add_argument("--seed", type=int, default=2026, help="the jitter's seed")
    p.add_argument("--cluster", default="bench", help="local sim cluster (started if down)")
    p.add_argument("--name", default="straggler", help="results file name in benchmarks/results")
    p.add_argument("--keep", action="store_true", help="leave a cluster this run started up")
    return asyncio.run(until_terminated(run(p.parse_args())))


if __name__ == "__main__":
    sys.exit(main())
