"""The goals a scale run is held against, printed with its results and never asserted: each
one's figures, and "met", "not met (the step that holds it)" or "not measured (why)".

Pure: the run's summarized results in, one `Verdict` per goal out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from benchmarks.scale.cpu import BENCH
from benchmarks.scale.settings import (
    IN_PLACE_RAISED,
    IN_PLACE_TLS,
    JOBSET,
    JOBSET_RAISED,
    NODE_LOST_SHRINK,
    NODE_LOST_SPARE,
    NODE_LOST_SPARE_POD,
    NODE_LOST_WAIT,
    Settings,
)

IN_PLACE_MAX_S = {100: 3.0, 1000: 4.0, 5000: 8.0}
"""In place, failure visible -> barrier written, median, at each N."""
LESS_SIMULATION_AT = 5000
"""At this N in place also meets its goal if the restart less the benchmark process's CPU (the
simulated kubelets and agents, which a real cluster runs elsewhere) does."""
BUSIEST = 2
"""How many processes a goal not met names, by their CPU within the restart's span."""
ROLES = {BENCH: "the simulated kubelets and agents", "controller": "GangJob's controller"}
IN_PLACE_OVER_FLOOR_MAX = 2.0
RECREATE_OVER_IN_PLACE_MIN, RECREATE_AT = 40.0, 5000
JOBSET_RAISED_OVER_IN_PLACE_MIN, JOBSET_OVER_IN_PLACE_MIN, JOBSET_AT = 8.0, 30.0, 1000
CONTROLLER_SHARE_MAX_S, SHARE_AT = 0.5, 5000
NODE_LOST_AT, NODE_LOST_SLACK_S = 1000, 1.0
"""node-lost within in place + a new pod's start (the simulated kubelet's) + this."""
RSS_MAX_MIB, RSS_AT = 250.0, 5000
API_GROWTH_MAX = 1.5
"""Controller API requests per in-place restart are O(1) in N if the largest N's count is at
most this many times the smallest N's (plus `API_GROWTH_SLACK`): progress-only writes (at most
one a second) grow with a restart's duration, not with N."""
API_GROWTH_SLACK = 5
PROGRESS_CPU_SHARE_MAX, PROGRESS_WRITES_PER_30S_MAX, PROGRESS_AT = 0.02, 1.0, 5000
"""With every agent reporting: the controller's CPU that progress adds (a share of one core),
and the GangJob's writes per 30 s, in a steady window."""
PROGRESS_OVER_OFF_MAX, PROGRESS_RESTART_AT = 1.10, 1000
"""In-place restart with progress on / off (same run)."""
IN_A_ROW, IN_A_ROW_AT, IN_A_ROW_SLOWER_MAX = 10, 1000, 1.20
"""`--reps 10` restarts of one gang in a row: the tenth within 20% of the first."""
RSS_GROWTH_MAX_MIB, RSS_GROWTH_MAX_SHARE = 10.0, 0.05
"""The controller's RSS after the last of them against after the first: flat if it grew by at
most the larger of these (the allocator's and the caches' settling, not accumulation)."""
RESIZE_OVER_IN_PLACE_MAX, RESIZE_AT = 1.5, 1000
"""Each resize by `replicas` (N -> 0.8 N -> N) against an in-place restart, same run."""
TLS_OVER_PLAIN_MAX, TLS_AT = 1.10, 1000
"""In-place restart with arrivals over TLS / over plain HTTP (same run)."""
PROCESS_MAX_S, PROCESS_AT = 3.0, 5000
"""Process mode in place, the trainer's exit -> barrier written, median."""
CONTROLLER_CPU_MAX_S, CONTROLLER_CPU_AT = 1.0, 5000
"""The controller's CPU within one Process-mode restart, median: 0.2 ms per arrival at 5000."""
NODE_LOSS_OVER_IN_PLACE_MAX, NODE_LOSS_AT = 1.2, 1000
"""A node lost in an elastic gang (shrinking, or with a spare), failure visible -> barrier,
against an in-place restart."""

Results = dict[int, dict[str, Any]]
"""Each size's summarized results, by N."""


@dataclass(frozen=True)
class Verdict:
    goal: str
    met: bool | None
    """None: not measured in this run."""
    figures: str
    why: str = ""
    """What holds a goal not met, or why it was not measured."""

    def line(self) -> str:
        if self.met is None:
            state = f"not measured ({self.why})"
        elif self.met:
            state = "met"
        else:
            state = f"not met ({self.why})"
        return f"- {self.goal}: {self.figures + ' -> ' if self.figures else ''}{state}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def median(res: dict[str, Any], mode: str, key: str = "seconds") -> float | None:
    stat = (res["modes"].get(mode) or {}).get(key)
    return None if stat is None else float(stat["median"])


def step_medians(res: dict[str, Any], mode: str) -> dict[str, float]:
    """The mode's steps within its span (a restart's steps before it or after it are not
    part of its time), by median."""
    m = res["modes"].get(mode) or {}
    steps = {k: float(v["median"]) for k, v in (m.get("steps") or {}).items() if v is not None}
    runs = [r for r in res.get("runs", []) if r["mode"] == mode and r.get("span")]
    span = str(runs[0]["span"]) if runs else ""
    if "->" not in span or " " in span:
        return steps
    start, end = span.split("->")
    names = list(steps)
    first = next((i for i, s in enumerate(names) if s.startswith(f"{start}->")), 0)
    last = next((i for i, s in enumerate(names) if s.endswith(f"->{end}")), len(names) - 1)
    return {s: steps[s] for s in names[first : last + 1]}


def slowest(res: dict[str, Any], mode: str) -> str:
    """The slowest step of the mode, as the report names it, and the processes busiest within
    its span."""
    steps = step_medians(res, mode)
    if not steps:
        return f"no {mode} steps measured"
    name = max(steps, key=lambda s: steps[s])
    return f"{mode} {name} {steps[name]:.2f} s{busiest(res, mode)}"


def busiest(res: dict[str, Any], mode: str) -> str:
    """The `BUSIEST` processes by their CPU within the mode's span (medians), most first; empty
    if not sampled."""
    cpu = (res["modes"].get(mode) or {}).get("cpu_s") or {}
    top = sorted(cpu.items(), key=lambda kv: -float(kv[1]))[:BUSIEST]
    named = [
        f"{name}{f' ({ROLES[name]})' if name in ROLES else ''} {float(s):.2f} s" for name, s in top
    ]
    return f"; most CPU within it: {', '.join(named)}" if named else ""


def _at(results: Results, n: int) -> tuple[dict[str, Any] | None, str]:
    """The results at N=`n`, or why there are none."""
    res = results.get(n)
    return res, "" if res is not None else f"N={n} not in this run"


def in_place_time(results: Results) -> list[Verdict]:
    out = []
    for n, limit in IN_PLACE_MAX_S.items():
        goal = f"in place <= {limit:g} s at N={n}" + (
            ", or less the simulation's CPU" if n == LESS_SIMULATION_AT else ""
        )
        res, why = _at(results, n)
        ip = median(res, "in-place") if res else None
        if res is None or ip is None:
            out.append(Verdict(goal, None, "", why or "no in-place restart finished"))
            continue
        figures, met = f"{ip:.2f} s", ip <= limit
        less = median(res, "in-place", "seconds_minus_bench_cpu")
        if not met and n == LESS_SIMULATION_AT and less is not None:
            sim = median(res, "in-place", "bench_cpu_s")
            figures += f"; less the simulation's CPU ({BENCH} {sim:.2f} s): {less:.2f} s"
            met = less <= limit
        out.append(Verdict(goal, met, figures, slowest(res, "in-place")))
    return out


def _over_floor_step(res: dict[str, Any]) -> str:
    """The in-place step furthest above its counterpart in floor."""
    ip, fl = step_medians(res, "in-place"), (res["modes"]["floor"].get("steps") or {})
    ip_all = {k: float(v["median"]) for k, v in res["modes"]["in-place"]["steps"].items() if v}
    flm = {k: float(v["median"]) for k, v in fl.items() if v}
    to_arrive = sum(flm.get(s, 0.0) for s in ("injected->seen", "seen->restarted",
                                              "restarted->arrived"))  # fmt: skip
    excess = {
        # floor has no failure to detect nor a barrier to decide: those count whole.
        "visible->epoch": ip.get("visible->epoch", 0.0),
        "epoch->arrived": ip.get("epoch->arrived", 0.0) - to_arrive,
        "arrived->barrier": ip.get("arrived->barrier", 0.0),
        "barrier->open": ip_all.get("barrier->open", 0.0) - flm.get("barrier->open", 0.0),
    }
    name = max(excess, key=lambda s: excess[s])
    return f"in-place {name} {excess[name]:+.2f} s over floor's"


def in_place_over_floor(results: Results) -> list[Verdict]:
    goal = f"in place within {IN_PLACE_OVER_FLOOR_MAX:g}x of floor at every N"
    measured = {n: r for n, r in results.items() if r.get("in_place_over_floor") is not None}
    if not measured:
        return [Verdict(goal, None, "", "in-place and floor not both measured")]
    figures = ", ".join(f"N={n} {r['in_place_over_floor']}x" for n, r in sorted(measured.items()))
    over = [(n, r) for n, r in sorted(measured.items())
            if r["in_place_over_floor"] > IN_PLACE_OVER_FLOOR_MAX]  # fmt: skip
    missing = sorted(set(results) - set(measured))
    if over:
        why = "; ".join(f"N={n}: {_over_floor_step(r)}" for n, r in over)
        return [Verdict(goal, False, figures, why)]
    if missing:
        return [Verdict(goal, None, figures, f"not measured at N={missing}")]
    return [Verdict(goal, True, figures)]


def _ratio_goal(
    results: Results, n: int, goal: str, key: str, minimum: float, slow: str, hint: str
) -> Verdict:
    res, why = _at(results, n)
    value = res.get(key) if res else None
    if res is None or value is None:
        return Verdict(goal, None, "", why or f"{slow} or in-place not measured at N={n}{hint}")
    figures = (
        f"{value}x ({slow} {median(res, slow):.2f} s, in-place {median(res, 'in-place'):.2f} s)"
    )
    same = res.get("jobset_raised_over_in_place_raised") if slow == JOBSET_RAISED else None
    if same is not None:
        figures += (
            f"; {same}x against in-place on the same controller-manager "
            f"({median(res, IN_PLACE_RAISED):.2f} s)"
        )
    return Verdict(goal, value >= minimum, figures, slowest(res, "in-place"))


def ratios(results: Results, settings: Settings) -> list[Verdict]:
    peer = "jobset" in settings.peers and settings.peer_max_size >= JOBSET_AT
    hint = "" if peer else f" (needs --peers jobset and --peer-max-size >= {JOBSET_AT})"
    return [
        _ratio_goal(
            results, RECREATE_AT,
            f"Recreate / in place >= {RECREATE_OVER_IN_PLACE_MIN:g}x at N={RECREATE_AT}",
            "recreate_over_in_place", RECREATE_OVER_IN_PLACE_MIN, "recreate", "",
        ),
        _ratio_goal(
            results, JOBSET_AT,
            f"in place >= {JOBSET_RAISED_OVER_IN_PLACE_MIN:g}x faster than JobSet with the "
            f"controller-manager's QPS raised, at N={JOBSET_AT}",
            "jobset_raised_over_in_place", JOBSET_RAISED_OVER_IN_PLACE_MIN, JOBSET_RAISED, hint,
        ),
        _ratio_goal(
            results, JOBSET_AT,
            f"in place >= {JOBSET_OVER_IN_PLACE_MIN:g}x faster than JobSet at defaults, at "
            f"N={JOBSET_AT}",
            "jobset_over_in_place", JOBSET_OVER_IN_PLACE_MIN, JOBSET, hint,
        ),
    ]  # fmt: skip


def controller_share(results: Results) -> list[Verdict]:
    goal = (
        f"controller share (failure -> epoch written + last arrival -> barrier written) "
        f"<= {CONTROLLER_SHARE_MAX_S:g} s at N={SHARE_AT}"
    )
    res, why = _at(results, SHARE_AT)
    share = ((res["modes"].get("in-place") or {}).get("controller_share_s") or {}) if res else {}
    bump, barrier = (share.get(s) for s in ("bump", "barrier"))
    if res is None or bump is None or barrier is None:
        return [Verdict(goal, None, "", why or "no in-place controller share measured")]
    b1, b2 = float(bump["median"]), float(barrier["median"])
    total = b1 + b2
    figures = f"{total:.2f} s (failure->epoch {b1:.2f} + last arrival->barrier {b2:.2f})"
    step, took = ("bump", b1) if b1 >= b2 else ("barrier", b2)
    held = f"failure->epoch {b1:.2f} s" if step == "bump" else f"last arrival->barrier {b2:.2f} s"
    write = share.get(f"{step}-write")
    if write is None:
        held += ": the controller's pass and its status write (not measured apart in this run)"
    else:
        w = float(write["median"])
        held += (
            f": of it the status write {w:.2f} s (kube-apiserver's answer), the controller's "
            f"pass and wait {max(0.0, took - w):.2f} s"
        )
    return [Verdict(goal, total <= CONTROLLER_SHARE_MAX_S, figures, held)]


def node_lost(results: Results, settings: Settings) -> list[Verdict]:
    goal = (
        f"node-lost within in place + a new pod's start ({settings.start_delay:g} s) + "
        f"{NODE_LOST_SLACK_S:g} s at N={NODE_LOST_AT}"
    )
    res, why = _at(results, NODE_LOST_AT)
    nl = median(res, "node-lost") if res else None
    ip = median(res, "in-place") if res else None
    if res is None or nl is None or ip is None:
        return [Verdict(goal, None, "", why or "node-lost or in-place not measured")]
    limit = ip + settings.start_delay + NODE_LOST_SLACK_S
    figures = f"{nl:.2f} s against {limit:.2f} s"
    return [Verdict(goal, nl <= limit, figures, slowest(res, "node-lost"))]


def _within_in_place(
    res: dict[str, Any] | None, why: str, goal: str, mode: str, limit: float, process: bool
) -> Verdict:
    """`mode`'s median within `limit` times in place's, same run; with `process`, its ratio to
    the `Process` gang's in-place restart is shown too."""
    ip = median(res, "in-place") if res else None
    t = median(res, mode) if res else None
    if res is None or t is None or ip is None:
        return Verdict(goal, None, "", why or f"{mode} or in-place not measured")
    ratio = t / ip
    figures = f"{t:.2f} s / in-place {ip:.2f} s = {ratio:.2f}x"
    pr = median(res, "process") if process else None
    if pr is not None:
        figures += f" (Process mode in place {pr:.2f} s: {t / pr:.2f}x)"
    return Verdict(goal, ratio <= limit, figures, slowest(res, mode))


def resize(results: Results) -> list[Verdict]:
    """Each resize row within `RESIZE_OVER_IN_PLACE_MAX` of in place; not measured unless the
    run took `resize`."""
    res, why = _at(results, RESIZE_AT)
    return [
        _within_in_place(
            res,
            why,
            f"{row} within {RESIZE_OVER_IN_PLACE_MAX:g}x of in place at N={RESIZE_AT}",
            row,
            RESIZE_OVER_IN_PLACE_MAX,
            process=False,
        )
        for row in ("resize-down", "resize-up")
    ]


def node_loss(results: Results) -> list[Verdict]:
    """A node lost with no room for its worker's new pod, at N=1000, against an in-place
    restart of the same run: an elastic gang shrinks, a spare takes the worker's place, each
    within `NODE_LOSS_OVER_IN_PLACE_MAX`; without elastic the gang waits (reported)."""
    res, why = _at(results, NODE_LOSS_AT)
    out = [
        _within_in_place(
            res,
            why,
            f"{what} (failure visible -> barrier) within {NODE_LOSS_OVER_IN_PLACE_MAX:g}x of "
            f"in place at N={NODE_LOSS_AT}",
            mode,
            NODE_LOSS_OVER_IN_PLACE_MAX,
            process=True,
        )
        for mode, what in (
            (NODE_LOST_SHRINK, "node lost, no spare capacity: elastic shrink"),
            (NODE_LOST_SPARE, "node lost with a spare"),
            (NODE_LOST_SPARE_POD, "node lost with a spare, Pod mode"),
        )
    ]
    goal = f"node lost without elastic, no capacity: the gang waits, at N={NODE_LOSS_AT}"
    m = (res or {}).get("modes", {}).get(NODE_LOST_WAIT)
    if res is None or not m:
        return [*out, Verdict(goal, None, "", why or f"{NODE_LOST_WAIT} not measured")]
    waits = m.get("unfinished_over_s") or []
    if not waits:
        figures = f"the barrier opened in {median(res, NODE_LOST_WAIT)} s: it did not wait"
        return [*out, Verdict(goal, False, figures, "capacity was found")]
    figures = (
        f"still waiting {min(waits):g} s after the epoch was raised, in {len(waits)} of "
        f"{len(waits) + int(m.get('reps') or 0)}"
    )
    return [*out, Verdict(goal, m.get("reps") == 0, figures, "a barrier opened")]


def controller_rss(results: Results) -> list[Verdict]:
    goal = f"controller RSS <= {RSS_MAX_MIB:g} MiB at N={RSS_AT}"
    res, why = _at(results, RSS_AT)
    rss = res.get("controller_rss_max_mib") if res else None
    if res is None or not rss:
        return [Verdict(goal, None, "", why or "not sampled")]
    runs = [r for r in res.get("runs", []) if r.get("controller_rss_mib")]
    top = max(runs, key=lambda r: float(r["controller_rss_mib"]), default=None)
    where = (
        f", {top['controller_rss_mib']} MiB after {top['mode']} #{int(top['rep']) + 1}"
        if top is not None
        else ""
    )
    held = f"the controller process: max RSS {rss} MiB at N={RSS_AT}{where}"
    return [Verdict(goal, rss <= RSS_MAX_MIB, f"max {rss} MiB", held)]


def api_requests(results: Results) -> list[Verdict]:
    goal = "controller API requests per in-place restart O(1) in N"
    counts: dict[int, tuple[float, dict[str, float]]] = {}
    for n, res in sorted(results.items()):
        m = res["modes"].get("in-place") or {}
        if m.get("api_requests"):
            counts[n] = (float(m["api_requests"]["median"]), m.get("api_requests_by_method") or {})
    if not counts:
        return [Verdict(goal, None, "", "no in-place restart measured")]
    figures = ", ".join(
        f"N={n}: {total:g} ({', '.join(f'{k} {v:g}' for k, v in by.items() if v)})"
        for n, (total, by) in counts.items()
    )
    if len(counts) < 2:
        return [Verdict(goal, None, figures, "one size only: growth not judged")]
    (n0, (c0, by0)), (n1, (c1, by1)) = min(counts.items()), max(counts.items())
    grows = c1 > API_GROWTH_MAX * c0 + API_GROWTH_SLACK
    method = max(by1, key=lambda k: by1.get(k, 0) - by0.get(k, 0), default="")
    why = (
        f"they grow: {c0:g} at N={n0} -> {c1:g} at N={n1}, most in {method} "
        f"({by0.get(method, 0):g} -> {by1.get(method, 0):g})"
    )
    figures += f"; {'grow' if grows else 'do not grow'} from N={n0} to N={n1}"
    return [Verdict(goal, not grows, figures, why)]


def process_mode(results: Results) -> list[Verdict]:
    goal = f"Process mode in place <= {PROCESS_MAX_S:g} s at N={PROCESS_AT}"
    res, why = _at(results, PROCESS_AT)
    if res is None or "process" not in res["modes"]:
        return [Verdict(goal, None, "", why or f"process not measured at N={PROCESS_AT}")]
    t = median(res, "process")
    if t is None:
        return [Verdict(goal, None, "", "no process restart finished")]
    return [Verdict(goal, t <= PROCESS_MAX_S, f"{t:.2f} s", slowest(res, "process"))]


def controller_cpu(results: Results) -> list[Verdict]:
    """The controller's own cost of a Process-mode restart, where it is the busiest process
    (no kubelet writes): its CPU over the restart's span, and that per worker (one arrival
    each)."""
    n = CONTROLLER_CPU_AT
    goal = (
        f"controller CPU per Process restart <= {CONTROLLER_CPU_MAX_S:g} s at N={n} "
        f"({1000 * CONTROLLER_CPU_MAX_S / n:g} ms per arrival)"
    )
    res, why = _at(results, n)
    cpu = median(res, "process", "controller_cpu_s") if res else None
    if res is None or cpu is None:
        return [Verdict(goal, None, "", why or f"no process restart measured at N={n}")]
    per = 1000 * cpu / n
    figures = f"{cpu:.2f} s ({per:.3f} ms per arrival)"
    held = (
        f"the controller process: {cpu:.2f} s over the restart (its reconcile passes and "
        "arrival endpoint; `--py-spy-controller DIR` samples it)"
    )
    return [Verdict(goal, cpu <= CONTROLLER_CPU_MAX_S, figures, held)]


def progress(results: Results) -> list[Verdict]:
    """`--progress`: what progress costs the controller at N=5000, and a restart at N=1000."""
    out = []
    goal = (
        f"progress with every agent reporting at N={PROGRESS_AT}: controller CPU "
        f"<= {100 * PROGRESS_CPU_SHARE_MAX:g}% of a core, GangJob writes "
        f"<= {PROGRESS_WRITES_PER_30S_MAX:g} per 30 s"
    )
    res, why = _at(results, PROGRESS_AT)
    cost = res.get("progress_cost") if res else None
    if not cost:
        out.append(Verdict(goal, None, "", why or "--progress not measured"))
    else:
        added, writes = float(cost["added_cpu_share"]), float(cost["job_writes_per_30s"])
        figures = (
            f"{100 * added:.2f}% of a core added ({cost['reports_per_s']} summaries/s), "
            f"{writes:g} writes per 30 s"
        )
        cpu_ok, writes_ok = added <= PROGRESS_CPU_SHARE_MAX, writes <= PROGRESS_WRITES_PER_30S_MAX
        held = "controller CPU" if not cpu_ok else "GangJob writes"
        out.append(Verdict(goal, cpu_ok and writes_ok, figures, held))
    goal = (
        f"in-place restart with progress on within {100 * (PROGRESS_OVER_OFF_MAX - 1):g}% of "
        f"off at N={PROGRESS_RESTART_AT}"
    )
    twin = _twin(results, goal, PROGRESS_RESTART_AT, "in-place+progress", PROGRESS_OVER_OFF_MAX)
    return [*out, twin or Verdict(goal, None, "", "--progress not measured")]


def _twin(results: Results, goal: str, n: int, mode: str, limit: float) -> Verdict | None:
    """In place measured again as `mode` (its twin gang) against in place, same run: within
    `limit` times; None if either is missing at N=`n`."""
    res, _ = _at(results, n)
    key = f"{mode.replace('-', '_').replace('+', '_')}_over_in_place"
    ratio = res.get(key) if res else None
    if res is None or ratio is None:
        return None
    figures = f"{median(res, mode)} s / {median(res, 'in-place')} s = {ratio}x"
    return Verdict(goal, ratio <= limit, figures, slowest(res, mode))


def tls(results: Results) -> list[Verdict]:
    """`--modes in-place,in-place-tls`: arrivals over TLS cost an in-place restart at most 10%."""
    goal = (
        f"in-place restart with arrivals over TLS within {100 * (TLS_OVER_PLAIN_MAX - 1):g}% "
        f"of plain HTTP at N={TLS_AT}"
    )
    res, why = _at(results, TLS_AT)
    twin = _twin(results, goal, TLS_AT, IN_PLACE_TLS, TLS_OVER_PLAIN_MAX)
    if twin is None:
        return [Verdict(goal, None, "", why or f"{IN_PLACE_TLS} and in-place not both measured")]
    assert res is not None
    if twin.met is False:
        twin = replace(twin, why=f"{twin.why}; {_tls_cost(res)}")
    return [twin]


def _tls_cost(res: dict[str, Any]) -> str:
    """What TLS adds to an in-place restart, by process: each worker's agent is a new process
    after the restart and makes a handshake (the simulated agents' client side in the benchmark
    process; the server side in the controller)."""
    added = []
    for key, who in (("bench_cpu_s", "the benchmark process (the agents' clients)"),
                     ("controller_cpu_s", "the controller (the endpoint's side)")):  # fmt: skip
        tls, plain = median(res, IN_PLACE_TLS, key), median(res, "in-place", key)
        if tls is not None and plain is not None:
            added.append(f"{tls - plain:+.2f} s of CPU in {who}")
    less = [median(res, m, "seconds_minus_bench_cpu") for m in (IN_PLACE_TLS, "in-place")]
    ratio = (
        f"; less the benchmark process's CPU, {less[0] / less[1]:.2f}x"
        if less[0] is not None and less[1]
        else ""
    )
    return "TLS adds " + (", ".join(added) or "nothing measured") + ratio


def in_a_row(results: Results) -> list[Verdict]:
    """Ten restarts of one gang in a row (in place and Process) at N=1000: the tenth within
    20% of the first, and the controller's RSS flat from the first to the last."""
    out = []
    res, why = _at(results, IN_A_ROW_AT)
    for mode in ("in-place", "process"):
        goal = (
            f"{IN_A_ROW} {mode} restarts in a row at N={IN_A_ROW_AT}: the last within "
            f"{100 * (IN_A_ROW_SLOWER_MAX - 1):g}% of the first, controller RSS flat"
        )
        runs = sorted(
            (r for r in (res or {}).get("runs", []) if r["mode"] == mode),
            key=lambda r: int(r["rep"]),
        )
        if res is None or len(runs) < IN_A_ROW or any(r.get("unfinished") for r in runs):
            reason = why or f"{len(runs)} {mode} restarts (--reps {IN_A_ROW}), or one overran"
            out.append(Verdict(goal, None, "", reason))
            continue
        first, last = runs[0], runs[-1]
        slower = float(last["seconds"]) / float(first["seconds"])
        rss0, rss1 = first.get("controller_rss_mib"), last.get("controller_rss_mib")
        growth = None if rss0 is None or rss1 is None else float(rss1) - float(rss0)
        allowed = max(RSS_GROWTH_MAX_MIB, RSS_GROWTH_MAX_SHARE * float(rss0 or 0))
        flat = growth is not None and growth <= allowed
        figures = (
            f"#1 {first['seconds']} s, #{len(runs)} {last['seconds']} s ({slower:.2f}x); RSS "
            + (f"{rss0} -> {rss1} MiB" if growth is not None else "not sampled")
        )
        held = (
            f"#{len(runs)} is {slower:.2f}x #1"
            if slower > IN_A_ROW_SLOWER_MAX
            else f"RSS grew {growth} MiB (at most {allowed:.0f})"
        )
        out.append(Verdict(goal, slower <= IN_A_ROW_SLOWER_MAX and flat, figures, held))
    return out


def verdicts(results: list[dict[str, Any]], settings: Settings) -> list[Verdict]:
    """Every goal, in the issue's order."""
    by_n: Results = {res["workers"]: res for res in results}
    checks: list[Callable[[], list[Verdict]]] = [
        lambda: in_place_time(by_n),
        lambda: in_place_over_floor(by_n),
        lambda: ratios(by_n, settings),
        lambda: controller_share(by_n),
        lambda: node_lost(by_n, settings),
        lambda: resize(by_n),
        lambda: node_loss(by_n),
        lambda: controller_rss(by_n),
        lambda: api_requests(by_n),
        lambda: process_mode(by_n),
        lambda: controller_cpu(by_n),
        lambda: progress(by_n),
        lambda: tls(by_n),
        lambda: in_a_row(by_n),
    ]
    return [v for check in checks for v in check()]
