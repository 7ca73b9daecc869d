"""Unit tests of the Python client's pure parts (gangjob.spec, gangjob.model) and of what the
command line builds on them: `gangjob list`'s table, the shell completion, the timeline of
`gangjob report` and its picture."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from api import builders
from cli import completion
from cli.main import parser, program_name
from cli.render import age, list_lines
from cli.report import draw
from cli.timeline import timeline
from gangjob import Job, SpecError
from gangjob.spec import function_program, manifest

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def job_with_status(status: dict[str, Any], name: str = "llm", replicas: int = 4) -> dict[str, Any]:
    body = builders.gangjob(name, replicas, namespace="ml", image="t:1", command=["x"])
    body["metadata"]["creationTimestamp"] = at(0).split(".")[0] + "Z"
    body["status"] = status
    return body


HANG = {"worker": 3, "class": "Hang", "detail": "no step", "action": "RestartGang"}
EXIT = {"worker": 1, "class": "ProcessExit", "detail": "code 1", "action": "RestartGang"}
TRAINING = {
    "phase": "Running", "epoch": 2, "barrierEpoch": 2, "startTime": at(0).split(".")[0] + "Z",
    "workers": {"total": 4, "ready": 3, "arrived": 4},
    "restarts": {"total": 2, "counted": 2, "inPlace": 2},
    "history": [
        {"epoch": 1, "trigger": EXIT, "detectedAt": at(31), "onsetAt": at(30),
         "barrierOpenAt": at(33), "durationSeconds": 2.0, "step": 60, "checkpointStep": 50,
         "lostSteps": 10, "lostSeconds": 5.0},
    ],
    "lastRestart": {"epoch": 2, "trigger": HANG, "detectedAt": at(80), "onsetAt": at(65),
                    "step": 120, "checkpointStep": 100, "lostSteps": 20},
    "progress": {"step": 120, "stepsPerSecond": 2.0, "checkpointStep": 100, "reporting": 4,
                 "updatedAt": at(65).split(".")[0] + "Z"},
    "goodput": {"ratio": 0.75, "wallSeconds": 90, "productiveSeconds": 67.5},
}  # fmt: skip


def test_a_job_reads_its_status_typed() -> None:
    job = Job.from_api(job_with_status(TRAINING))
    assert (job.name, job.namespace, job.phase, job.epoch, job.restarts) == (
        "llm", "ml", "Running", 2, 2,
    )  # fmt: skip
    assert (job.workers_ready, job.workers, job.step, job.goodput) == (3, 4, 120, 0.75)
    assert [r.epoch for r in job.history] == [1, 2]  # the one in progress last
    assert job.history[1].trigger.failure_class == "Hang"
    assert not job.finished
    new = Job.from_api(builders.gangjob("a", 2, image="i", command=["x"]))
    assert (new.phase, new.step, new.goodput, new.history) == ("Pending", None, None, [])


def train(steps: int, lr: float = 0.1) -> None:
    import json

    print(json.dumps({"steps": steps, "lr": lr}))


def test_a_function_becomes_a_program_that_calls_it_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "main.py"
    script.write_text(function_program(train, {"steps": 3}))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '{"steps": 3, "lr": 0.1}'
    with pytest.raises(SpecError, match="func"):
        function_program(lambda: None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"image": None}, "image"),
        ({"workers": 0}, "workers"),
        ({"command": []}, "command"),
        ({"processes": 0}, "processes"),
        ({"mode": "Sometimes"}, "mode"),
        ({"checkpoints": "relative/dir"}, "checkpoints"),
    ],
)
def test_a_job_that_cannot_run_is_refused_naming_the_argument(
    kwargs: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {
        "name": "a", "namespace": "ml", "image": "i", "workers": 2, "command": ["x"], **kwargs,
    }  # fmt: skip
    with pytest.raises(SpecError) as info:
        manifest(**args)
    assert info.value.field == field


def test_list_shows_phase_workers_epoch_restarts_step_goodput_and_age() -> None:
    jobs = [
        Job.from_api(job_with_status(TRAINING)),
        Job.from_api(job_with_status({}, name="new", replicas=2)),
    ]
    lines = list_lines(jobs, all_namespaces=True, now=T0 + timedelta(minutes=5))
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "PHASE", "READY", "EPOCH", "RESTARTS", "STEP", "GOODPUT", "AGE",
    ]  # fmt: skip
    assert lines[1].split() == ["ml", "llm", "Running", "3/4", "2", "2", "120", "75.0%", "5m"]
    assert lines[2].split() == ["ml", "new", "Pending", "0/2", "0", "0", "-", "-", "5m"]
    assert list_lines(jobs, all_namespaces=False, now=T0)[0].startswith("NAME ")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(5, "5s"), (119, "119s"), (600, "10m"), (3 * 3600 + 240, "3h4m"), (9 * 3600, "9h"),
     (2 * 86400 + 5 * 3600, "2d5h"), (30 * 86400, "30d")],
)  # fmt: skip
def test_age_reads_like_kubectl(seconds: int, shown: str) -> None:
    assert age(T0, T0 + timedelta(seconds=seconds)) == shown


def test_completion_offers_commands_flags_choices_and_jobs() -> None:
    p = parser()
    asked: list[list[str]] = []

    def jobs(words: Any) -> list[str]:
        asked.append(list(words))
        return ["llm", "llama", "bert"]

    assert completion.candidates(p, ["st"], jobs) == ["status"]
    assert "list" in completion.candidates(p, [""], jobs)
    assert completion.candidates(p, ["list", "--all"], jobs) == ["--all-namespaces"]
    assert completion.candidates(p, ["list", "-o", ""], jobs) == ["wide", "name"]
    assert completion.candidates(p, ["status", "-n", "ml", "l"], jobs) == ["llm", "llama"]
    assert asked == [["status", "-n", "ml"]]  # the namespace reaches the lookup
    assert completion.candidates(p, ["completion", "z"], jobs) == ["zsh"]
    assert completion.candidates(p, ["submit", ""], jobs) == []
    assert "gangjob __complete" in completion.bash()
    assert "bashcompinit" in completion.zsh()


def test_the_program_names_itself_as_kubectl_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/kubectl-gangjob", "status"])
    assert program_name() == "kubectl gangjob"
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/gangjob"])
    assert program_name() == "gangjob"


def test_the_timeline_joins_the_steps_restarts_record() -> None:
    t = timeline(job_with_status(TRAINING), now=T0 + timedelta(seconds=90))
    assert t.quantity == "step"
    assert [((p[0] - T0).total_seconds(), p[1]) for p in t.points] == [
        (0, 0), (30, 60), (33, 60), (33, 50), (65, 120), (65, 120),
    ]  # fmt: skip
    first, going = t.restarts
    assert first.label == "ProcessExit (2.0s, lost 10 steps)"
    assert going.resumed is None
    assert going.label == "Hang (in progress, lost 20 steps)"
    assert (t.end - T0).total_seconds() == 90


def test_a_job_without_progress_is_drawn_by_its_epochs() -> None:
    status = {k: v for k, v in TRAINING.items() if k not in ("progress", "goodput")}
    t = timeline(job_with_status(status), now=T0 + timedelta(seconds=90))
    assert t.quantity == "epoch"
    assert [((p[0] - T0).total_seconds(), p[1]) for p in t.points] == [
        (0, 0), (31, 0), (31, 1), (80, 1), (80, 2), (90, 2),
    ]  # fmt: skip


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_picture_is_written(tmp_path: Path, suffix: str) -> None:
    path = draw(timeline(job_with_status(TRAINING), T0 + timedelta(seconds=90)),
                tmp_path / f"llm{suffix}")  # fmt: skip
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]
    assert len(data) > 10_000
