"""The agent's progress monitor (docs/progress.md): it prepares the trainer's progress directory
and helper at each arrival, polls the progress files while the trainer runs at an epoch, tells
the controller (one message per stall, a summary at most every `progress_summary_seconds`), and
on a stall collects the trainer's stacks into `$GANGJOB_DIR/stacks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pkgutil
import random
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.config import Config
from agent.progress import SHIFT_MIN_SECONDS, ProgressFiles, Summary, Tracker
from api.constants import (
    ENV_PROGRESS,
    ENV_PYTHONPATH,
    HELPER_DIR,
    HELPER_MODULE,
    PROGRESS_DIR,
    PROGRESS_FILE,
    STACKS_FILE,
    STACKS_PREFIX,
    STACKS_SIGNAL,
)

Send = Callable[[int, Summary], Awaitable[bool]]
"""Sends one epoch's summary to the controller; False if it did not take it."""

STACKS_WAIT_SECONDS = 2.0
"""How long a signalled process has to dump its stacks: faulthandler writes from its C signal
handler at once, unless the process is stopped or stuck in the kernel."""
STACKS_LOG_BYTES = 16384
"""How much of the collected stacks goes to the agent's log too (the file keeps them all)."""


def trainer_env(directory: Path, env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the progress contract of an agent whose `$GANGJOB_DIR` is `directory`:
    `GANGJOB_PROGRESS`, and the helper's directory first on `PYTHONPATH`."""
    helper = str(directory / HELPER_DIR)
    path = env.get(ENV_PYTHONPATH, "")
    return {
        **env,
        ENV_PROGRESS: str(directory / PROGRESS_FILE),
        ENV_PYTHONPATH: f"{helper}{os.pathsep}{path}" if path else helper,
    }


@dataclass(frozen=True)
class Registered:
    """A trainer process that registered the helper's stack dump (`stacks.<pid>`)."""

    pid: int
    start: str
    path: Path


@dataclass(frozen=True)
class ProcState:
    """What /proc says of a process: its state letter (R, S, D, T...) and CPU seconds."""

    state: str
    start: str
    cpu_seconds: float


def proc_state(pid: int) -> ProcState | None:
    """The process as this agent's pid namespace sees it; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK") or 100
    return ProcState(
        state=fields[0].decode(),
        start=fields[19].decode(),
        cpu_seconds=(int(fields[11]) + int(fields[12])) / ticks,
    )


STATES_BY_INTEREST = "TtDRS"
"""/proc's state letters, the most telling of a stall first: stopped (by a signal, or traced),
uninterruptible sleep (the kernel: a device, a mount), running, sleeping."""


def _telling(state: str) -> int:
    found = STATES_BY_INTEREST.find(state)
    return found if found >= 0 else len(STATES_BY_INTEREST)


def registered(directory: Path) -> list[Registered]:
    """The processes whose stack dump is registered in `directory`, as their files name them."""
    found = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(STACKS_PREFIX)]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(entry.path, "rb") as f:
                head = f.readline().decode("ascii", "replace").split()
        except OSError:
            continue
        fields = dict(t.partition("=")[::2] for t in head)
        pid = fields.get("pid", "")
        if pid.isdigit() and entry.name == f"{STACKS_PREFIX}{pid}":
            found.append(Registered(int(pid), fields.get("start", ""), Path(entry.path)))
    return found


def alive(reg: Registered) -> bool:
    """The registered process runs in this pid namespace (same pid and start time)."""
    state = proc_state(reg.pid)
    return state is not None and state.start == reg.start and state.state != "Z"


async def collect_stacks(
    directory: Path, trainer_pid: int | None, wait: float = STACKS_WAIT_SECONDS
) -> str:
    """Asks every registered trainer process this agent can see for its stacks and returns
    them, with each process' state and CPU time; says what it could not capture, and why."""
    sections: list[str] = []
    asked: dict[int, tuple[Registered, int]] = {}
    regs = registered(directory)
    for reg in regs:
        if not alive(reg):
            continue
        try:
            size = reg.path.stat().st_size
            os.kill(reg.pid, getattr(signal, STACKS_SIGNAL))
        except OSError as e:
            sections.append(f"== pid {reg.pid}: cannot ask for its stacks: {e}")
            continue
        asked[reg.pid] = (reg, size)
    deadline = time.monotonic() + wait
    dumps: dict[int, bytes] = {}
    while asked and time.monotonic() < deadline:
        for pid, (reg, size) in list(asked.items()):
            with contextlib.suppress(OSError):
                if reg.path.stat().st_size > size:
                    await asyncio.sleep(0.1)  # let it finish the dump
                    dumps[pid] = _read_from(reg.path, size)
                    del asked[pid]
        if asked:
            await asyncio.sleep(0.05)
    pids = sorted({*dumps, *asked, *([trainer_pid] if trainer_pid is not None else [])})
    for pid in pids:
        state = proc_state(pid)
        what = f"state {state.state}, cpu {state.cpu_seconds:.2f}s" if state else "not visible"
        if pid in dumps:
            sections.append(f"== pid {pid} ({what})\n{dumps[pid].decode('utf-8', 'replace')}")
        elif pid in asked:
            stopped = " (stopped: it dumps once continued)" if state and state.state == "T" else ""
            sections.append(f"== pid {pid} ({what}): no stacks within {wait:.0f}s{stopped}")
        elif not any(r.pid == pid for r in regs):
            sections.append(f"== pid {pid} ({what}): registered no stack dump (the helper)")
    if not sections:
        visible = "none registered" if not regs else "none of them visible to the agent"
        sections.append(f"no trainer process to ask for stacks ({visible})")
    return "\n".join(sections) + "\n"


def _read_from(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


SEEN_AT_ONCE: Final = 0.05
"""A step read this soon after it was written counts as seen when written."""


class ProgressMonitor:
    """Follows one worker's progress. `prepare()` at each arrival; `run()` as a task from the
    barrier on; `stop()` when the trainer stops or the gang moves on."""

    def __init__(
        self,
        config: Config,
        log: logging.LoggerAdapter[logging.Logger],
        send: Send | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.log = log
        self._send = send
        self._clock = clock
        self.directory = config.dir / PROGRESS_DIR
        self.tracker = Tracker(config.hang_seconds)
        self.files = ProgressFiles(self.directory, Path(PROGRESS_FILE).name)
        self.stalls = 0
        """Stalls detected since the agent started (for tests)."""
        self.summaries = 0
        """Summaries the controller took since the agent started (for tests)."""
        self._task: asyncio.Task[None] | None = None
        self._sent: Summary | None = None
        self._sent_at = 0.0
        self._retry_at = 0.0
        self._stall_retry_at = 0.0
        self._sending: asyncio.Task[bool] | None = None
        self._collecting: asyncio.Task[None] | None = None
        self._seen_alive: set[int] = set()

    def replay_stacks(self) -> None:
        """Logs the stacks an earlier run of this agent collected and has not logged since: a
        whole-pod restart (`Pod` mode) replaces the agent's container, and its log goes with it,
        while the agent's directory stays. Then the file is kept as `stacks.logged`."""
        path = self.config.dir / STACKS_FILE
        try:
            text = path.read_text(errors="replace")
            os.replace(path, path.with_name(f"{STACKS_FILE}.logged"))
        except OSError:
            return
        tail = text if len(text) <= STACKS_LOG_BYTES else text[:STACKS_LOG_BYTES] + "...\n"
        self.log.warning("stacks collected at the last stall, before this restart:\n%s", tail)

    def prepare(self) -> None:
        """An empty progress directory and the helper, before the epoch's trainer starts: what
        a trainer of an earlier epoch wrote says nothing of this one."""
        try:
            if self.directory.exists():
                for entry in os.scandir(self.directory):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
            self.directory.mkdir(parents=True, exist_ok=True)
            helper = pkgutil.get_data("agent", f"{HELPER_MODULE}.py")
            assert helper is not None
            target = self.config.dir / HELPER_DIR / f"{HELPER_MODULE}.py"
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_bytes() != helper:
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_bytes(helper)
                os.replace(tmp, target)
        except OSError as e:
            # Not fatal: the worker trains as before, its progress unseen.
            self.log.error("cannot prepare %s for progress: %s", self.directory, e)

    def start(self, epoch: int, trainer_pid: int | None) -> None:
        """Follows the epoch's progress from now on (the barrier is open, the trainer runs)."""
        self.tracker = Tracker(self.config.hang_seconds)
        self.files = ProgressFiles(self.directory, Path(PROGRESS_FILE).name)
        # The summaries of a gang's agents, all started by one barrier, must not come in step:
        # each agent's period starts at a random point of the first.
        jitter = random.uniform(0.0, self.config.progress_summary_seconds)
        self._sent, self._sent_at, self._retry_at = None, self._clock() - jitter, 0.0
        self._stall_retry_at = 0.0
        self._seen_alive = set()
        self._task = asyncio.create_task(self._run(epoch, trainer_pid))

    async def stop(self) -> None:
        """Stops following; a stack collection under way finishes first (it is bounded)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._collecting is not None:
            with contextlib.suppress(Exception):
                await self._collecting
            self._collecting = None
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None

    async def _run(self, epoch: int, trainer_pid: int | None) -> None:
        while True:
            self.tick(epoch, trainer_pid)
            await asyncio.sleep(self.until_next_poll())

    @property
    def _poll(self) -> float:
        return self.config.progress_poll_seconds or 1.0

    def until_next_poll(self) -> float:
        """The next poll: a poll period on, or sooner when a stall falls due before it, so
        that a hang is told at `hangSeconds` after the trainer's last step, not up to a poll
        later."""
        t = self.tracker
        if t.hang_seconds is None or t.changed_at is None or t.stalled_since is not None:
            return self._poll
        due_in = t.changed_at + t.hang_seconds - self._clock()
        return self._poll if due_in <= 0 else min(self._poll, due_in)

    def tick(self, epoch: int, trainer_pid: int | None) -> None:
        """One poll: read the files, tell a stall (once), send a summary when due."""
        now = self._clock()
        reading = self.files.poll()
        # When the step was written, by the file's time: within the last poll (the clocks of
        # the file and of this agent may differ by a little; never more than a poll counts,
        # and what the read itself took, under `SEEN_AT_ONCE`, not at all).
        written = self.files.written_at
        ago = 0.0 if written is None else min(max(0.0, time.time() - written), self._poll)
        ago = round(ago, 2) if ago >= SEEN_AT_ONCE else 0.0
        self.tracker.observe(now, reading, self.files.malformed, ago)
        # Whether the trainer runs costs reads: asked only when it decides.
        running = not self.tracker.due(now) or self._running(trainer_pid)
        stalled = self.tracker.check(now, running)
        if stalled:
            self.stalls += 1
            assert self.tracker.reading is not None
            assert self.tracker.changed_at is not None
            self.log.warning(
                "trainer stalled at step %d: no progress for %.0fs (hangSeconds %g)",
                self.tracker.reading.step,
                now - self.tracker.changed_at,
                self.tracker.hang_seconds,
            )
            self._collecting = asyncio.create_task(self._collect(trainer_pid))
        # A stall, or its end, and a new checkpoint are sent at once (a failure's lost work is
        # counted from the checkpoint, and checkpoints are rare); the rest at most every summary
        # period, and after a failed send not before the next (the endpoint down: progress
        # pauses).
        stall_news = (self.tracker.stalled_since is not None) != (
            self._sent is not None and self._sent.stalled
        )
        reading = self.tracker.reading
        checkpoint_news = (
            reading is not None
            and reading.checkpoint is not None
            and (self._sent is None or self._sent.checkpoint != reading.checkpoint)
        )
        news = stall_news or checkpoint_news
        since = now - self._sent_at
        due = since >= self.config.progress_summary_seconds
        # A stall is held back only by a stall's own failed send, not by a summary's before
        # it (the endpoint away a moment, during a failover): a hang is told on time.
        if self._sending is not None or now < (
            self._stall_retry_at if stall_news else self._retry_at
        ):
            return
        # A shift of the compute goes early too (a worker slowing down is found a forSeconds
        # after it began, not a period later), at most every SHIFT_MIN_SECONDS.
        if not (due or news) and since >= min(
            SHIFT_MIN_SECONDS, self.config.progress_summary_seconds
        ):
            news = self.tracker.shifted()
        if not (due or news):
            return
        summary = self.tracker.summary(now)
        if summary is None or summary.same(self._sent):
            return
        procs = self._trainer_procs(trainer_pid)
        if procs:
            summary = dataclasses.replace(
                summary,
                trainer_state=min((p.state for p in procs), key=_telling),
                trainer_cpu_seconds=round(sum(p.cpu_seconds for p in procs), 2),
            )
        self._sent_at = now
        self._sending = asyncio.create_task(self._deliver(epoch, summary, now))

    async def _deliver(self, epoch: int, summary: Summary, made_at: float) -> bool:
        try:
            ok = True if self._send is None else await self._send(epoch, summary)
            if ok:
                self.summaries += 1
                self._sent = summary
                self.tracker.sent(made_at, summary)
            else:
                self._retry_at = self._clock() + self.config.progress_summary_seconds
                if summary.stalled != (self._sent is not None and self._sent.stalled):
                    self._stall_retry_at = self._retry_at  # the stall's own failure
            return ok
        finally:
            self._sending = None

    def _trainer_procs(self, trainer_pid: int | None) -> list[ProcState]:
        """The trainer's processes this agent sees: the one it started, and those that
        registered the stack dump."""
        pids = {r.pid for r in registered(self.directory) if alive(r)}
        if trainer_pid is not None:
            pids.add(trainer_pid)
        return [s for s in map(proc_state, sorted(pids)) if s is not None]

    def _running(self, trainer_pid: int | None) -> bool:
        """Whether the trainer runs, as far as the agent can tell: in `Process` mode it follows
        only a running trainer; a sidecar sees the trainer's processes only in a shared pid
        namespace, and otherwise takes it for running (the controller knows its container)."""
        if trainer_pid is not None:
            return True
        regs = registered(self.directory)
        live = {r.pid for r in regs if alive(r)}
        self._seen_alive |= live
        return bool(live) or not self._seen_alive

    async def _collect(self, trainer_pid: int | None) -> None:
        text = await collect_stacks(self.directory, trainer_pid)
        path = self.config.dir / STACKS_FILE
        try:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as e:
            self.log.error("cannot write %s: %s", path, e)
        tail = text if len(text) <= STACKS_LOG_BYTES else text[:STACKS_LOG_BYTES] + "...\n"
        self.log.warning("stacks of the stalled trainer (all in %s):\n%s", path, tail)
