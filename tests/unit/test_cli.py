"""Unit tests of the command line's pure parts: flags to a GangJob (cli.main) and the status
tables (cli.render)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api import builders
from cli.main import UsageError, context_namespace, manifest_from_args, parser
from cli.render import status_lines, table


def submit_args(*argv: str):  # type: ignore[no-untyped-def]
    return parser().parse_args(["submit", *argv])


def test_flags_build_the_gangjob_the_builder_builds() -> None:
    args = submit_args(
        "--name", "llm", "--image", "t:1", "--workers", "4", "--processes", "auto",
        "--gpus", "8", "--", "torchrun", "train.py", "--epochs", "3",
    )  # fmt: skip
    gpus = {"nvidia.com/gpu": "8"}
    assert manifest_from_args(args, "ml") == builders.gangjob(
        "llm", 4, namespace="ml", image="t:1", command=["torchrun", "train.py", "--epochs", "3"],
        container={"resources": {"limits": gpus, "requests": gpus}},
        spec={"nprocPerNode": "auto"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--workers", "2", "--", "x"], "--image"),
        (["--image", "i", "--", "x"], "--workers"),
        (["--image", "i", "--workers", "2"], "COMMAND"),
        (["--image", "i", "--workers", "1", "--checkpoints", "pvc:", "--", "x"], "--checkpoints"),
    ],
)
def test_what_cannot_run_is_refused_naming_the_flag(argv: list[str], names: str) -> None:
    with pytest.raises(UsageError, match=names):
        manifest_from_args(submit_args(*argv), "ml")


def test_a_manifest_file_goes_alone(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: gangjob.io/v1alpha1\nkind: GangJob\nmetadata: {name: a}\n")
    assert manifest_from_args(submit_args("-f", str(path)), "ml")["metadata"] == {
        "name": "a",
        "namespace": "ml",
    }
    with pytest.raises(UsageError, match="--image"):
        manifest_from_args(submit_args("-f", str(path), "--image", "x"), "ml")


def test_processes_must_be_positive_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        submit_args("--processes", "0")
    assert "--processes" in capsys.readouterr().err


def test_the_namespace_of_the_kubeconfig_context(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "current-context: a\ncontexts:\n- name: a\n  context: {namespace: ml}\n"
        "- name: b\n  context: {}\n"
    )
    assert context_namespace(str(config), None) == "ml"
    assert context_namespace(str(config), "b") == "default"
    assert context_namespace(str(tmp_path / "missing"), None) == "default"


def test_table_aligns_columns() -> None:
    assert table(["A", "BB"], [["ccc", "d"]]) == ["A    BB", "ccc  d"]


def test_status_lines_show_the_state_and_every_restart() -> None:
    trigger = {"worker": 1, "class": "ProcessExit", "detail": "code 1", "action": "RestartGang"}
    done = {"epoch": 1, "trigger": trigger, "detectedAt": "t1", "durationSeconds": 1.234}
    manual = {"class": "ManualRestart", "action": "RestartGang"}
    going = {"epoch": 2, "trigger": manual, "detectedAt": "t2"}
    job = {
        "metadata": {"name": "llm"},
        "spec": {"replicas": 2, "restart": {"mode": "Pod"}},
        "status": {
            "phase": "Restarting", "epoch": 2, "barrierEpoch": 1, "mode": "Pod",
            "workers": {"total": 2, "ready": 2, "arrived": 1},
            "restarts": {"total": 2, "counted": 1, "inPlace": 2},
            "history": [done], "lastRestart": going,
        },
    }  # fmt: skip
    lines = status_lines(job)
    assert lines[1].split() == ["llm", "Restarting", "2", "1", "2/2", "1/2", "2/2", "Pod"]
    assert lines[3] == "Restarts: 2 (2 in place, 1 counted, 0 workers recreated)"
    assert lines[5].split() == ["1", "worker", "1", "ProcessExit", "RestartGang", "t1", "1.23s",
                                "-", "code", "1"]  # fmt: skip
    assert lines[6].split() == ["2", "gang", "ManualRestart", "RestartGang", "t2", "in",
                                "progress", "-", "-"]  # fmt: skip


def test_status_lines_show_progress_goodput_and_the_work_a_restart_lost() -> None:
    trigger = {"worker": 3, "class": "Hang", "detail": "no step past 41", "action": "RestartGang"}
    done = {"epoch": 1, "trigger": trigger, "detectedAt": "t1", "durationSeconds": 2.0,
            "lostSteps": 41, "lostSeconds": 20.5}  # fmt: skip
    job = {
        "metadata": {"name": "llm"},
        "spec": {"replicas": 4},
        "status": {
            "phase": "Running", "epoch": 1, "barrierEpoch": 1,
            "restarts": {"total": 1, "counted": 1, "inPlace": 1},
            "history": [done], "lastRestart": done,
            "progress": {"step": 120, "stepsPerSecond": 2.0, "checkpointStep": 100,
                         "reporting": 4, "updatedAt": "t9"},
            "goodput": {"ratio": 0.9, "wallSeconds": 300, "productiveSeconds": 270,
                        "lostSeconds": {"scheduling": 10, "detection": 7, "restart": 2,
                                        "recompute": 11}},
        },
    }  # fmt: skip
    lines = status_lines(job)
    assert lines[3] == (
        "Progress: step 120 at 2.00 steps/s, last checkpoint 100 (4 workers reporting, as of t9)"
    )
    assert lines[4] == (
        "Goodput: 90.0% (270s productive of 300s; lost: scheduling 10s, detection 7s, "
        "restart 2s, recompute 11s)"
    )
    assert lines[7].split()[:8] == ["1", "worker", "3", "Hang", "RestartGang", "t1", "2.00s", "41"]


def test_status_of_a_new_job() -> None:
    lines = status_lines({"metadata": {"name": "a"}, "spec": {"replicas": 3}})
    assert lines[1].split() == ["a", "Pending", "0", "-", "0/3", "0/3", "0/3", "-"]
    assert lines[-1].startswith("Restarts: 0")
