"""Processes a cluster starts: launched with their own log, recorded by PID *and* start time;
and free loopback ports for the ones that need a port of their own.

The start time (field 22 of /proc/<pid>/stat) makes a recorded PID safe to signal later: a PID
that the kernel has since given to somebody else's process no longer matches, and is left alone.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Proc:
    """A process this cluster started."""

    name: str
    pid: int
    start_ticks: int
    log: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Proc:
        return Proc(str(d["name"]), int(d["pid"]), int(d["start_ticks"]), str(d["log"]))

    def alive(self) -> bool:
        ticks = start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks and not _zombie(self.pid)


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def launch(
    name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Proc:
    """Starts ``cmd`` in its own session (so a Ctrl-C of the caller does not reach it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
        fh.flush()
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    ticks = start_ticks(p.pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited at once; see {log}")
    return Proc(name, p.pid, ticks, str(log))


def stop(proc: Proc, timeout: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``. Returns True if it was ours and running."""
    if not proc.alive():
        _reap(proc.pid)
        return False
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not proc.alive():
            return True
        time.sleep(0.1)
    if proc.alive():
        os.kill(proc.pid, signal.SIGKILL)
        while proc.alive():
            _reap(proc.pid)
            time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    """Collects the exit status when the process is our own child (the CLI's `up` in tests)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: str | Path, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=64)
"""The ports `free_port` returned last: free when asked, but a child given one may not have
bound it yet (two controller replicas' six ports are picked before either starts)."""


def free_port() -> int:
    """A free loopback port for a child's server (a controller's metrics, a gloo rendezvous),
    below the clusters' ports (21000+) and outside the kernel's ephemeral range: a port the
    kernel handed out (bind to 0) is free only until some outgoing connection takes it, before
    the child binds it. Never one of the last it returned."""
    for _ in range(200):
        port = random.randrange(20000, 21000)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.append(port)
            return port
    raise RuntimeError("no free port in 20000-20999")
