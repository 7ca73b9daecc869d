"""`python -m benchmarks.scale`: the command line of a scale run."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import benchmarks.scale
from benchmarks.common import until_terminated
from benchmarks.scale.report import rewrite_report
from benchmarks.scale.runner import run
from benchmarks.scale.settings import (
    ANNOTATION,
    ANNOTATION_MAX_SIZE,
    DEFAULT_MODES,
    HANG,
    IN_PLACE_TLS,
    NODE_LOSS,
    PEER_MAX_SIZE,
    PEER_QPS,
    PEERS,
    PROGRESS_WINDOW_S,
    SELECTABLE_MODES,
    TLS_MAX_SIZE,
    WAIT_BOUND_S,
    Settings,
)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                description=benchmarks.scale.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sizes", default="100,1000", help="gang sizes, comma-separated")
    p.add_argument("--with-5000", action="store_true", help="add N=5000 (a long run)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each measurement")
    p.add_argument(
        "--restart-delay",
        type=float,
        default=2.0,
        help="the simulated kubelet's whole-pod restart in seconds (measured: ~2)",
    )
    p.add_argument(
        "--start-delay",
        type=float,
        default=1.3,
        help="the simulated kubelet's start of a new pod in seconds (measured: 1.1-1.5)",
    )
    p.add_argument(
        "--scheduler-qps",
        type=int,
        help="raise the scheduler's client QPS (burst 2x) for a second set of figures",
    )
    p.add_argument(
        "--endpoint-batch",
        type=float,
        metavar="SECONDS",
        help="batch the controller-manager's Endpoints/EndpointSlice updates (default: not "
        "batched): every pod change behind the gang's headless Service costs those "
        "controllers a pass over all N pods",
    )
    p.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"measurements to take, comma-separated (default: all of {','.join(DEFAULT_MODES)}, "
        f"{IN_PLACE_TLS} at N <= {TLS_MAX_SIZE} and {ANNOTATION} at N <= {ANNOTATION_MAX_SIZE} "
        f"only; {HANG}, a hung trainer's detection and "
        f"restart, and {','.join(NODE_LOSS)}, a node lost with no room for its worker, only "
        "when named)",
    )
    p.add_argument(
        "--peers",
        default="",
        help=f"restart the same gang with these peers too, comma-separated ({','.join(PEERS)}): "
        "JobSet v0.12.0's failure-policy restart, with the controller-manager at its defaults "
        "and with its client QPS raised",
    )
    p.add_argument(
        "--peer-max-size",
        type=int,
        default=PEER_MAX_SIZE,
        help="the largest N the peers restart (default %(default)s: a JobSet restart at the "
        "controller-manager's defaults takes ~150 s at N=1000)",
    )
    p.add_argument(
        "--peer-qps",
        type=int,
        default=PEER_QPS,
        help="the controller-manager's client QPS for the peer's second row (burst 2x; "
        "default %(default)s)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="measure in-place and process again with every trainer reporting progress (its "
        "agent summarising to the controller), side by side, and the controller's CPU, API "
        "requests, GangJob writes and progress summaries over a steady window with and "
        "without",
    )
    p.add_argument(
        "--progress-window",
        type=float,
        default=PROGRESS_WINDOW_S,
        metavar="SECONDS",
        help="the steady window of --progress (default %(default)s)",
    )
    p.add_argument(
        "--wait-bound",
        type=float,
        default=WAIT_BOUND_S,
        metavar="SECONDS",
        help="how long node-lost-wait watches the gang wait (default %(default)s)",
    )
    p.add_argument("--cluster", default="bench", help="local cluster to use (started if down)")
    p.add_argument(
        "--name",
        default="restart_scale",
        help="the results' file name in benchmarks/results (default %(default)s), so that runs "
        "side by side keep their own",
    )
    p.add_argument("--keep", action="store_true", help="leave a cluster this run started up")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="sample this process with py-spy over each measured restart, into "
        "DIR/N<n>-<mode>-<rep>.txt (collapsed stacks; the run's timings are then not the "
        "benchmark's)",
    )
    p.add_argument(
        "--py-spy-controller",
        type=Path,
        metavar="DIR",
        help="sample the controller with py-spy over each measured restart, into "
        "DIR/N<n>-<mode>-<rep>.txt (collapsed stacks; its CPU then shares the cores with "
        "py-spy's)",
    )
    p.add_argument(
        "--rewrite-report",
        type=Path,
        metavar="JSON",
        help="run nothing: judge the results JSON of an earlier run with this checkout's goals "
        "and write its markdown report again beside it",
    )
    a = p.parse_args()
    if a.rewrite_report is not None:
        print(rewrite_report(a.rewrite_report))
        return 0
    modes = tuple(m for m in a.modes.split(",") if m)
    if not modes or set(modes) - set(SELECTABLE_MODES):
        p.error(f"--modes: choose from {','.join(SELECTABLE_MODES)}")
    peers = tuple(x for x in a.peers.split(",") if x)
    if set(peers) - set(PEERS):
        p.error(f"--peers: choose from {','.join(PEERS)}")
    sizes = [int(s) for s in a.sizes.split(",") if s]
    if a.with_5000 and 5000 not in sizes:
        sizes.append(5000)
    settings = Settings(
        sizes=sizes, reps=a.reps, restart_delay=a.restart_delay, start_delay=a.start_delay,
        modes=modes, peers=peers, peer_max_size=a.peer_max_size, peer_qps=a.peer_qps,
        scheduler_qps=a.scheduler_qps, endpoint_batch=a.endpoint_batch,
        cluster=a.cluster, keep=a.keep, name=a.name, progress=a.progress,
        progress_window=a.progress_window, py_spy=a.py_spy,
        py_spy_controller=a.py_spy_controller, wait_bound=a.wait_bound,
    )  # fmt: skip
    return asyncio.run(until_terminated(run(settings)))
