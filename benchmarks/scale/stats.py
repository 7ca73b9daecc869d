"""The figures of one gang size: per mode, the median and p90 (nearest rank) of the restart
time, of each step and of the controller's share, CPU and API requests, over the repetitions
that finished; Recreate against in place, and in place against its floor."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from benchmarks.scale.cluster import World
from benchmarks.scale.settings import MODES


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile (the max below 10 samples)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _stat(values: Iterable[float | None]) -> dict[str, float] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 3), "p90": round(p90(vals), 3)}


def summarize(w: World, rows: list[dict[str, Any]], startup: dict[str, float]) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for mode in MODES:
        every = [r for r in rows if r["mode"] == mode]
        if not every:
            continue
        mine = [r for r in every if not r.get("unfinished")]
        step_names = list(max(every, key=lambda r: len(r["steps"]))["steps"])
        modes[mode] = {
            "reps": len(mine),
            # Repetitions that overran their limit: no time, only that it exceeded the limit.
            "unfinished_over_s": [r["limit_s"] for r in every if r.get("unfinished")],
            "seconds": _stat(r["seconds"] for r in mine),
            "steps": {s: _stat(r["steps"].get(s) for r in mine) for s in step_names},
            "controller_share_s": {
                s: _stat(r["controller"]["share_s"].get(s) for r in mine)
                for s in ("bump", "barrier")
            },
            "controller_cpu_s": _stat(r["controller"]["cpu_s"] for r in mine),
            "api_requests": _stat(r["controller"]["requests"].get("all", 0) for r in mine),
            "api_requests_by_method": {
                m: statistics.median(r["controller"]["requests"].get(m, 0) for r in mine)
                for m in ("GET", "LIST", "POST", "PATCH", "DELETE")
            }
            if mine
            else {},
        }
    rc = modes.get("recreate")

    def over(mode: str) -> float | None:
        ip = modes.get(mode)
        if ip and rc and ip["seconds"] and rc["seconds"] and ip["seconds"]["median"]:
            return round(float(rc["seconds"]["median"]) / float(ip["seconds"]["median"]), 2)
        return None

    ratio, ratio_annotation = over("in-place"), over("in-place-annotation")
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
    return {
        "workers": w.n,
        "startup_s": startup,
        "modes": modes,
        "recreate_over_in_place": ratio,
        "recreate_over_in_place_annotation": ratio_annotation,
        "in_place_to_open_s": to_open,
        "in_place_over_floor": above_floor,
        "controller_rss_max_mib": round(w.rss_max, 1),
        "runs": rows,
    }
