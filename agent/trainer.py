"""`Process` mode's trainer: one run of the user's command as its own process group, and how to
stop it (SIGTERM to the group, SIGKILL after a grace). A group, because a trainer such as
torchrun forks workers that must not outlive their epoch."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

from agent.protocol import exit_status


class Trainer:
    """One trainer process. `start()` once, then `wait()` or `stop()`."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        if not argv:
            raise ValueError("no trainer command")
        self.argv = list(argv)
        self.env = dict(env)
        self._proc: asyncio.subprocess.Process | None = None
        self._status: int | None = None

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
        if self._status is not None:
            return self._status
        if self._proc is None:
            raise RuntimeError("trainer not started")
        returncode = await self._proc.wait()
        self._kill_group(signal.SIGKILL)
        self._status = exit_status(returncode)
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
