"""What a scale run writes: the markdown report (per size a table of every mode, then the goals),
the JSON of every figure and repetition, and the PNG of restart time against gang size."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, markdown_table, write_json
from benchmarks.plot import plot_lines
from benchmarks.scale.settings import (
    ANNOTATION_FLOOR_CONCURRENCY,
    GOAL_RATIO,
    GOAL_RATIO_AT,
    GOAL_SHARE,
    MODES,
    PODS_PER_NODE,
    Settings,
)
from localcluster.cluster import Cluster


def fmt(stat: dict[str, float] | None) -> str:
    return "-" if stat is None else f"{stat['median']:.2f} / {stat['p90']:.2f}"


def overran(res: dict[str, Any]) -> str:
    """A caveat for figures taken over finished repetitions only, or "" if all finished."""
    over = [
        f"{mode} {len(m['unfinished_over_s'])} (> {max(m['unfinished_over_s']):g} s)"
        for mode, m in res["modes"].items()
        if m.get("unfinished_over_s")
    ]
    return f" (finished repetitions only; overran: {', '.join(over)})" if over else ""


def reps_text(m: dict[str, Any]) -> str:
    """Finished repetitions, and any that overran: "2 + 1 unfinished (> 1180 s)"."""
    over = m.get("unfinished_over_s") or []
    if not over:
        return str(m["reps"])
    return f"{m['reps']} + {len(over)} unfinished (> {max(over):g} s)"


RATIOS = {
    "in-place": ("in-place / floor", "in_place_over_floor"),
    "recreate": ("Recreate / in-place", "recreate_over_in_place"),
    "in-place-annotation": ("Recreate / in-place-annotation", "recreate_over_in_place_annotation"),
}
"""The ratio of medians a mode's row shows: its label, and its key in the results."""


def ratio_text(res: dict[str, Any], mode: str) -> str:
    label, key = RATIOS.get(mode, ("", ""))
    value = res.get(key) if key else None
    return f"{label} {value}x" if value is not None else "-"


def size_table(res: dict[str, Any]) -> str:
    rows = []
    for mode, m in res["modes"].items():
        share = m["controller_share_s"]
        steps = ", ".join(f"{k} {v['median']:.2f}" for k, v in m["steps"].items() if v is not None)
        rows.append([
            mode, reps_text(m), fmt(m["seconds"]), ratio_text(res, mode), steps,
            fmt(share["bump"]), fmt(share["barrier"]),
            fmt(m["controller_cpu_s"]), fmt(m["api_requests"]),
        ])  # fmt: skip
    return markdown_table(
        ["mode", "reps", "median / p90 (s)", "ratio (medians)", "steps, median (s)",
         "ctl share: failure->epoch", "ctl share: last arrival->barrier", "ctl CPU (s)",
         "ctl API requests"],
        rows,
    )  # fmt: skip


def goals_text(results: list[dict[str, Any]]) -> str:
    lines = []
    for res in results:
        n = res["workers"]
        share = res["modes"].get("in-place", {}).get("controller_share_s", {})
        total = sum((share.get(s) or {}).get("median", 0.0) for s in ("bump", "barrier"))
        goal_n = " (goal applies)" if n == GOAL_RATIO_AT else ""
        lines.append(
            f"- N={n}{goal_n}: Recreate / in-place = {res['recreate_over_in_place']}x "
            f"(goal >= {GOAL_RATIO:.0f}x at N={GOAL_RATIO_AT}); controller share "
            f"{total:.2f}s (failure->epoch + last arrival->barrier, medians; goal <= "
            f"{GOAL_SHARE:.0f}s at N={GOAL_RATIO_AT}){overran(res)}"
        )
    return "\n".join(lines)


def report(settings: Settings, meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    parts = [
        f"# Gang restart at scale on sim: in place vs Recreate ({meta['date']})",
        "",
        f"Cluster: {meta['cluster']}. Simulated kubelet (delays measured on the real node): "
        f"whole-pod KEP-5532 restart {settings.restart_delay}s, start of a new pod "
        f"{settings.start_delay}s. {settings.reps} repetitions per mode. Times are "
        "from the failure visible in the API (the kubelet's status write) to the barrier open "
        "(`status.barrierEpoch` seen in a watch). in-place and node-lost: agents report "
        "arrivals to the controller's endpoint and read the job's state from its answer (as "
        "deployed); in-place-annotation: the same restart with arrival by pod annotation and "
        "each agent's own watch of its GangJob.",
        "",
        "floor = the protocol's physical limit in place, measured with the real pieces minus "
        "the controller's decisions: this process writes `status.epoch` = E+1 itself (no "
        "failure to detect, classify and decide on), and floor is the time from that write "
        "until every agent saw E+1 through its report's stream (the controller's cache fanning "
        "the one write out), every pod restarted in place (the simulated kubelet's restart "
        "delay) and every agent's arrival report at E+1 was accepted by the controller's "
        "endpoint (`arrived`), plus the time from the barrier write seen in this process's "
        "watch until every agent saw it open. Left out: `arrived->barrier`, the controller "
        "counting the arrivals and writing the barrier (its decision; the write's own latency "
        "falls there too). in-place / floor holds the in-place restart over the same span, "
        "from the failure visible to every agent past the barrier (its median + "
        "`barrier->open`) against floor. annotation-floor = N pod annotation patches "
        f"({ANNOTATION_FLOOR_CONCURRENCY} in flight) + one GangJob write seen by all N agents' "
        "own watches: the least that arrival by annotation costs.",
        "",
    ]
    for res in results:
        by_annotation = res.get("recreate_over_in_place_annotation")
        above_floor = res.get("in_place_over_floor")
        parts += [
            f"## N = {res['workers']}",
            "",
            f"Gang startup: {res['startup_s']} s; controller RSS max "
            f"{res['controller_rss_max_mib']} MiB; Recreate / in-place = "
            f"**{res['recreate_over_in_place']}x**"
            + (f" (by annotation: {by_annotation}x)" if by_annotation is not None else "")
            + (f"; in-place / floor = **{above_floor}x**" if above_floor is not None else "")
            + overran(res),
            "",
            size_table(res),
            "",
        ]
    parts += ["## Goals (printed, not asserted)", "", goals_text(results), ""]
    return "\n".join(parts)


def write_plot(path: Path, settings: Settings, results: list[dict[str, Any]]) -> Path | None:
    series: dict[str, list[tuple[int, float, float]]] = {}
    for mode in MODES:
        for res in results:
            m = res["modes"].get(mode)
            if m and m["seconds"]:
                series.setdefault(mode, []).append(
                    (res["workers"], m["seconds"]["median"], m["seconds"]["p90"])
                )
    goal = {
        res["workers"]: res["modes"]["recreate"]["seconds"]["median"] / GOAL_RATIO
        for res in results
        if (res["modes"].get("recreate") or {}).get("seconds")
    }
    qps = settings.scheduler_qps or "default"
    batch = f", endpoint batch {settings.endpoint_batch:g} s" if settings.endpoint_batch else ""
    return plot_lines(
        path,
        f"GangJob restart, failure visible -> barrier open (sim, scheduler QPS {qps}{batch})",
        series,
        [(f"goal: Recreate / {GOAL_RATIO:.0f}", goal)],
    )


def report_data(
    cluster: Cluster, settings: Settings, results: list[dict[str, Any]]
) -> dict[str, Any]:
    opts = cluster.load().get("options", {})
    qps = opts.get("scheduler_qps")
    batch = opts.get("endpoint_batch_seconds")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cluster": (
            f"sim profile, 1.36.2 apiserver/controller-manager/scheduler with default flags "
            f"(apiserver max-requests-inflight 400, max-mutating-requests-inflight 200; "
            f"controller-manager client QPS default"
            f"{f', endpoint and endpointslice updates batched {batch:g} s' if batch else ''}"
            "), scheduler client QPS "
            f"{qps or 'default (50, burst 100)'}"
            f"{f', burst {2 * qps}' if qps else ''}; KWOK nodes of {PODS_PER_NODE} pods; "
            "controller: 4 reconcile workers, default flags"
        ),
        "settings": {
            "restart_delay_s": settings.restart_delay,
            "start_delay_s": settings.start_delay,
            "reps": settings.reps,
            "scheduler_qps": qps,
            "endpoint_batch_s": batch,
            "annotation_floor_concurrency": ANNOTATION_FLOOR_CONCURRENCY,
        },
        "goals": {
            "recreate_over_in_place_min": GOAL_RATIO,
            "controller_share_max_s": GOAL_SHARE,
            "at_workers": GOAL_RATIO_AT,
        },
        "results": results,
    }


def write_results(
    settings: Settings, data: dict[str, Any], directory: Path = RESULTS
) -> dict[str, Path | None]:
    """The JSON, the markdown report and the PNG plot, side by side in `directory`."""
    name = settings.name + (f"-qps{settings.scheduler_qps}" if settings.scheduler_qps else "")
    name += f"-epbatch{settings.endpoint_batch:g}" if settings.endpoint_batch else ""
    directory.mkdir(parents=True, exist_ok=True)
    md_path = directory / f"{name}.md"
    md_path.write_text(report(settings, data, data["results"]))
    return {
        "json": write_json(name, data, directory),
        "markdown": md_path,
        "png": write_plot(directory / f"{name}.png", settings, data["results"]),
    }
