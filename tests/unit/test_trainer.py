"""`Process` mode's trainer leaves nothing behind: not its process group, and, when the agent
adopts orphans (`wrap` as PID 1 or subreaper), not what left the group or was orphaned either.

Each case runs in a child Python process, so that pytest itself never becomes a subreaper."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A trainer that leaves a member of its group behind and one process that left the group with
# setsid (its pid goes to $OUT), then fails. Its output is closed: no leftover holds our pipes.
TRAINER = 'exec >/dev/null 2>&1; sleep 300 & setsid sleep 300 & echo $! > "$OUT"; sleep 0.2; exit 3'

SCRIPT = """
import asyncio, json, os, sys
from agent.trainer import Trainer, become_subreaper, children

async def main():
    adopts = sys.argv[1] == "adopt"
    if adopts:
        assert become_subreaper()
    trainer = Trainer(["bash", "-c", sys.argv[2]], dict(os.environ), adopts=adopts)
    await trainer.start()
    code = await trainer.wait()
    print(json.dumps({"code": code, "children": children(os.getpid())}))

asyncio.run(main())
"""


def run(tmp_path: pathlib.Path, how: str) -> tuple[dict[str, object], int]:
    out = tmp_path / f"escaped-{how}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, TRAINER],
        env={**os.environ, "OUT": str(out), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout), int(out.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")
def test_an_adopting_agent_kills_and_reaps_what_a_run_left_behind(tmp_path: pathlib.Path) -> None:
    result, escaped = run(tmp_path, "adopt")
    assert result == {"code": 3, "children": []}  # no child left, not even a zombie
    assert not alive(escaped)


@pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")
def test_without_adoption_a_process_that_left_the_group_survives(tmp_path: pathlib.Path) -> None:
    # Why adoption is needed: the group kill alone misses the setsid'd process.
    result, escaped = run(tmp_path, "group-only")
    try:
        assert result["code"] == 3
        assert alive(escaped)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)
