"""The figures of one gang size: per mode, the median and p90 (nearest rank) of the restart
time, of each step, of the CPU each process spent within it, and of the controller's share, CPU
and API requests, over the repetitions that finished; Recreate, Process mode and the peer
against in place, and in place against its floor."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks.scale.cluster import World
from benchmarks.scale.settings import (
    HANG,
    HANG_SECONDS,
    IN_PLACE_RAISED,
    IN_PLACE_TLS,
    JOBSET,
    JOBSET_RAISED,
    PROGRESS_TWINS,
    REPORTED_MODES,
    STEADY,
    STEADY_PROGRESS,
)


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile (the max below 10 samples)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _stat(values: Iterable[float | None]) -> dict[str, float] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 3), "p90": round(p90(vals), 3)}


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def _apiserver(samples: list[dict[str, dict[str, int]]]) -> dict[str, float | None]:
    """The apiserver's traffic in a restart, every client's (medians over the repetitions):
    requests, pod status writes (the kubelets'), GangJob writes, and watch bytes sent."""

    def med(pick: Callable[[dict[str, dict[str, int]]], float]) -> float | None:
        return _median(pick(s) for s in samples) if samples else None

    def count(s: dict[str, dict[str, int]], verbs: tuple[str, ...], resource: str) -> int:
        return sum(s["requests"].get(f"{v} {resource}", 0) for v in verbs)

    writes = ("PATCH", "PUT", "APPLY")
    return {
        "requests": med(lambda s: sum(s["requests"].values())),
        "pod_status_writes": med(lambda s: count(s, writes, "pods/status")),
        "gangjob_writes": med(
            lambda s: count(s, writes, "gangjobs") + count(s, writes, "gangjobs/status")
        ),
        "watch_bytes": med(lambda s: sum(s["watch_bytes"].values())),
        "pod_watch_bytes": med(lambda s: s["watch_bytes"].get("pods", 0)),
    }


def summarize(w: World, rows: list[dict[str, Any]], startup: dict[str, float]) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for mode in REPORTED_MODES:
        every = [r for r in rows if r["mode"] == mode]
        if not every:
            continue
        mine = [r for r in every if not r.get("unfinished")]
        ctl = [r["controller"] for r in mine if "controller" in r]
        step_names = list(max(every, key=lambda r: len(r["steps"]))["steps"])
        procs = sorted({p for r in mine for p in r.get("cpu_s", {})})
        modes[mode] = {
            "reps": len(mine),
            # Repetitions that overran their limit: no time, only that it exceeded the limit.
            "unfinished_over_s": [r["limit_s"] for r in every if r.get("unfinished")],
            "seconds": _stat(r["seconds"] for r in mine),
            "steps": {s: _stat(r["steps"].get(s) for r in mine) for s in step_names},
            # This process's CPU within the restart's span (the simulation's share), and the
            # restart time less it: what a cluster whose kubelets and agents run elsewhere
            # might see.
            "bench_cpu_s": _stat(r.get("bench_cpu_s") for r in mine),
            "seconds_minus_bench_cpu": _stat(r.get("seconds_minus_bench_cpu") for r in mine),
            "cpu_s": {p: _median(r.get("cpu_s", {}).get(p) for r in mine) for p in procs},
            "controller_share_s": {
                s: _stat(c["share_s"].get(s) for c in ctl)
                for s in ("bump", "barrier", "bump-write", "barrier-write")
            },
            "controller_cpu_s": _stat(c["cpu_s"] for c in ctl),
            "api_requests": _stat(c["requests"].get("all", 0) for c in ctl),
            "apiserver": _apiserver([r["apiserver"] for r in mine if "apiserver" in r]),
            "api_requests_by_method": {
                m: statistics.median(c["requests"].get(m, 0) for c in ctl)
                for m in ("GET", "LIST", "POST", "PATCH", "DELETE")
            }
            if ctl
            else {},
        }

    def over(slow: str, fast: str) -> float | None:
        """How many times slower `slow` is than `fast` (their medians)."""
        a, b = (modes.get(slow) or {}).get("seconds"), (modes.get(fast) or {}).get("seconds")
        if a and b and b["median"]:
            return round(float(a["median"]) / float(b["median"]), 2)
        return None

    # floor runs to every agent past the barrier: the in-place restart is held against it over
    # the same span, from the failure visible to every agent's barrier open.
    to_open = _stat(
        r["seconds"] + r["steps"]["barrier->open"]
        for r in rows
        if r["mode"] == "in-place" and not r.get("unfinished")
    )
    fl = (modes.get("floor") or {}).get("seconds")
    above_floor = (
        round(to_open["median"] / fl["median"], 2) if to_open and fl and fl["median"] else None
    )
    hangs = [r for r in rows if r["mode"] == HANG and not r.get("unfinished")]
    hang = {
        "hang_seconds": HANG_SECONDS,
        "detection_s": _stat(r["detection_s"] for r in hangs),
        "restart_s": _stat(r["restart_s"] for r in hangs),
        # The trigger named the hung worker (its pod `<job>-<rank>`) as class Hang.
        "named_hung": sum(
            r["trigger"] == "Hang" and str(r["named_worker"]) == r["worker"].rsplit("-", 1)[1]
            for r in hangs
        ),
        "reps": len(hangs),
    }
    return {
        "workers": w.n,
        "startup_s": startup,
        "modes": modes,
        "hang": hang if hangs else None,
        "progress_cost": progress_cost(rows),
        "in_place_progress_over_in_place": over(PROGRESS_TWINS["in-place"], "in-place"),
        "in_place_tls_over_in_place": over(IN_PLACE_TLS, "in-place"),
        "process_progress_over_process": over(PROGRESS_TWINS["process"], "process"),
        "recreate_over_in_place": over("recreate", "in-place"),
        "recreate_over_in_place_annotation": over("recreate", "in-place-annotation"),
        "process_over_in_place": over("process", "in-place"),
        "jobset_over_in_place": over(JOBSET, "in-place"),
        "jobset_raised_over_in_place": over(JOBSET_RAISED, "in-place"),
        "jobset_raised_over_in_place_raised": over(JOBSET_RAISED, IN_PLACE_RAISED),
        "in_place_to_open_s": to_open,
        "in_place_over_floor": above_floor,
        "controller_rss_max_mib": round(w.rss_max, 1),
        "runs": rows,
    }


def progress_cost(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`--progress`: the steady windows side by side, and what progress adds: the controller's
    CPU (as a share of a core, and per summary accepted), the GangJob's writes per 30 s and the
    summaries per second. None unless the window with progress was measured."""
    by = {r["mode"]: r for r in rows if r["mode"] in (STEADY, STEADY_PROGRESS)}
    on, off = by.get(STEADY_PROGRESS), by.get(STEADY)
    if on is None:
        return None
    added = on["cpu_share"] - (off["cpu_share"] if off is not None else 0.0)
    return {
        "window_s": on["window_s"],
        "cpu_share": on["cpu_share"],
        "cpu_share_without": off["cpu_share"] if off is not None else None,
        "added_cpu_share": round(added, 4),
        "cpu_per_report_ms": (
            round(1000 * added * on["window_s"] / on["reports"], 3) if on["reports"] else None
        ),
        "reports": on["reports"],
        "reports_per_s": on["reports_per_s"],
        "job_writes": on["job_writes"],
        "job_writes_per_30s": on["job_writes_per_30s"],
        "job_writes_without": off["job_writes"] if off is not None else None,
        "api_requests": on["controller"]["requests"],
        "api_requests_without": off["controller"]["requests"] if off is not None else None,
        "passes": on.get("passes"),
        "passes_without": off.get("passes") if off is not None else None,
    }
