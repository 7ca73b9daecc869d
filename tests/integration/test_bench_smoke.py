"""A quick smoke of `benchmarks.scale` (`make bench`'s benchmark): a tiny gang through
every measurement on the test cluster, and a report that is well formed. Not a measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scale.report import report, write_results
from benchmarks.scale.runner import run_on
from benchmarks.scale.settings import MODES, Settings
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
    assert set(res["modes"]) == set(MODES)
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
    floor = res["modes"]["floor"]
    assert set(floor["steps"]) == {
        "injected->seen", "seen->restarted", "restarted->arrived", "arrived->barrier",
        "barrier->open",
    }  # fmt: skip
    assert floor["controller_share_s"]["bump"] is None  # no failure: the bench raised the epoch
    assert res["in_place_to_open_s"]["median"] >= in_place["seconds"]["median"]
    assert res["in_place_over_floor"] > 0
    assert res["recreate_over_in_place"] > 0
    assert res["recreate_over_in_place_annotation"] > 0
    assert res["controller_rss_max_mib"] > 0
    node_lost = [r for r in res["runs"] if r["mode"] == "node-lost"]
    assert node_lost[0]["trigger"] == "NodeLost"
    assert len(node_lost[0]["recreated"]) == 1
    recreate = [r for r in res["runs"] if r["mode"] == "recreate"]
    assert recreate[0]["recreated"] == [0, 1, 2]  # the status says all, not each

    paths = write_results(settings, data, tmp_path)
    assert json.loads(paths["json"].read_text())["results"][0]["workers"] == 3  # type: ignore[union-attr]
    md = report(settings, data, data["results"])
    assert "## N = 3" in md
    assert "| in-place | 1 |" in md
    assert f"| in-place / floor {res['in_place_over_floor']}x |" in md
    assert f"| Recreate / in-place {res['recreate_over_in_place']}x |" in md
    assert "goal >= 15x" in md
    png = paths["png"]
    if png is not None:  # matplotlib is the optional `bench` extra
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
