"""A quick smoke of `benchmarks.scale` (`make bench`'s benchmark): a tiny gang through
every measurement (a gang of each restart mode: Pod, Process, Recreate) on the test cluster,
the JobSet peer beside it, and a report that is well formed. Not a measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scale.controlplane import CONTROLLER_MANAGER, command_line
from benchmarks.scale.report import report, rewrite_report, write_results
from benchmarks.scale.runner import run_on
from benchmarks.scale.settings import (
    DEFAULT_MODES,
    IN_PLACE_RAISED,
    JOBSET,
    JOBSET_RAISED,
    NODE_LOSS,
    NODE_LOST_WAIT,
    Settings,
)
from localcluster.cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
async def test_restart_scale_runs_every_mode_and_writes_a_report(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    settings = Settings(
        sizes=[3], reps=1, restart_delay=0.2, start_delay=0.1, name="smoke", results_dir=tmp_path
    )
    data = await run_on(sim_cluster, settings)

    (res,) = data["results"]
    assert res["workers"] == 3
    assert set(res["modes"]) == set(DEFAULT_MODES)  # TLS too, at N <= TLS_MAX_SIZE
    for mode, m in res["modes"].items():
        assert m["reps"] == 1, mode
        assert m["seconds"]["median"] > 0, mode
        assert m["seconds"]["p90"] >= m["seconds"]["median"], mode
        assert m["steps"], mode
    in_place = res["modes"]["in-place"]
    assert set(in_place["steps"]) == {
        "injected->visible", "visible->epoch", "epoch->arrived", "arrived->barrier",
        "barrier->open",
    }  # fmt: skip
    assert in_place["controller_share_s"]["bump"] is not None
    assert in_place["controller_share_s"]["barrier"] is not None
    assert in_place["api_requests"]["median"] > 0
    # The apiserver's own counters: each of the 3 pods restarted in place wrote its status,
    # and the controller's GangJob writes and the watches' bytes are counted.
    api = in_place["apiserver"]
    assert api["pod_status_writes"] >= 3
    assert api["gangjob_writes"] >= 2  # the epoch, the barrier
    assert api["requests"] > api["pod_status_writes"]
    assert api["pod_watch_bytes"] > 0
    floor = res["modes"]["floor"]
    assert set(floor["steps"]) == {
        "injected->seen", "seen->restarted", "restarted->arrived", "arrived->barrier",
        "barrier->open",
    }  # fmt: skip
    assert floor["controller_share_s"]["bump"] is None  # no failure: the bench raised the epoch
    # To every agent's barrier open: the restart and its `barrier->open` step (which can be
    # a few ms below 0: the agents may see the barrier before this process's watch does).
    (ip_run,) = (r for r in res["runs"] if r["mode"] == "in-place")
    to_open = ip_run["seconds"] + ip_run["steps"]["barrier->open"]
    assert res["in_place_to_open_s"]["median"] == pytest.approx(to_open, abs=0.002)
    assert res["in_place_over_floor"] > 0
    assert res["recreate_over_in_place"] > 0
    assert res["recreate_over_in_place_annotation"] > 0
    assert res["controller_rss_max_mib"] > 0
    node_lost = [r for r in res["runs"] if r["mode"] == "node-lost"]
    assert node_lost[0]["trigger"] == "NodeLost"
    assert len(node_lost[0]["recreated"]) == 1
    recreate = [r for r in res["runs"] if r["mode"] == "recreate"]
    assert recreate[0]["recreated"] == [0, 1, 2]  # the status says all, not each
    # Process mode: its own gang, restarted in place by its agents, timed from the exit.
    process = res["modes"]["process"]
    assert process["unfinished_over_s"] == []
    assert set(process["steps"]) == {
        "injected->exited", "exited->epoch", "epoch->arrived", "arrived->barrier",
        "barrier->open",
    }  # fmt: skip
    assert process["controller_share_s"]["bump"] is not None
    (process_run,) = (r for r in res["runs"] if r["mode"] == "process")
    assert process_run["span"] == "exited->barrier"
    assert process_run["exit_code"] == 1
    assert process_run["exited->reported"] >= 0
    assert process_run["pods_replaced"] == 0
    assert process_run["recreated"] == []
    assert res["startup_s"]["Process"] > 0
    assert res["process_over_in_place"] > 0

    paths = write_results(settings, data, tmp_path)
    assert json.loads(paths["json"].read_text())["results"][0]["workers"] == 3  # type: ignore[union-attr]
    md = report(settings, data, data["results"])
    # Judged again from its JSON alone (`--rewrite-report`), the report is the same.
    assert paths["markdown"] is not None
    written = paths["markdown"].read_text()
    assert rewrite_report(paths["json"]) == paths["markdown"]  # type: ignore[arg-type]
    assert paths["markdown"].read_text() == written == md
    assert "## N = 3" in md
    assert "The apiserver's traffic within one repetition" in md
    assert "| in-place | 1 |" in md
    assert "| process | 1 |" in md
    assert f"| process / in-place {res['process_over_in_place']}x |" in md
    assert f"| in-place / floor {res['in_place_over_floor']}x |" in md
    assert f"| Recreate / in-place {res['recreate_over_in_place']}x |" in md
    assert "## Goals (printed, not asserted)" in md
    assert "- in place <= 3 s at N=100: not measured (N=100 not in this run)" in md
    png = paths["png"]
    if png is not None:  # matplotlib is the optional `bench` extra
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(240)
async def test_progress_twins_are_measured_beside_their_modes_with_the_steady_cost(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    """`--progress`: in-place and process again with every trainer reporting, and the
    controller's cost over a steady window long enough for each agent's first summary (at a
    random point of its 30 s period)."""
    settings = Settings(
        sizes=[3], reps=1, restart_delay=0.2, start_delay=0.1, modes=("in-place", "process"),
        progress=True, progress_window=33.0, progress_settle=0.0, name="smoke-progress",
        results_dir=tmp_path,
    )  # fmt: skip
    data = await run_on(sim_cluster, settings)

    (res,) = data["results"]
    assert set(res["modes"]) == {"in-place", "in-place+progress", "process", "process+progress"}
    for mode in ("in-place+progress", "process+progress"):
        assert res["modes"][mode]["reps"] == 1, mode
    twin = next(r for r in res["runs"] if r["mode"] == "in-place+progress")
    assert twin["trigger"] == "ProcessExit"
    cost = res["progress_cost"]
    assert cost["reports"] >= 3  # every agent of the reporting gang summarised in the window
    assert cost["window_s"] >= 33.0
    assert cost["cpu_share"] >= 0
    assert cost["cpu_share_without"] is not None
    # status.progress is written while the gang trains, at most every 30 s.
    assert 1 <= cost["job_writes"] <= 2
    assert res["in_place_progress_over_in_place"] > 0
    md = report(settings, data, data["results"])
    assert "| in-place+progress | 1 |" in md
    assert f"in-place+progress / in-place {res['in_place_progress_over_in_place']}x" in md
    assert f"{cost['reports']} summaries accepted" in md
    assert "- progress with every agent reporting at N=5000" in md


@pytest.mark.timeout(120)
async def test_a_repetition_that_overruns_is_recorded_and_the_run_goes_on(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    """A long run must not end in its last hour because one repetition overran: the row says
    how far it got, the gang's other repetitions are skipped, the next gang is measured."""
    settings = Settings(
        sizes=[3], reps=2, restart_delay=60.0, start_delay=0.1, name="overrun",
        results_dir=tmp_path, modes=("in-place", "recreate"), rep_limit_s=4.0,
    )  # fmt: skip
    data = await run_on(sim_cluster, settings)

    (res,) = data["results"]
    runs = {(r["mode"], r["rep"]): r for r in res["runs"]}
    # The simulated kubelet takes 60 s to restart a pod: the in-place restart cannot finish.
    unfinished = runs[("in-place", 0)]
    assert unfinished["unfinished"] is True
    assert unfinished["limit_s"] == 4.0
    assert "arrived" in unfinished["missing"]
    assert "visible->epoch" in unfinished["steps"]  # it got as far as the epoch bump
    assert ("in-place", 1) not in runs  # the rest of that gang was skipped
    # The Recreate gang (new pods start in 0.1 s) was still measured.
    assert runs[("recreate", 0)]["seconds"] > 0
    in_place = res["modes"]["in-place"]
    assert in_place["reps"] == 0
    assert in_place["unfinished_over_s"] == [4.0]
    assert in_place["seconds"] is None
    assert res["recreate_over_in_place"] is None
    md = report(settings, data, data["results"])
    assert "| in-place | 0 + 1 unfinished (> 4 s) |" in md
    assert "overran: in-place 1 (> 4 s)" in md


@pytest.mark.timeout(300)
async def test_the_jobset_peer_restarts_the_same_gang_and_the_goals_are_printed(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    """`--peers jobset`: JobSet's restart of a gang of 3 at the controller-manager's defaults
    and with its client QPS raised, each beside GangJob's in place at the same settings, and
    the goals section."""
    settings = Settings(
        sizes=[3], reps=1, restart_delay=0.2, start_delay=0.1, name="peer", results_dir=tmp_path,
        modes=("in-place", "floor"), peers=("jobset",),
    )  # fmt: skip
    data = await run_on(sim_cluster, settings)

    (res,) = data["results"]
    assert list(res["modes"]) == ["in-place", "floor", JOBSET, IN_PLACE_RAISED, JOBSET_RAISED]
    for mode in (JOBSET, JOBSET_RAISED):
        m = res["modes"][mode]
        assert m["reps"] == 1, mode
        assert m["seconds"]["median"] > 0, mode
        assert set(m["steps"]) == {
            "injected->visible", "visible->stopped", "stopped->restarted", "restarted->deleted",
            "deleted->first-new", "first-new->created", "created->scheduled",
            "scheduled->running",
        }, mode  # fmt: skip
        assert m["cpu_s"]["jobset-controller"] >= 0, mode
    assert res["jobset_over_in_place"] > 0
    assert res["jobset_raised_over_in_place"] > 0
    # GangJob in place on the raised controller-manager too, beside JobSet's.
    assert res["modes"][IN_PLACE_RAISED]["reps"] == 1
    assert res["jobset_raised_over_in_place_raised"] > 0
    (jobset_run,) = (r for r in res["runs"] if r["mode"] == JOBSET)
    assert jobset_run["span"] == "visible->running"
    assert jobset_run["worker"].startswith("jobset-0-workers-0-")

    # The simulation's CPU within each in-place restart, and the restart less it.
    (in_place,) = (r for r in res["runs"] if r["mode"] == "in-place")
    assert in_place["bench_cpu_s"] > 0
    assert in_place["seconds_minus_bench_cpu"] == pytest.approx(
        in_place["seconds"] - in_place["bench_cpu_s"], abs=0.002
    )
    assert {"bench", "controller", "kube-apiserver", "kube-controller-manager"} <= set(
        in_place["cpu_s"]
    )

    # The raised row ran on a controller-manager with the raised QPS; it runs at its
    # defaults again afterwards, recorded as the cluster's.
    kcm_log = (sim_cluster.logs / f"{CONTROLLER_MANAGER}.log").read_text()
    assert "--kube-api-qps=500 --kube-api-burst=1000" in kcm_log
    (kcm,) = (p for p in sim_cluster.procs() if p.name == CONTROLLER_MANAGER)
    assert kcm.alive()
    assert not [a for a in command_line(kcm.pid) if a.startswith("--kube-api-qps")]

    md = report(settings, data, data["results"])
    assert "| JobSet | 1 |" in md
    assert "| JobSet (QPS 500) | 1 |" in md
    assert f"| JobSet (QPS 500) / in-place {res['jobset_raised_over_in_place']}x |" in md
    assert "- JobSet: slowest step " in md
    assert "the controller-manager's client allows 500/s" in md
    goals = md.split("## Goals (printed, not asserted)\n\n")[1].strip().splitlines()
    assert len(goals) == 24  # progress 2, in a row 2, resize 2, node loss 4, TLS 1, CPU 1
    for line in goals:
        assert line.startswith("- "), line
        assert line.endswith(" met") or "not met (" in line or "not measured (" in line, line
    assert (
        "- Process mode in place <= 3 s at N=5000: not measured (N=5000 not in this run)" in goals
    )
    paths = write_results(settings, data, tmp_path)
    assert paths["json"] is not None
    assert json.loads(paths["json"].read_text())["goals"][0]["met"] is None  # N=100: not run


@pytest.mark.timeout(300)
async def test_node_loss_modes_shrink_take_a_spare_and_wait(
    sim_cluster: Cluster, tmp_path: Path
) -> None:
    """The node-loss modes, each in a gang of its own, a node lost with no room for the new
    pod: the elastic gang shrinks, the spare takes the worker's place (in a `Process` gang and
    in a `Pod` gang), the gang that is not elastic is seen waiting (an unfinished row: how
    long), and the goals say so."""
    settings = Settings(
        sizes=[3], reps=1, restart_delay=0.2, start_delay=0.1, modes=NODE_LOSS,
        wait_bound=3.0, name="smoke-node-loss", results_dir=tmp_path,
    )  # fmt: skip
    data = await run_on(sim_cluster, settings)

    (res,) = data["results"]
    runs = {r["mode"]: r for r in res["runs"]}
    assert set(runs) == set(NODE_LOSS)
    spare, spare_pod, shrink, wait = (runs[m] for m in NODE_LOSS)
    assert shrink["trigger"] == "NodeLost"
    assert shrink["detail"].endswith("; resized 3 -> 2 (worker lost, no spare)")
    for run in (spare, spare_pod):
        assert run["trigger"] == "NodeLost"
        assert run["detail"].endswith(f"; spare 3 takes worker {run['worker'][-1]}'s place")
    for run in (shrink, spare, spare_pod):
        assert run["seconds"] > 0
        assert set(run["steps"]) >= {"visible->epoch", "epoch->arrived", "arrived->barrier"}
    assert wait["unfinished"] is True
    assert wait["limit_s"] >= 3.0
    assert "barrier" in wait["missing"]
    assert res["modes"][NODE_LOST_WAIT]["unfinished_over_s"] == [wait["limit_s"]]
    md = report(settings, data, data["results"])
    assert "- node lost with a spare (failure visible -> barrier) within 1.2x of in place" in md
    assert "- node lost with a spare, Pod mode (failure visible -> barrier) within 1.2x" in md
    assert "- node lost without elastic, no capacity: the gang waits, at N=1000" in md
