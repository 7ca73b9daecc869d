"""The trainer's progress helper (agent/gangjob_progress.py) as a trainer meets it: put on its path
by the agent (also from the zipapp), writing lines the agent reads, and dumping its stacks when
the agent asks."""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from agent import gangjob_progress
from agent.build import build_zipapp
from agent.config import Config
from agent.monitor import ProgressMonitor, collect_stacks, registered, trainer_env
from agent.progress import Line, ProgressFile, parse_line
from api.constants import (
    ENV_PROGRESS,
    ENV_PYTHONPATH,
    HELPER_DIR,
    HELPER_MODULE,
    PROGRESS_FILE,
    STACKS_PREFIX,
    STACKS_SIGNAL,
)


def test_the_helper_spells_the_protocol_names_as_api_constants() -> None:
    # It stands alone in the trainer's interpreter, and cannot import them.
    assert gangjob_progress.ENV_PROGRESS == ENV_PROGRESS
    assert gangjob_progress.STACKS_PREFIX == STACKS_PREFIX
    assert gangjob_progress.STACKS_SIGNAL == STACKS_SIGNAL
    assert gangjob_progress.__name__.rpartition(".")[2] == HELPER_MODULE


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((5,), "step=5\n"),
        ((5, 0.125, 4), "step=5 compute=0.125 checkpoint=4\n"),
        ((0, None, 0), "step=0 checkpoint=0\n"),
    ],
)
def test_its_lines_are_what_the_agent_parses(args: tuple[int, float, int], text: str) -> None:
    assert gangjob_progress.line(*args) == text
    assert parse_line(text) == Line(*args)


@pytest.mark.parametrize(
    "args", [(-1,), (True,), (1.5,), (1, -0.1), (1, float("nan")), (1, None, -3)]
)
def test_it_refuses_what_would_be_malformed(args: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="required"):
        gangjob_progress.line(*args)  # type: ignore[arg-type]


@pytest.fixture
def progress_env(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    (tmp_path / "progress").mkdir()
    target = tmp_path / PROGRESS_FILE
    monkeypatch.setenv(ENV_PROGRESS, str(target))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return target


def test_step_replaces_the_file_and_registers_the_stack_dump(progress_env: pathlib.Path) -> None:
    gangjob_progress.step(1)
    gangjob_progress.step(2, compute=0.5, checkpoint=1)
    assert progress_env.read_text() == "step=2 compute=0.5 checkpoint=1\n"
    assert ProgressFile(progress_env).poll() == Line(2, 0.5, 1)
    [reg] = registered(progress_env.parent)
    assert reg.pid == os.getpid()
    assert [p.name for p in progress_env.parent.iterdir() if p.name.startswith(".")] == []


def test_under_torchrun_each_local_process_has_its_file(
    progress_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    gangjob_progress.step(7)
    assert (progress_env.parent / "steps.3").read_text() == "step=7\n"
    assert not progress_env.exists()


def test_outside_a_gangjob_or_unable_to_write_it_changes_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_PROGRESS, raising=False)
    gangjob_progress.step(1)  # no GangJob: nothing to do
    monkeypatch.setenv(ENV_PROGRESS, str(tmp_path / "missing" / "steps"))
    gangjob_progress.step(1)
    gangjob_progress.step(2)  # never fatal, and said once
    assert capsys.readouterr().err.count("cannot write") <= 1


@pytest.fixture
def trainer_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """`$GANGJOB_DIR` prepared by the agent as at an arrival."""
    config = Config(job_name="train", pod_name="train-0", namespace="ns", dir=tmp_path)
    ProgressMonitor(config, logging.LoggerAdapter(logging.getLogger("test"))).prepare()
    return tmp_path


def start_trainer(directory: pathlib.Path, code: str) -> subprocess.Popen[str]:
    """A Python trainer started as the agent starts it, once it has reported."""
    env = trainer_env(directory, {"PATH": os.environ.get("PATH", "")})
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "reported\n"
    return proc


TRAINER = """\
import sys, threading, time
import gangjob_progress

def collective():
    time.sleep(60)

gangjob_progress.step(3, checkpoint=2)
threading.Thread(target=collective, name="loader", daemon=True).start()
print("reported", flush=True)
collective()
"""


async def test_a_trainer_imports_the_helper_and_dumps_its_stacks_when_asked(
    trainer_dir: pathlib.Path,
) -> None:
    assert (trainer_dir / HELPER_DIR / f"{HELPER_MODULE}.py").exists()
    proc = start_trainer(trainer_dir, TRAINER)
    try:
        assert (trainer_dir / PROGRESS_FILE).read_text() == "step=3 checkpoint=2\n"
        stacks = await collect_stacks(trainer_dir / "progress", proc.pid)
        assert f"== pid {proc.pid} (state S" in stacks
        # Every thread's stack: the loader's down to where it waits.
        assert stacks.count("hread 0x") == 2
        assert "line 5 in collective" in stacks
        assert proc.poll() is None  # the trainer keeps running
    finally:
        proc.kill()
        proc.wait()


async def test_a_stopped_trainer_cannot_dump_and_the_collection_says_so(
    trainer_dir: pathlib.Path,
) -> None:
    proc = start_trainer(trainer_dir, TRAINER)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        stacks = await collect_stacks(trainer_dir / "progress", proc.pid, wait=0.3)
        assert f"== pid {proc.pid} (state T" in stacks
        assert "no stacks within" in stacks
        assert "stopped" in stacks
    finally:
        proc.kill()
        proc.wait()


async def test_without_the_helper_what_the_agent_can_see_is_collected(
    trainer_dir: pathlib.Path,
) -> None:
    proc = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220 - returns at once
    try:
        stacks = await collect_stacks(trainer_dir / "progress", proc.pid, wait=0.1)
        assert f"== pid {proc.pid} (state " in stacks
        assert "registered no stack dump" in stacks
    finally:
        proc.kill()
        proc.wait()
    assert "none registered" in await collect_stacks(trainer_dir / "progress", None, wait=0.1)


def test_the_zipapp_carries_the_helper(tmp_path: pathlib.Path) -> None:
    pyz = build_zipapp(tmp_path / "agent.pyz")
    code = (
        "import logging, sys, pathlib\n"
        "from agent.config import Config\n"
        "from agent.monitor import ProgressMonitor\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "c = Config(job_name='j', pod_name='p', namespace='n', dir=d)\n"
        "ProgressMonitor(c, logging.LoggerAdapter(logging.getLogger())).prepare()\n"
    )
    env = {"PYTHONPATH": str(pyz)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    written = (tmp_path / HELPER_DIR / f"{HELPER_MODULE}.py").read_text()
    assert written == pathlib.Path(gangjob_progress.__file__).read_text()
    assert trainer_env(tmp_path, {ENV_PYTHONPATH: "/app"})[ENV_PYTHONPATH] == (
        f"{tmp_path / HELPER_DIR}{os.pathsep}/app"
    )
