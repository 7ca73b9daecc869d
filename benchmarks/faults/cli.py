"""`python -m benchmarks.faults`: the command line of a fault campaign."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import sys
from pathlib import Path
from typing import TypeVar

import benchmarks.faults
from benchmarks.common import until_terminated
from benchmarks.faults import report
from benchmarks.faults.runner import FULL_SHAPES, SHORT_SHAPES, Settings, run
from benchmarks.faults.schedule import KINDS

T = TypeVar("T")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.faults",
        description=benchmarks.faults.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=1, help="orders the faults (default %(default)s)")
    p.add_argument("--faults", type=int, default=105, help="faults to inject (default %(default)s)")
    p.add_argument(
        "--short", action="store_true", help="two small gangs instead of four (the test's campaign)"
    )
    p.add_argument("--cluster", default="faults", help="local sim cluster (started if down)")
    p.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="the controllers' Lease duration in seconds: what a failover waits for "
        "(default %(default)s, the controller's own)",
    )
    p.add_argument(
        "--restart-delay",
        type=float,
        default=0.5,
        help="the simulated whole-pod restart in seconds (default %(default)s)",
    )
    p.add_argument(
        "--report",
        type=Path,
        default=report.REPORT,
        help="where the report goes (default docs/reliability.md); '-' for none",
    )
    p.add_argument("--logs", type=Path, help="directory for the controllers' logs")
    p.add_argument(
        "--log-level",
        default="error",
        choices=["debug", "info", "warning", "error"],
        help="of this process: the agents and the simulated kubelet (default error)",
    )
    p.add_argument("--kinds", default="", help="only these fault kinds, comma-separated")
    p.add_argument("--keep", action="store_true", help="leave a cluster this run started up")
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    if set(kinds) - set(KINDS):
        p.error(f"--kinds: choose from {','.join(KINDS)}")
    # Thousands of agents' retries while the apiserver or the controller is down say nothing
    # the report does not: only errors, and the campaign's own lines.
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = Settings(
        seed=a.seed,
        faults=a.faults,
        cluster=a.cluster,
        shapes=SHORT_SHAPES if a.short else FULL_SHAPES,
        restart_delay=a.restart_delay,
        lease_duration=a.lease_duration,
        logs=a.logs,
        keep=a.keep,
        kinds=kinds or None,
    )
    try:
        result = asyncio.run(until_terminated(run(settings)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("stopped: no report written", file=sys.stderr)
        return 130
    command = "python -m benchmarks.faults " + shlex.join(
        [
            f"--seed={a.seed}",
            f"--faults={a.faults}",
            *(["--short"] if a.short else []),
            *([f"--lease-duration={a.lease_duration:g}"] if a.lease_duration != 15.0 else []),
            *([f"--kinds={a.kinds}"] if kinds else []),
        ]
    )
    if str(a.report) != "-":
        print(f"report: {report.write(result, command, a.report)}", file=sys.stderr)
    for row in result.by_kind():
        print(
            f"  {row['kind']}: {row['recovered']}/{row['injected']} recovered, "
            f"{row['violations']} violations",
            file=sys.stderr,
        )
    for v in result.violations:
        print(f"VIOLATION {v.invariant} {v.job}: {v.detail}", file=sys.stderr)
    print(
        f"seed {a.seed}: {len(result.rows)} faults, "
        f"{sum(r.recovered for r in result.rows)} recovered, "
        f"{len(result.violations)} violations",
        file=sys.stderr,
    )
    return 0 if result.ok else 1
