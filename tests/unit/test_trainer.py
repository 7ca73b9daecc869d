"""`Process` mode's trainer leaves nothing behind: not its process group, and, when the agent
adopts orphans (`wrap` as PID 1 or subreaper), not what left the group or was orphaned either.

Each case runs in a child Python process, so that pytest itself never becomes a subreaper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from agent.trainer import Trainer

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


class RecordingTrainer(Trainer):
    """A `Trainer` that remembers the signals its stop sent to the group."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(argv, env)
        self.sent: list[signal.Signals] = []

    def send_signal(self, sig: signal.Signals) -> None:
        self.sent.append(sig)
        super().send_signal(sig)


async def said_ready(fifo: pathlib.Path, deadline: float = 10.0) -> str:
    """What the trainer wrote into `fifo`, once it did."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fifo.read_text), deadline)
    finally:
        # If the trainer never wrote, unblock the reading thread (EOF), or it hangs the run.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# The node's images run busybox's ash; the host's sh is whatever it is (dash on Debian).
SHELLS = [["sh"], *([["busybox", "sh"]] if shutil.which("busybox") else [])]


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
async def test_a_trainer_that_leaves_on_sigterm_needs_no_sigkill(
    tmp_path: pathlib.Path, shell: list[str]
) -> None:
    # The shape of benchmarks.node_restart's trainer: a shell that leaves through its TERM trap
    # while the wait builtin waits for its work in the background (the trap runs at once).
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    script = "trap 'exit 0' TERM; echo ready > \"$READY\"; while :; do sleep 1 & wait $!; done"
    trainer = RecordingTrainer([*shell, "-c", script], {**os.environ, "READY": str(ready)})
    await trainer.start()
    assert await said_ready(ready) == "ready\n"  # the trap is set
    # Were SIGTERM not enough, the grace would end in a SIGKILL (137), listed in `sent`.
    code = await trainer.stop(grace=5.0)
    assert (code, trainer.sent) == (0, [signal.SIGTERM])  # the trap's exit, SIGTERM only
