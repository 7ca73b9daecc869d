"""`Process` mode's trainer: one run of the user's command as its own process group, and how to
stop it (SIGTERM to the group, SIGKILL after a grace). A group, because a trainer such as
torchrun forks workers that must not outlive their epoch.

What the group cannot catch (a process that left it with `setsid`, or a group member orphaned
when its leader died) is caught by adoption: the agent in `wrap` is its container's PID 1 or
asks to be a child subreaper, so every orphan of a run becomes its child. Once a run's leader is
reaped, any child left is such an orphan: it is killed and reaped, so that nothing of an ended
run lingers and no zombie piles up over hundreds of restarts."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agent.protocol import exit_status


class TrainerRun(Protocol):
    """What the agent needs of one trainer run: `Trainer` is the real process; a simulation
    running thousands of agents in one process stands in an object of its own."""

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...


TrainerFactory = Callable[[Sequence[str], Mapping[str, str]], TrainerRun]
"""Makes one trainer run from the command and its environment."""


class Trainer:
    """One trainer process. `start()` once, then `wait()` or `stop()`."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], *, adopts: bool = False
    ) -> None:
        """`adopts`: this process inherits the run's orphans (PID 1 or a subreaper, see
        `become_subreaper`) and has no other children, so every child left after the run is
        the run's, to be killed and reaped."""
        if not argv:
            raise ValueError("no trainer command")
        self.argv = list(argv)
        self.env = dict(env)
        self.adopts = adopts
        self._proc: asyncio.subprocess.Process | None = None
        self._status: int | None = None
        self._cleared = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Starts the command; a command that cannot start counts as exited (127 not found,
        126 not executable), as a shell reports it."""
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, start_new_session=True
            )
        except FileNotFoundError:
            self._status = 127
        except PermissionError:
            self._status = 126

    async def wait(self) -> int:
        """The trainer's exit status (128+N if killed by signal N). Once its leader is gone, what
        is left of its group is killed: nothing of an ended run may linger."""
        if self._status is None:
            if self._proc is None:
                raise RuntimeError("trainer not started")
            returncode = await self._proc.wait()
            self._kill_group(signal.SIGKILL)
            self._status = exit_status(returncode)
        if self.adopts and not self._cleared:
            await clear_orphans()
            self._cleared = True
        return self._status

    def send_signal(self, sig: signal.Signals) -> None:
        """Sends `sig` to the trainer's process group."""
        if self._proc is not None and self._proc.returncode is None:
            self._kill_group(sig)

    async def stop(self, grace: float) -> int:
        """SIGTERM to the group; SIGKILL if the leader has not exited after `grace` seconds."""
        if self._proc is not None and self._status is None:
            self.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await self._proc.wait()
            except TimeoutError:
                self.send_signal(signal.SIGKILL)
        return await self.wait()

    def _kill_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        # The group id is the leader's pid (start_new_session); gone already is fine.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)


PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) option: orphaned descendants are re-parented to this process, not to PID 1."""


def become_subreaper() -> bool:
    """Makes this process the child subreaper of its descendants (Linux); False where that
    cannot be done. A container's PID 1 is one already."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children(parent: int) -> list[int]:
    """Pids whose parent is `parent`, zombies included, from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


async def clear_orphans(timeout: float = 5.0, poll: float = 0.05) -> list[int]:
    """SIGKILLs and reaps every child of this process; returns their pids. Only for a process
    whose children are all leftovers of ended runs (see `Trainer.adopts`). Gives up after
    `timeout` on a child that does not die (one stuck in the kernel)."""
    me, cleared = os.getpid(), []
    deadline = time.monotonic() + timeout
    while True:
        left = children(me)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
            except ChildProcessError:  # reaped by someone else, or not ours after all
                continue
            if reaped:
                cleared.append(pid)
        if not left or time.monotonic() >= deadline:
            return cleared
        await asyncio.sleep(poll)
