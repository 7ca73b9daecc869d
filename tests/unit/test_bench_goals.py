"""The scale benchmark's goals for progress and for restarts in a row, judged from summarized
results (benchmarks/scale/goals.py: pure, printed, never asserted by the benchmark)."""

from __future__ import annotations

from typing import Any

from benchmarks.scale.goals import (
    controller_cpu,
    controller_rss,
    controller_share,
    in_a_row,
    in_place_time,
    progress,
    resize,
    tls,
)


def runs(mode: str, seconds: list[float], rss: list[float]) -> list[dict[str, Any]]:
    return [
        {"mode": mode, "rep": i, "seconds": s, "controller_rss_mib": r}
        for i, (s, r) in enumerate(zip(seconds, rss, strict=True))
    ]


def test_ten_restarts_in_a_row_meet_the_goal_only_if_the_last_is_near_the_first_and_rss_flat() -> (
    None
):
    flat = runs("in-place", [5.0] * 9 + [5.9], [150.0] * 9 + [158.0])
    slower = runs("process", [1.0] * 9 + [1.3], [150.0] * 10)
    (ip, pr) = in_a_row({1000: {"workers": 1000, "runs": flat + slower}})
    assert ip.met is True
    assert "150.0 -> 158.0 MiB" in ip.figures
    assert pr.met is False
    assert "1.30x" in pr.why

    growing = runs("in-place", [5.0] * 10, [150.0] + [150.0 + 5 * i for i in range(1, 10)])
    (ip, _) = in_a_row({1000: {"workers": 1000, "runs": growing}})
    assert ip.met is False
    assert "RSS grew 45.0 MiB" in ip.why


def test_fewer_than_ten_restarts_are_not_judged() -> None:
    (ip, pr) = in_a_row({1000: {"workers": 1000, "runs": runs("in-place", [5.0] * 3, [1.0] * 3)}})
    assert ip.met is None
    assert "3 in-place restarts" in ip.why
    assert pr.met is None


def test_progress_cost_is_judged_on_what_progress_adds_and_on_the_jobs_writes() -> None:
    cost = {"added_cpu_share": 0.012, "job_writes_per_30s": 1.0, "reports_per_s": 100.0}
    res_5000 = {"workers": 5000, "progress_cost": cost, "modes": {}}
    res_1000 = {
        "workers": 1000,
        "in_place_progress_over_in_place": 1.12,
        "modes": {
            "in-place": {"seconds": {"median": 5.0}},
            "in-place+progress": {"seconds": {"median": 5.6}, "steps": {}},
        },
        "runs": [],
    }
    (cpu, restart) = progress({5000: res_5000, 1000: res_1000})
    assert cpu.met is True
    assert "1.20% of a core added" in cpu.figures
    assert restart.met is False  # 1.12x > 1.10x
    assert "1.12x" in restart.figures

    cost["job_writes_per_30s"] = 2.0
    (cpu, _) = progress({5000: res_5000, 1000: res_1000})
    assert cpu.met is False
    assert cpu.why == "GangJob writes"
    cost["added_cpu_share"] = 0.03
    cpu = progress({5000: res_5000})[0]
    assert cpu.why == "controller CPU"


def test_each_resize_is_judged_against_in_place_of_the_same_run() -> None:
    in_place = {"seconds": {"median": 4.0}}
    res: dict[str, Any] = {
        "workers": 1000,
        "modes": {
            "in-place": in_place,
            "resize-down": {"seconds": {"median": 5.0}, "steps": {}},
            "resize-up": {"seconds": {"median": 6.4}, "steps": {"epoch->barrier": {"median": 6.4}}},
        },
        "runs": [{"mode": "resize-up", "span": "epoch->barrier"}],
    }
    (down, up) = resize({1000: res})
    assert down.met is True
    assert "1.25x" in down.figures
    assert up.met is False  # 1.6x
    assert "epoch->barrier 6.40 s" in up.why
    (down, _) = resize({1000: {"workers": 1000, "modes": {"in-place": in_place}}})
    assert down.met is None


def test_tls_is_judged_on_its_twin_against_plain_in_place() -> None:
    modes = {
        "in-place": {"seconds": {"median": 10.0}},
        "in-place-tls": {"seconds": {"median": 10.8}, "steps": {}},
    }
    res = {"workers": 1000, "in_place_tls_over_in_place": 1.08, "modes": modes, "runs": []}
    (verdict,) = tls({1000: res})
    assert verdict.met is True
    assert verdict.figures == "10.8 s / 10.0 s = 1.08x"
    res["in_place_tls_over_in_place"] = 1.23
    assert tls({1000: res})[0].met is False
    # Not met: what TLS adds, by process, and the ratio less the simulation's CPU.
    for mode, bench, ctl, less in (("in-place", 2.9, 1.2, 2.8), ("in-place-tls", 3.8, 1.9, 3.0)):
        modes[mode] |= {"bench_cpu_s": {"median": bench}, "controller_cpu_s": {"median": ctl},
                        "seconds_minus_bench_cpu": {"median": less}}  # fmt: skip
    assert tls({1000: res})[0].why.endswith(
        "; TLS adds +0.90 s of CPU in the benchmark process (the agents' clients), +0.70 s of "
        "CPU in the controller (the endpoint's side); less the benchmark process's CPU, 1.07x"
    )
    (missing,) = tls({100: {"workers": 100, "modes": {}}})
    assert missing.met is None
    assert "N=1000 not in this run" in missing.why


def test_controller_cpu_is_judged_on_the_process_restart_at_5000() -> None:
    def at(cpu: float) -> dict[int, dict[str, Any]]:
        modes = {"process": {"controller_cpu_s": {"median": cpu}}}
        return {5000: {"workers": 5000, "modes": modes}}

    (verdict,) = controller_cpu(at(0.9))
    assert verdict.met is True
    assert verdict.figures == "0.90 s (0.180 ms per arrival)"
    (verdict,) = controller_cpu(at(2.4))
    assert verdict.met is False
    assert verdict.why.startswith("the controller process: 2.40 s")
    (missing,) = controller_cpu({1000: {"workers": 1000, "modes": {}}})
    assert missing.met is None
    assert "N=5000 not in this run" in missing.why


def test_a_goal_not_met_names_its_slowest_step_and_the_busiest_processes() -> None:
    in_place = {
        "seconds": {"median": 6.0},
        "steps": {"visible->epoch": {"median": 0.5}, "epoch->arrived": {"median": 5.0}},
        "cpu_s": {"bench": 3.1, "kube-apiserver": 2.2, "controller": 0.9, "etcd": 0.3},
    }
    res = {"workers": 1000, "modes": {"in-place": in_place}, "runs": []}
    (_, verdict, _) = in_place_time({1000: res})
    assert verdict.met is False
    assert verdict.why == (
        "in-place epoch->arrived 5.00 s; most CPU within it: bench (the simulated kubelets and "
        "agents) 3.10 s, kube-apiserver 2.20 s"
    )
    del in_place["cpu_s"]
    assert in_place_time({1000: res})[1].why == "in-place epoch->arrived 5.00 s"


def test_in_place_at_5000_is_judged_less_the_simulations_cpu_too() -> None:
    def at(seconds: float, bench: float) -> dict[int, dict[str, Any]]:
        in_place = {
            "seconds": {"median": seconds},
            "bench_cpu_s": {"median": bench},
            "seconds_minus_bench_cpu": {"median": seconds - bench},
            "steps": {"epoch->arrived": {"median": seconds - 1}},
        }
        return {5000: {"workers": 5000, "modes": {"in-place": in_place}, "runs": []}}

    (verdict,) = in_place_time(at(12.0, 5.0))[2:]
    assert verdict.goal == "in place <= 8 s at N=5000, or less the simulation's CPU"
    assert verdict.met is True
    assert verdict.figures == "12.00 s; less the simulation's CPU (bench 5.00 s): 7.00 s"
    (verdict,) = in_place_time(at(12.0, 3.0))[2:]
    assert verdict.met is False
    assert verdict.figures.endswith(": 9.00 s")
    (verdict,) = in_place_time(at(7.0, 3.0))[2:]
    assert (verdict.met, verdict.figures) == (True, "7.00 s")


def test_rss_not_met_names_the_restart_after_which_it_peaked() -> None:
    rows = [
        {"mode": "process", "rep": 0, "controller_rss_mib": 230.1},
        {"mode": "in-place", "rep": 1, "controller_rss_mib": 301.5},
    ]
    res = {"workers": 5000, "controller_rss_max_mib": 305.0, "runs": rows, "modes": {}}
    (verdict,) = controller_rss({5000: res})
    assert verdict.met is False
    assert verdict.why == (
        "the controller process: max RSS 305.0 MiB at N=5000, 301.5 MiB after in-place #2"
    )


def test_the_share_not_met_names_its_step_and_the_status_writes_part() -> None:
    share = {
        "bump": {"median": 0.3}, "barrier": {"median": 1.5},
        "bump-write": {"median": 0.05}, "barrier-write": {"median": 1.2},
    }  # fmt: skip
    res = {"workers": 5000, "modes": {"in-place": {"controller_share_s": share}}}
    (verdict,) = controller_share({5000: res})
    assert verdict.met is False
    assert verdict.figures == "1.80 s (failure->epoch 0.30 + last arrival->barrier 1.50)"
    assert verdict.why == (
        "last arrival->barrier 1.50 s: of it the status write 1.20 s (kube-apiserver's answer), "
        "the controller's pass and wait 0.30 s"
    )
    # A run before the write was measured apart: the step alone.
    del share["barrier-write"]
    assert controller_share({5000: res})[0].why == (
        "last arrival->barrier 1.50 s: the controller's pass and its status write (not measured "
        "apart in this run)"
    )
