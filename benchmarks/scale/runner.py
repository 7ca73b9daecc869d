"""One scale run from end to end: per gang size, a namespace, its nodes and a simulated kubelet,
then each gang (in place, Process, Recreate) started, measured in every mode asked for and torn
down, then the peer's restarts of the same gang; the controller (and the peer's) runs as a
subprocess for the whole run."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import gc
import logging
import ssl
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from agent.apiclient import HttpClient, ssl_context
from benchmarks.scale import peer
from benchmarks.scale.cluster import (
    World,
    ensure_cluster,
    make_nodes,
    make_victims,
    start_gang,
    steady,
    teardown_gang,
)
from benchmarks.scale.controlplane import controller_manager_qps
from benchmarks.scale.floors import annotation_floor, floor
from benchmarks.scale.observer import CtlSample, JobTracker
from benchmarks.scale.report import report, report_data, size_table, write_results
from benchmarks.scale.scenarios import (
    Unfinished,
    gang_pods,
    hang,
    in_place,
    no_capacity,
    node_loss,
    node_lost,
    process,
    recreate,
    resize,
    steady_cost,
)
from benchmarks.scale.settings import (
    ANNOTATION,
    ANNOTATION_MAX_SIZE,
    HANG,
    HANG_SECONDS,
    HANG_STEPS_PER_SECOND,
    IN_PLACE_RAISED,
    IN_PLACE_TLS,
    JOBSET,
    JOBSET_RAISED,
    NODE_LOSS,
    NODE_LOSS_GANGS,
    NODE_LOSS_RESTART_MODES,
    NODE_LOST_SHRINK,
    NODE_LOST_SPARES,
    PROGRESS_TWINS,
    RESIZE,
    STEADY,
    STEADY_PROGRESS,
    TLS_MAX_SIZE,
    WITH_PROGRESS,
    Settings,
)
from benchmarks.scale.stats import summarize
from controller.k8s import NAMESPACES, NODES, SECRETS, AlreadyExists, JsonDict, Kube, NotFound
from controller.policy.podspec import summary_seconds
from controller.servingsecret import DEFAULT_SECRET as TLS_SECRET
from localcluster.cluster import Cluster
from localcluster.outofcluster import AddonProcess
from localcluster.simkubelet import SimKubelet, SimProgress
from localcluster.tools import SYSTEM_NS, ControllerProcess, controller_kubeconfig, install_crd


async def run_size(w: World) -> dict[str, Any]:
    w.ns = f"bench-rs-{w.n}-{uuid.uuid4().hex[:6]}"
    await w.kube.create(NAMESPACES, {"metadata": {"name": w.ns}})
    print(f"N={w.n}: namespace {w.ns}", file=sys.stderr)
    await make_nodes(w)
    direct = w.ctl.arrival_url
    # Trainers report, and agents follow them, only in the gangs measured with progress.
    twins = w.settings.progress
    reporting = frozenset({"hg"} | ({"pp", "pq"} if twins else set()))
    progress = (
        SimProgress(HANG_STEPS_PER_SECOND, jobs=reporting)
        if HANG in w.settings.modes or twins
        else None
    )
    w.sim = SimKubelet(
        w.api, w.ns, restart_delay=w.settings.restart_delay, arrival_url=direct,
        start_delay=w.settings.start_delay, progress=progress,
    )  # fmt: skip
    sim_task = asyncio.create_task(w.sim.run())
    rows: list[dict[str, Any]] = []
    startup: dict[str, float] = {}
    try:
        # The Pod gang last: its final measurement, arrival by annotation with N watches of
        # their own, loads the cluster most (at N=5000 it can starve KWOK's node heartbeats),
        # and must not spoil the gangs measured after it.
        # (gang, mode, whether its trainers report progress)
        gangs: list[tuple[str, str, bool]] = []
        if HANG in w.settings.modes:
            gangs.append(("hg", HANG, True))
        if "process" in w.settings.modes:
            gangs.append(("pr", "Process", False))
            if twins:
                gangs.append(("pq", "Process", True))
        if "recreate" in w.settings.modes:
            gangs.append(("rc", "Recreate", False))
        if twins and "in-place" in w.settings.modes:
            gangs.append(("pp", "Pod", True))
        for lost in NODE_LOSS:
            if lost in w.settings.modes:
                gangs.append((NODE_LOSS_GANGS[lost], lost, False))
        if set(w.settings.modes) - {"process", "recreate", HANG, *NODE_LOSS}:
            gangs.append(("ip", "Pod", False))
        for gang, mode, reports in gangs:
            name = mode + (WITH_PROGRESS if reports and mode != HANG else "")
            await run_gang(
                w, gang, mode, name, startup, rows,
                functools.partial(
                    measure_gang, w, gang=gang, mode=mode, rows=rows, reports=reports
                ),
            )  # fmt: skip
        if IN_PLACE_TLS in w.settings.modes and w.n <= TLS_MAX_SIZE:
            await measure_tls(w, startup, rows)
        # The peer last, on the same nodes, once GangJob's gangs are gone.
        if w.peer is not None and w.n <= w.settings.peer_max_size:
            await measure_peer(w, startup, rows)
    finally:
        sim_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sim_task
        await w.s.close()
        for node in w.nodes:
            with contextlib.suppress(NotFound):
                await w.kube.delete(NODES, node)
        with contextlib.suppress(NotFound):
            await w.kube.delete(NAMESPACES, w.ns)
    return summarize(w, rows, startup)


async def run_gang(
    w: World,
    gang: str,
    mode: str,
    name: str,
    startup: dict[str, float],
    rows: list[dict[str, Any]],
    measure: Callable[[JobTracker], Awaitable[None]],
) -> None:
    """Starts a gang of restart mode `mode`, measures it, tears it down; its startup time goes
    to `startup[name]`. A repetition that overran ends the gang's measurements."""
    tracker = JobTracker(w.kube, w.ns, gang)
    track_task = asyncio.create_task(tracker.run())
    spec = node_loss_spec(w, mode) if mode in NODE_LOSS else None
    if mode in NODE_LOSS:
        # Single-pod nodes of its own, two more than the repetitions: its pods prefer them,
        # and neither the coordinator's node nor the spare's is lost.
        await make_victims(w, gang, w.settings.reps + 2)
        mode = NODE_LOSS_RESTART_MODES.get(mode, "Process")
    # The hang gang: `Process` mode with `spec.progress.hangSeconds`.
    mode, hang_seconds = ("Process", HANG_SECONDS) if mode == HANG else (mode, None)
    try:
        cpu0 = CtlSample.take(w.ctl)
        # The in-place gang is elastic when it is resized too: its in-place restarts and its
        # resizes are then measured side by side, on one gang.
        if RESIZE in w.settings.modes and gang == "ip":
            spec = {"elastic": {"minReplicas": 1, "maxReplicas": w.n}}
        startup[name] = round(await start_gang(w, gang, mode, tracker, hang_seconds, spec), 2)
        reqs = CtlSample.take(w.ctl).since(cpu0)["requests"].get("all", 0)
        print(f"  N={w.n} {name} gang running in {startup[name]:.1f}s "
              f"({reqs} controller API requests)", file=sys.stderr)  # fmt: skip
        await steady(w, tracker, 0, pods=gang_pods(w, tracker))
        # Each repetition freezes the heap and runs without the collector
        # (`scenarios.no_collector`); the gang's objects are unfrozen with it, below.
        try:
            await measure(tracker)
        except Unfinished as e:
            rows.append(e.row)
            print(f"  N={w.n} {e}: no barrier within {e.row['limit_s']}s "
                  f"(waiting for {e.row['missing']}; {e.row['state']}); the rest "
                  f"of gang {gang} is skipped", file=sys.stderr)  # fmt: skip
        await teardown_gang(w, gang)
    finally:
        gc.unfreeze()
        track_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await track_task


async def measure_tls(w: World, startup: dict[str, float], rows: list[dict[str, Any]]) -> None:
    """In-place restarts of a gang of its own with the controller serving arrivals over TLS, as
    deployed: its own certificate (kept in the Secret of its namespace), on uvloop. The
    controller is restarted for it and back to plain HTTP after; the simulated agents of the
    gang trust the CA it hands their pods."""
    plain = w.ctl
    tls = ControllerProcess(
        plain.kubeconfig, [*plain.args, f"--leader-election-namespace={SYSTEM_NS}"],
        w.cluster.logs / "bench-restart-scale-controller-tls.log",
        arrivals=True, arrival_tls=True,
    )  # fmt: skip
    with contextlib.suppress(AlreadyExists):  # as manifests/manager makes it: empty
        await w.kube.create(
            SECRETS, {"metadata": {"name": TLS_SECRET}, "type": "Opaque"}, SYSTEM_NS
        )
    url, client = w.s.arrival_url, w.s.arrival_client
    plain.stop()
    tls.start()
    w.ctl = tls
    try:
        await asyncio.to_thread(tls.wait_ready)
        secret = await w.kube.get(SECRETS, TLS_SECRET, SYSTEM_NS)
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        assert tls.arrival_url is not None
        w.s.arrival_url = tls.arrival_url
        w.s.arrival_client = HttpClient(
            tls.arrival_url, ssl_context=ssl.create_default_context(cadata=ca),
            max_idle=64, request_timeout=30.0,
        )  # fmt: skip

        async def in_place_tls(tracker: JobTracker) -> None:
            for rep in range(w.settings.reps):
                rows.append(await in_place(w, tracker, rep, "it", IN_PLACE_TLS))

        await run_gang(w, "it", "Pod", "Pod (arrivals over TLS)", startup, rows, in_place_tls)
    finally:
        if w.s.arrival_client is not client and w.s.arrival_client is not None:
            await w.s.arrival_client.close()
        w.s.arrival_url, w.s.arrival_client = url, client
        tls.stop()
        plain.start()
        w.ctl = plain
        await asyncio.to_thread(plain.wait_ready)


async def measure_peer(w: World, startup: dict[str, float], rows: list[dict[str, Any]]) -> None:
    """JobSet's restarts at the controller-manager's defaults; then, with its client QPS
    raised, GangJob's in-place restart (if asked for) and JobSet's again, so that each pair
    compares at the same settings."""
    await peer.measure(w, JOBSET, rows)
    async with controller_manager_qps(w.cluster, w.settings.peer_qps):
        if "in-place" in w.settings.modes:

            async def in_place_raised(tracker: JobTracker) -> None:
                for rep in range(w.settings.reps):
                    rows.append(await in_place(w, tracker, rep, "iq", IN_PLACE_RAISED))

            name = f"Pod (controller-manager QPS {w.settings.peer_qps})"
            await run_gang(w, "iq", "Pod", name, startup, rows, in_place_raised)
        await peer.measure(w, JOBSET_RAISED, rows)


async def measure_gang(
    w: World,
    tracker: JobTracker,
    *,
    gang: str,
    mode: str,
    rows: list[dict[str, Any]],
    reports: bool = False,
) -> None:
    """Every measurement asked for on one running gang, appended to `rows` as it is taken.
    A gang whose trainers `reports` progress is `--progress`'s twin of its mode: the steady
    window (`Pod`), then its restarts under the twin's name."""
    reps, want, direct = w.settings.reps, w.settings.modes, w.s.arrival_url
    window = w.settings.progress_window
    if reports and mode == "Pod":
        # Every agent's summaries at their period before the window opens.
        settle = w.settings.progress_settle
        if settle is None:
            settle = summary_seconds(w.n) + 5.0
        rows.append(await steady_cost(w, tracker, STEADY_PROGRESS, window, settle))
        for rep in range(reps):
            rows.append(await in_place(w, tracker, rep, gang, PROGRESS_TWINS["in-place"]))
    elif reports and mode == "Process":
        for rep in range(reps):
            rows.append(await process(w, tracker, rep, PROGRESS_TWINS["process"]))
    elif mode == "Pod":
        if w.settings.progress and "in-place" in want:
            rows.append(await steady_cost(w, tracker, STEADY, window, 5.0))
        # annotation-floor first, on the gang as it started (it opens its own N watches).
        for rep in range(reps if "annotation-floor" in want else 0):
            rows.append(await annotation_floor(w, tracker, rep, gang))
        # Agents report arrivals to the controller (as deployed)...
        for rep in range(reps if "in-place" in want else 0):
            rows.append(await in_place(w, tracker, rep, gang))
        # ... the floor after them: its agents then hear of the gang through their report's
        # stream alone, as deployed ...
        for rep in range(reps if "floor" in want else 0):
            rows.append(await floor(w, tracker, rep, gang))
        for rep, node in enumerate(w.victims if "node-lost" in want else []):
            row = await node_lost(w, tracker, rep, node)
            if row is not None:
                rows.append(row)
        for rep in range(reps if RESIZE in want else 0):
            rows.extend(await resize(w, tracker, rep, gang))
        # ... then, side by side, by pod annotation and their own watches (the
        # agents restarted from here on get no endpoint).
        w.s.arrival_url = None
        try:
            by_annotation = ANNOTATION in want and w.n <= ANNOTATION_MAX_SIZE
            for rep in range(reps if by_annotation else 0):
                rows.append(await in_place(w, tracker, rep, gang, ANNOTATION))
        finally:
            w.s.arrival_url = direct  # for the next gang, even after an overrun
    elif mode == HANG:
        for rep in range(reps):
            rows.append(await hang(w, tracker, rep, HANG_SECONDS))
    elif mode in NODE_LOSS:
        victims = node_loss_victims(w, tracker, gang)[:reps]
        # The shrinking gang finds no room for any lost worker, repetition after repetition:
        # a new pod placed would be out of its world, a spare for the next loss.
        returns = mode != NODE_LOST_SHRINK
        async with no_capacity(w) if not returns else contextlib.nullcontext():
            for rep, node in enumerate(victims):
                row = await node_loss(w, tracker, rep, node, mode, capacity_returns=returns)
                if row is not None:
                    rows.append(row)
    elif mode == "Process":
        for rep in range(reps):
            rows.append(await process(w, tracker, rep))
    else:
        for rep in range(reps):
            rows.append(await recreate(w, tracker, rep))


def node_loss_spec(w: World, mode: str) -> JsonDict:
    """The gang of a node-loss mode: elastic with one spare, elastic going on at once without
    a lost worker (`waitSeconds: 0`), or not elastic; none grows back within the run."""
    elastic = {"minReplicas": 1, "maxReplicas": w.n, "growAfterSeconds": 3600}
    if mode in NODE_LOST_SPARES:
        return {"elastic": {**elastic, "spares": 1, "waitSeconds": 300}}
    if mode == NODE_LOST_SHRINK:
        return {"elastic": {**elastic, "waitSeconds": 0}}
    return {}


def node_loss_victims(w: World, tracker: JobTracker, gang: str) -> list[str]:
    """The gang's single-pod nodes whose loss is a member's, but the coordinator's: each
    holds one pod, of a worker in the world other than worker 0."""
    out = set(tracker.status.get("dropped") or []) | {0}
    keep = []
    for node in w.gang_victims:
        pods = [p for p in w.s.pods.values() if p["spec"].get("nodeName") == node]
        if len(pods) == 1 and int(pods[0]["metadata"]["name"].rsplit("-", 1)[1]) not in out:
            keep.append(node)
    return keep


async def run_on(cluster: Cluster, settings: Settings) -> dict[str, Any]:
    """Every size on a cluster that is up; returns the report's data."""
    install_crd(cluster)
    ctl = ControllerProcess(
        controller_kubeconfig(cluster), ["--log-level=info"],
        cluster.logs / "bench-restart-scale-controller.log", arrivals=True,
    )  # fmt: skip
    ctl.start()
    jobset: AddonProcess | None = None
    results: list[dict[str, Any]] = []
    # Thousands of agents share one client: keep enough connections for a burst of arrivals.
    api = HttpClient(
        cluster.server,
        ssl_context=ssl_context(
            cluster.pki / "ca.crt", cluster.pki / "admin.crt", cluster.pki / "admin.key"
        ),
        max_idle=256,
        request_timeout=60.0,
    )
    try:
        if "jobset" in settings.peers:
            jobset = peer.start(cluster)
        ctl.wait_ready()
        async with await Kube.from_kubeconfig(cluster.kubeconfig, request_timeout=60) as kube:
            for n in settings.sizes:
                print(f"\n== N = {n} ==", file=sys.stderr)
                w = World(n, settings, cluster, kube, api, ctl, peer=jobset)
                res = await run_size(w)
                results.append(res)
                print(f"\n{size_table(res, settings)}\n", file=sys.stderr)
                # Written after every size: a long run that fails later keeps what it measured.
                write_results(
                    settings, report_data(cluster, settings, results), settings.results_dir
                )
    finally:
        if jobset is not None:
            jobset.stop()
        ctl.stop()
        await api.close()
    return report_data(cluster, settings, results)


async def run(settings: Settings) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # Thousands of agents say the same thing (their gang deleted at teardown): errors only.
    logging.getLogger("agent").setLevel(logging.ERROR)
    cluster, started = ensure_cluster(settings)
    try:
        data = await run_on(cluster, settings)
    finally:
        if started and not settings.keep:
            cluster.down(sys.stderr)
    paths = write_results(settings, data, settings.results_dir)
    print("\n" + report(settings, data, data["results"]))
    for kind, path in paths.items():
        print(f"{kind}: {path or '(skipped)'}")
    return 0
