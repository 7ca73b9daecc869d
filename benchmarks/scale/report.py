"""What a scale run writes: the markdown report (a summary across sizes, per size a table of
every mode and where its CPU went, then the goals), the JSON of every figure and repetition,
and the PNG of restart time against gang size."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, markdown_table, write_json
from benchmarks.plot import plot_lines
from benchmarks.scale.cpu import BENCH
from benchmarks.scale.goals import RECREATE_OVER_IN_PLACE_MIN, verdicts
from benchmarks.scale.peer import CONTROLLER_MANAGER_RATES, SCHEDULER_RATE, STEPS
from benchmarks.scale.settings import (
    ANNOTATION_FLOOR_CONCURRENCY,
    ANNOTATION_MAX_SIZE,
    DEFAULT_MODES,
    HANG,
    HANG_SECONDS,
    HANG_STEPS_PER_SECOND,
    IN_PLACE_RAISED,
    IN_PLACE_TLS,
    JOBSET,
    JOBSET_RAISED,
    PEER_MAX_SIZE,
    PEER_MODES,
    PEER_QPS,
    PODS_PER_NODE,
    PROGRESS_TWINS,
    PROGRESS_WINDOW_S,
    REPORTED_MODES,
    Settings,
)
from localcluster.cluster import Cluster


def fmt(stat: dict[str, float] | None) -> str:
    return "-" if stat is None else f"{stat['median']:.2f} / {stat['p90']:.2f}"


def med(stat: dict[str, float] | None) -> str:
    return "-" if stat is None else f"{stat['median']:.2f}"


def label(mode: str, settings: Settings) -> str:
    """How the report names a mode."""
    if mode == JOBSET:
        return "JobSet"
    if mode == JOBSET_RAISED:
        return f"JobSet (QPS {settings.peer_qps})"
    if mode == IN_PLACE_RAISED:
        return f"in-place (QPS {settings.peer_qps})"
    return mode


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
    "process": ("process / in-place", "process_over_in_place"),
    "recreate": ("Recreate / in-place", "recreate_over_in_place"),
    "in-place-annotation": ("Recreate / in-place-annotation", "recreate_over_in_place_annotation"),
    JOBSET: ("JobSet / in-place", "jobset_over_in_place"),
    JOBSET_RAISED: ("JobSet (QPS {qps}) / in-place", "jobset_raised_over_in_place"),
    IN_PLACE_RAISED: (
        "JobSet (QPS {qps}) / in-place (QPS {qps})",
        "jobset_raised_over_in_place_raised",
    ),
    PROGRESS_TWINS["in-place"]: (
        "in-place+progress / in-place",
        "in_place_progress_over_in_place",
    ),
    PROGRESS_TWINS["process"]: ("process+progress / process", "process_progress_over_process"),
    IN_PLACE_TLS: ("in-place-tls / in-place", "in_place_tls_over_in_place"),
}
"""The ratio of medians a mode's row shows: its label, and its key in the results."""


def ratio_name(mode: str, settings: Settings) -> str:
    return RATIOS[mode][0].format(qps=settings.peer_qps)


def ratio_text(res: dict[str, Any], mode: str, settings: Settings) -> str:
    key = RATIOS[mode][1] if mode in RATIOS else ""
    value = res.get(key) if key else None
    return f"{ratio_name(mode, settings)} {value}x" if value is not None else "-"


def size_table(res: dict[str, Any], settings: Settings) -> str:
    rows = []
    for mode, m in res["modes"].items():
        share = m["controller_share_s"]
        steps = ", ".join(f"{k} {v['median']:.2f}" for k, v in m["steps"].items() if v is not None)
        rows.append([
            label(mode, settings), reps_text(m), fmt(m["seconds"]),
            ratio_text(res, mode, settings), steps,
            fmt(m.get("bench_cpu_s")), fmt(m.get("seconds_minus_bench_cpu")),
            fmt(share["bump"]), fmt(share["barrier"]),
            fmt(m["controller_cpu_s"]), fmt(m["api_requests"]),
        ])  # fmt: skip
    return markdown_table(
        ["mode", "reps", "median / p90 (s)", "ratio (medians)", "steps, median (s)",
         "bench CPU (s)", "minus bench CPU (s, est.)",
         "ctl share: failure->epoch", "ctl share: last arrival->barrier", "ctl CPU (s)",
         "ctl API requests"],
        rows,
    )  # fmt: skip


def apiserver_table(res: dict[str, Any], settings: Settings) -> str:
    """Per mode, the apiserver's traffic within one restart, every client's (medians)."""
    counts = ("requests", "pod_status_writes", "gangjob_writes")
    sizes = ("watch_bytes", "pod_watch_bytes")
    rows = [
        [
            label(mode, settings),
            *(fmt_num(m["apiserver"].get(k)) for k in counts),
            *(fmt_mib(m["apiserver"].get(k)) for k in sizes),
        ]
        for mode, m in res["modes"].items()
        if any(v is not None for v in (m.get("apiserver") or {}).values())
    ]
    if not rows:
        return ""
    return markdown_table(
        ["mode", "requests", "pod status writes", "GangJob writes", "watch MiB sent",
         "of it Pod MiB"],
        rows,
    )  # fmt: skip


def fmt_num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def fmt_mib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**20:.3g}"


def cpu_table(res: dict[str, Any], settings: Settings) -> str:
    """Per mode, the CPU seconds each process spent within the restart's span (medians)."""
    procs: list[str] = [BENCH]
    for m in res["modes"].values():
        procs += [p for p in m.get("cpu_s", {}) if p not in procs]
    rows = [
        [label(mode, settings), med(m["seconds"])]
        + ["-" if m.get("cpu_s", {}).get(p) is None else f"{m['cpu_s'][p]:.2f}" for p in procs]
        for mode, m in res["modes"].items()
        if m.get("cpu_s")
    ]
    return markdown_table(["mode", "restart (s)", *procs], rows)


DEFAULT_CONTROLLER_MANAGER_QPS = 20
DEFAULT_SCHEDULER_QPS = 50
LIMIT_SHARE = 0.7
"""A rate of at least this share of a client's QPS is that client's limit at work."""


def _rate(n: int, steps: dict[str, float], names: list[str]) -> float | None:
    """Pods per second over the steps `names` (None if they took no time)."""
    took = sum(steps.get(s, 0.0) for s in names)
    return n / took if took > 0 else None


def bound_by(res: dict[str, Any], settings: Settings) -> list[str]:
    """For each JobSet row: its slowest step and what that step waits on, the per-pod rates
    seen, and whether the controller-manager's or the scheduler's client QPS binds them."""
    lines = []
    n = res["workers"]
    for mode in PEER_MODES:
        m = res["modes"].get(mode)
        steps = {k: v["median"] for k, v in ((m or {}).get("steps") or {}).items() if v}
        steps.pop("injected->visible", None)
        if not steps:
            continue

        slow = max(steps, key=lambda s: steps[s])
        kcm_qps = settings.peer_qps if mode == JOBSET_RAISED else DEFAULT_CONTROLLER_MANAGER_QPS
        kcm = {what: _rate(n, steps, names) for what, names in CONTROLLER_MANAGER_RATES.items()}
        kcm_rates = [r for r in kcm.values() if r is not None]
        sched_qps = settings.scheduler_qps or DEFAULT_SCHEDULER_QPS
        sched = _rate(n, steps, SCHEDULER_RATE[1])
        per_pod = [f"{what} {r:.0f}/s" for what, r in kcm.items() if r is not None]
        per_pod += [f"{SCHEDULER_RATE[0]} {sched:.0f}/s"] if sched is not None else []
        limits = []
        if kcm_rates:
            at = max(kcm_rates) >= LIMIT_SHARE * kcm_qps
            limits.append(
                f"the controller-manager's client allows {kcm_qps}/s: "
                + ("it binds its steps" if at else f"not what binds them (at most "
                   f"{max(kcm_rates):.0f}/s)")
            )  # fmt: skip
        if sched is not None:
            at = sched >= LIMIT_SHARE * sched_qps
            limits.append(
                f"the scheduler's {sched_qps}/s "
                + ("binds scheduling" if at else "does not bind scheduling")
            )
        lines.append(
            f"- {label(mode, settings)}: slowest step {slow} ({steps[slow]:.2f} s), "
            f"{STEPS.get(slow, '?')}; per pod: {', '.join(per_pod)}; {'; '.join(limits)}"
        )
    return lines


def summary_table(results: list[dict[str, Any]], settings: Settings) -> str:
    """One row per size: each mode's median, the ratios the goals need, the controller's
    share and the in-place restart less the simulation's CPU."""
    modes = [m for m in REPORTED_MODES if any(m in r["modes"] for r in results)]
    ratio_keys = [
        (RATIOS[k][1], ratio_name(k, settings))
        for k in RATIOS
        if k != "in-place-annotation" and any(k in r["modes"] for r in results)
    ]
    rows = []
    for res in results:
        ip = res["modes"].get("in-place") or {}
        share = ip.get("controller_share_s") or {}
        total = (
            sum(float(share[s]["median"]) for s in ("bump", "barrier"))
            if share.get("bump") and share.get("barrier")
            else None
        )
        rows.append(
            [res["workers"]]
            + [med((res["modes"].get(m) or {}).get("seconds")) for m in modes]
            + [f"{res[k]}x" if res.get(k) is not None else "-" for k, _ in ratio_keys]
            + [
                "-" if total is None else f"{total:.2f}",
                med(ip.get("bench_cpu_s")),
                med(ip.get("seconds_minus_bench_cpu")),
            ]
        )
    return markdown_table(
        ["N", *(label(m, settings) for m in modes), *(n for _, n in ratio_keys),
         "ctl share (s)", "in-place bench CPU (s)", "in-place minus bench CPU (s, est.)"],
        rows,
    )  # fmt: skip


def goals_text(results: list[dict[str, Any]], settings: Settings) -> str:
    return "\n".join(v.line() for v in verdicts(results, settings))


def report(settings: Settings, meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    peers = "jobset" in settings.peers
    parts = [
        f"# Gang restart at scale on sim: in place vs Recreate"
        f"{' and JobSet' if peers else ''} ({meta['date']})",
        "",
        f"Cluster: {meta['cluster']}. Simulated kubelet (delays measured on the real node): "
        f"whole-pod KEP-5532 restart {settings.restart_delay}s, start of a new pod "
        f"{settings.start_delay}s. {settings.reps} repetitions per mode. Times are "
        "from the failure visible in the API (the kubelet's status write) to the barrier open "
        "(`status.barrierEpoch` seen in a watch). in-place and node-lost: agents report "
        "arrivals to the controller's endpoint and read the job's state from its answer (as "
        "deployed); in-place-annotation: the same restart with arrival by pod annotation and "
        "each agent's own watch of its GangJob, "
        f"at N <= {ANNOTATION_MAX_SIZE} only (at N=5000 it overruns its deadline).",
        "",
        "process = the in-place restart of a `Process` gang (`spec.restart.mode: Process`, its "
        "own gang of N): the same failure, one worker's trainer exits 1, and every agent stops "
        "its trainer, arrives at E+1 and starts it again behind the barrier, in the same pod "
        "(no kubelet restart). The kubelet writes no status for that exit (the agent reports "
        "it to the controller), so its time runs from the trainer's exit itself (`exited`) to "
        "the barrier written; `barrier->open` follows as for in-place.",
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
        "bench CPU = the CPU seconds this benchmark's own process spent within the restart's "
        "span: the simulated kubelets and the real agents of every pod (and the observer's "
        "polls), which share the machine's 2 cores with the control plane. `minus bench CPU` "
        "is the restart time less that: an **estimate** of what a cluster whose kubelets and "
        "agents run elsewhere would see, if all of that CPU had held up the restart's "
        "critical path (if the rest could use both cores, the saving is nearer half of it). "
        "The CPU of every process within the span is in each size's second table.",
        "",
    ]
    if HANG in settings.modes:
        parts += [
            "hang = in a `Process` gang of N whose stand-in trainers report "
            f"{HANG_STEPS_PER_SECOND:g} steps a second and `spec.progress.hangSeconds` = "
            f"{HANG_SECONDS}, one trainer stops reporting and keeps running: its time runs "
            "from that trainer's last step (`last-step`) to the barrier written, through its "
            "agent's stall (`stalled`) and the epoch written. Detection = last step -> epoch, "
            "restart = epoch -> barrier, printed beside hangSeconds under each size.",
            "",
        ]
    if settings.progress:
        parts += [
            "in-place+progress and process+progress = the same restarts of a gang of their "
            f"own whose stand-in trainers report {HANG_STEPS_PER_SECOND:g} steps a second "
            "through `$GANGJOB_PROGRESS` and whose agents follow them and summarise to the "
            "controller's `/v1/progress` (every 30 s, N/50 s above 1500 workers), as "
            "deployed; measured in the same run as their twins without. Under each size, the "
            f"controller's cost of progress: its CPU over a steady window "
            f"({settings.progress_window:g} s, nothing failing) in the reporting `Pod` gang "
            "against the same window in the one without (both after every agent reached its "
            "summary period), and the GangJob's writes in that window.",
            "",
        ]
    if peers:
        parts += [
            "JobSet = JobSet v0.12.0's failure-policy restart of the same gang (one replicated "
            "Job, Indexed, parallelism = completions = N, the workers' image and command, on "
            "the same KWOK nodes), its controller run out of cluster at its own default client "
            "QPS (500, burst 500): one pod failed by the same status patch, from that failure "
            "seen in this process's watch to all N pods of the next restart attempt Running. "
            "At the controller-manager's defaults (client QPS 20, burst 30) and, "
            f"`JobSet (QPS {settings.peer_qps})`, with the controller-manager's client QPS "
            f"raised to {settings.peer_qps} (burst {2 * settings.peer_qps}; the "
            "controller-manager alone restarted for it), as an operator of large gangs "
            f"would. Measured at N <= {settings.peer_max_size} (`--peer-max-size`). GangJob's "
            "modes ran with the controller-manager at its defaults, and in-place again, "
            f"`in-place (QPS {settings.peer_qps})`, on the raised one, beside JobSet's. "
            "Below each size, each JobSet row's slowest step, what it waits on, and the rate "
            "of the runs that are one request per pod (N / the steps' medians), against the "
            "client QPS of the controller-manager and of the scheduler.",
            "",
        ]
    parts += ["## Summary (medians, s)", "", summary_table(results, settings), ""]
    for res in results:
        by_annotation = res.get("recreate_over_in_place_annotation")
        above_floor = res.get("in_place_over_floor")
        parts += [
            f"## N = {res['workers']}",
            "",
            f"Gang startup: {res['startup_s']} s; controller RSS max "
            f"{res['controller_rss_max_mib']} MiB"
            + (
                f"; Recreate / in-place = **{res['recreate_over_in_place']}x**"
                if res.get("recreate_over_in_place") is not None
                else ""
            )
            + (f" (by annotation: {by_annotation}x)" if by_annotation is not None else "")
            + (f"; in-place / floor = **{above_floor}x**" if above_floor is not None else "")
            + overran(res),
            "",
            size_table(res, settings),
            "",
            *hang_lines(res),
            *progress_lines(res),
            "CPU seconds within the restart's span, by process (medians):",
            "",
            cpu_table(res, settings),
            "",
        ]
        api = apiserver_table(res, settings)
        if api:
            parts += [
                "The apiserver's traffic within one repetition, every client's (medians):",
                "",
                api,
                "",
            ]
        peer_lines = bound_by(res, settings)
        if peer_lines:
            parts += ["Where JobSet's restart goes:", "", *peer_lines, ""]
    parts += ["## Goals (printed, not asserted)", "", goals_text(results, settings), ""]
    return "\n".join(parts)


def hang_lines(res: dict[str, Any]) -> list[str]:
    """The hang's detection and restart beside hangSeconds (none if it was not measured)."""
    h = res.get("hang")
    if not h:
        return []
    return [
        f"Hang (hangSeconds {h['hang_seconds']}): detection (last step -> epoch) "
        f"{fmt(h['detection_s'])} s, restart (epoch -> barrier) {fmt(h['restart_s'])} s "
        f"(median / p90); the trigger named the hung worker as Hang in {h['named_hung']} of "
        f"{h['reps']}.",
        "",
    ]


def progress_lines(res: dict[str, Any]) -> list[str]:
    """What progress cost the controller while the gang trained (none if not measured)."""
    c = res.get("progress_cost")
    if not c:
        return []
    without = c["cpu_share_without"]
    per = c["cpu_per_report_ms"]
    return [
        f"Progress, steady {c['window_s']:g} s: controller CPU {100 * c['cpu_share']:.2f}% of "
        "a core with every agent reporting"
        + (f", {100 * without:.2f}% without" if without is not None else "")
        + f" (progress adds {100 * c['added_cpu_share']:.2f}%"
        + (f", {per:.3f} ms per summary" if per is not None else "")
        + f"); {c['reports']} summaries accepted ({c['reports_per_s']}/s); GangJob writes "
        f"{c['job_writes']} ({c['job_writes_per_30s']} per 30 s"
        + (f"; {c['job_writes_without']} without" if c["job_writes_without"] is not None else "")
        + ")"
        + (f"; controller passes {c['passes']}" if c.get("passes") is not None else "")
        + (f" ({c['passes_without']} without)" if c.get("passes_without") is not None else "")
        + f"; controller API requests {c['api_requests']}.",
        "",
    ]


def write_plot(path: Path, settings: Settings, results: list[dict[str, Any]]) -> Path | None:
    series: dict[str, list[tuple[int, float, float]]] = {}
    for mode in REPORTED_MODES:
        for res in results:
            m = res["modes"].get(mode)
            if m and m["seconds"]:
                series.setdefault(label(mode, settings), []).append(
                    (res["workers"], m["seconds"]["median"], m["seconds"]["p90"])
                )
    goal = {
        res["workers"]: res["modes"]["recreate"]["seconds"]["median"] / RECREATE_OVER_IN_PLACE_MIN
        for res in results
        if (res["modes"].get("recreate") or {}).get("seconds")
    }
    qps = settings.scheduler_qps or "default"
    batch = f", endpoint batch {settings.endpoint_batch:g} s" if settings.endpoint_batch else ""
    return plot_lines(
        path,
        f"GangJob restart, failure visible -> barrier open (sim, scheduler QPS {qps}{batch})",
        series,
        [(f"goal: Recreate / {RECREATE_OVER_IN_PLACE_MIN:.0f}", goal)],
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
            f"controller-manager client QPS default (20, burst 30)"
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
            "peers": list(settings.peers),
            "peer_max_size": settings.peer_max_size,
            "peer_controller_manager_qps": settings.peer_qps,
            "modes": list(settings.modes),
            "progress": settings.progress,
            "progress_window_s": settings.progress_window,
        },
        "goals": [v.to_json() for v in verdicts(results, settings)],
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


def settings_of(data: dict[str, Any]) -> Settings:
    """The settings of a run, as far as its report needs them, from its results JSON (a run
    before the JSON kept its modes: every default mode, and hang where it was measured)."""
    s, results = data["settings"], data["results"]
    hang = (HANG,) if any(r.get("hang") for r in results) else ()
    return Settings(
        sizes=[int(r["workers"]) for r in results],
        reps=int(s["reps"]),
        restart_delay=float(s["restart_delay_s"]),
        start_delay=float(s["start_delay_s"]),
        scheduler_qps=s.get("scheduler_qps"),
        endpoint_batch=s.get("endpoint_batch_s"),
        modes=tuple(s.get("modes") or (*DEFAULT_MODES, *hang)),
        peers=tuple(s.get("peers") or ()),
        peer_max_size=int(s.get("peer_max_size", PEER_MAX_SIZE)),
        peer_qps=int(s.get("peer_controller_manager_qps", PEER_QPS)),
        progress=bool(s.get("progress", any(r.get("progress_cost") for r in results))),
        progress_window=float(s.get("progress_window_s", PROGRESS_WINDOW_S)),
    )


def rewrite_report(path: Path) -> Path:
    """Judge a run's results JSON again with these goals, and write its goals back and its
    markdown report beside it (`<name>.md`); the measurements are left as they are."""
    data = json.loads(path.read_text())
    settings = settings_of(data)
    data["goals"] = [v.to_json() for v in verdicts(data["results"], settings)]
    path.write_text(json.dumps(data, indent=2))
    md_path = path.with_suffix(".md")
    md_path.write_text(report(settings, data, data["results"]))
    return md_path
