"""The agent's reading of its trainer's progress (docs/progress.md): the line format, the progress
files read cheaply when they change, and one epoch's progress followed on the monotonic clock to
tell a stall. Pure but for the file reads; the loop that drives it is agent/monitor.py.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from api.constants import COMPUTE_SHIFT_RATIO

TAIL_BYTES = 4096
"""At most this much of a progress file is read per poll (its end): a trainer that appends
fast never makes a poll cost more."""
MAX_DIGITS = 18
"""A step or checkpoint longer than this is malformed (it would not fit the status' int64)."""


@dataclass(frozen=True)
class Line:
    """One progress line: `step=<int>` with optional ` compute=<seconds>` and
    ` checkpoint=<int>`."""

    step: int
    compute: float | None = None
    checkpoint: int | None = None


def parse_line(text: str) -> Line | None:
    """The line's progress, or None if it is malformed: `key=value` fields separated by blanks,
    `step` required, no field twice, `step` and `checkpoint` non-negative decimal integers,
    `compute` non-negative finite seconds. Other keys are ignored (later versions may add some)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or not key or key in fields:
            return None
        fields[key] = value
    step = _count(fields.get("step"))
    if step is None:
        return None
    compute: float | None = None
    if "compute" in fields:
        try:
            compute = float(fields["compute"])
        except ValueError:
            return None
        if not math.isfinite(compute) or compute < 0:
            return None
    checkpoint: int | None = None
    if "checkpoint" in fields:
        checkpoint = _count(fields["checkpoint"])
        if checkpoint is None:
            return None
    return Line(step, compute, checkpoint)


def _count(value: str | None) -> int | None:
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > MAX_DIGITS:
        return None
    return int(value)


KEEP_BYTES = 64
"""The end of what was read last, compared at the next read to tell an append from a rewrite."""


class ProgressFile:
    """One progress file, read only when `stat` says it changed, and then only what is new.

    Both ways of writing it work: appended to (`>>`: the lines after those read before are new)
    or replaced whole (`echo ... > file`, or the helper's rename: every line in it is new; told
    from an append by a new inode, a smaller size, or the bytes read last no longer where they
    were). A line is complete with its newline; a last line without one is taken once the file
    has not changed for a whole poll (the writer is done with it). Each new line is read once,
    at most the last `TAIL_BYTES` of them per poll: a malformed one is counted, the last good
    one is the newest progress."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.latest: Line | None = None
        self.malformed = 0
        """Malformed lines read."""
        self._stat: tuple[int, int, int] | None = None
        self._ino = -1
        self._end = 0
        """Offset past the last byte read as part of a line."""
        self._kept = b""
        """The bytes just before `_end`, as read."""
        self._unterminated = False
        self.written_at: float | None = None
        """When the newest good line was written, by the file's mtime (wall clock)."""

    def poll(self) -> Line | None:
        """The newest good line written since the last poll, if any; None otherwise."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        stat = (st.st_ino, st.st_size, st.st_mtime_ns)
        stable, self._stat = stat == self._stat, stat
        if stable and not self._unterminated:
            return None
        try:
            data, start = self._new_bytes(st.st_ino, st.st_size)
        except OSError:
            return None
        complete = data[: data.rfind(b"\n") + 1]
        rest = data[len(complete) :]
        lines = complete.split(b"\n")[:-1]
        used = len(complete)
        if rest.strip() and stable:
            lines.append(rest)
            used = len(data)
        self._unterminated = bool(rest.strip()) and not stable
        self._ino, self._end = st.st_ino, start + used
        self._kept = data[max(0, used - KEEP_BYTES) : used]
        newest: Line | None = None
        for raw in lines:
            if not raw.strip():
                continue
            line = parse_line(raw.decode("utf-8", "replace"))
            if line is None:
                self.malformed += 1
            else:
                newest = line
        if newest is not None:
            self.latest, self.written_at = newest, st.st_mtime
        return newest

    def _new_bytes(self, ino: int, size: int) -> tuple[bytes, int]:
        """What the file holds past what was read before (all of it if it was rewritten), at
        most `TAIL_BYTES` of its end, from the start of a line; and its offset."""
        with open(self.path, "rb") as f:
            kept = len(self._kept)
            if ino == self._ino and size >= self._end and (kept or not self._end):
                start = max(self._end - kept, size - TAIL_BYTES - kept)
                f.seek(start)
                data = f.read(size - start)
                if start == self._end - kept and data[:kept] == self._kept:
                    return data[kept:], self._end
            start = max(0, size - TAIL_BYTES)
            f.seek(start)
            data = f.read(size - start)
        if start > 0:  # the first line is cut: from the next
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        return data, start


@dataclass(frozen=True)
class Reading:
    """The worker's progress over all of its trainer's progress files: the lowest step and
    checkpoint (a worker is as far as its slowest local process), the highest compute."""

    step: int
    checkpoint: int | None = None
    compute: float | None = None


class ProgressFiles:
    """The trainer's progress files: `<name>` and, one per torchrun local process,
    `<name>.<LOCAL_RANK>`, in one directory, listed at every poll."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._files: dict[str, ProgressFile] = {}

    @property
    def malformed(self) -> int:
        return sum(f.malformed for f in self._files.values())

    @property
    def written_at(self) -> float | None:
        """When a file last had a good line written (wall clock; None before any)."""
        return max((f.written_at for f in self._files.values() if f.written_at), default=None)

    def poll(self) -> Reading | None:
        """Reads what changed; the worker's progress, None before any file had a good line."""
        try:
            names = [e.name for e in os.scandir(self.directory) if self._ours(e.name)]
        except OSError:
            names = []
        for name in names:
            if name not in self._files:
                self._files[name] = ProgressFile(self.directory / name)
        for f in self._files.values():
            f.poll()
        lines = [f.latest for f in self._files.values() if f.latest is not None]
        if not lines:
            return None
        checkpoints = [line.checkpoint for line in lines if line.checkpoint is not None]
        computes = [line.compute for line in lines if line.compute is not None]
        return Reading(
            step=min(line.step for line in lines),
            checkpoint=min(checkpoints) if len(checkpoints) == len(lines) else None,
            compute=max(computes) if computes else None,
        )

    def _ours(self, name: str) -> bool:
        if name == self.name:
            return True
        prefix, dot, rank = name.rpartition(".")
        return bool(dot) and prefix == self.name and rank.isascii() and rank.isdigit()


COMPUTE_SAMPLES_KEPT = 1024
"""At most this many compute samples make one summary's window (the latest): a poll takes one
at most, so a window of a summary period of up to 17 minutes keeps them all."""
SHIFT_SAMPLES = 5
"""A shift of the compute is judged on the median of this many latest samples: one slow step
(a checkpoint, a data-loader hiccup) is no shift."""
SHIFT_RATIO = COMPUTE_SHIFT_RATIO
"""The compute shifted when that median is this many times the median last sent, or a
1/this of it: a worker slowing down (or recovering) says so at once, not a period later."""
SHIFT_MIN_SECONDS = 10.0
"""A shift is sent no sooner than this after the previous summary: a compute that swings back
and forth costs the controller at most one summary per this many seconds from the worker."""


@dataclass(frozen=True)
class ComputeWindow:
    """The trainer's compute over one summary's window (docs/progress.md): the median of the
    samples the agent took, one per poll at which the step had changed (the compute of the
    step reached), since its previous summary, or since the compute shifted."""

    median: float
    samples: int
    seconds: float
    """How long before the summary the window's first sample was taken."""


@dataclass(frozen=True)
class Summary:
    """One epoch's progress as the agent sends it: the worker's `Reading`, the steps per second
    since the previous summary, how long the step has not changed, whether that is a stall,
    and how many malformed lines were read; and, where the agent sees the trainer's processes,
    their state (`trainer_state`, /proc's letter: the most telling of them, `T` stopped
    first, then `D`, `R`, `S`) and their CPU seconds together: a rank that waits for a hung
    peer is alive, one that is hung may be stopped or stuck in the kernel."""

    step: int
    checkpoint: int | None
    compute: float | None
    steps_per_second: float | None
    idle_seconds: float
    stalled: bool
    malformed: int
    trainer_state: str | None = None
    trainer_cpu_seconds: float | None = None
    compute_window: ComputeWindow | None = None
    """The compute's median over the window since the previous summary (None: no sample)."""

    def same(self, other: Summary | None) -> bool:
        """Says nothing new beside `other` (the time-dependent figures aside)."""
        return other is not None and (
            self.step,
            self.checkpoint,
            self.compute,
            self.stalled,
            self.malformed,
            self.compute_window is None,
        ) == (
            other.step,
            other.checkpoint,
            other.compute,
            other.stalled,
            other.malformed,
            other.compute_window is None,
        )


class Tracker:
    """One epoch's progress of one worker, from the barrier on (the agent makes a new one per
    epoch), on the monotonic clock.

    A stall: `hang_seconds` (None: never) passed since the step last changed, while the trainer
    runs, after its first report of the epoch. A trainer that never reported is never stalled.
    A step that goes back (a trainer resuming from its checkpoint) is a change too.

    The compute: at each poll at which the step changed, the compute of the step reached is a
    sample; a summary carries the median of the samples since the previous one (its window),
    so that one slow step is not what the controller judges a worker by (docs/progress.md)."""

    def __init__(self, hang_seconds: float | None) -> None:
        self.hang_seconds = hang_seconds if hang_seconds else None
        self.reading: Reading | None = None
        self.malformed = 0
        self.changed_at: float | None = None
        """When the step last changed (or was first reported)."""
        self.stalled_since: float | None = None
        """The last change of the step, while the worker is stalled."""
        self._window: tuple[float, int] | None = None
        self._rate: float | None = None
        self._computes: list[tuple[float, float]] = []
        """(when, compute) samples of the window not yet sent."""
        self._sent_median: float | None = None

    def observe(
        self, now: float, reading: Reading | None, malformed: int = 0, ago: float = 0.0
    ) -> None:
        """The poll at `now` read `reading`, written `ago` seconds before (the poll sees a
        change up to a poll late; a stall counts from the write)."""
        self.malformed = malformed
        if reading is None:
            return
        if self.reading is None or reading.step != self.reading.step:
            self.changed_at = now - ago
            self.stalled_since = None
            if self._window is None:
                self._window = (now, reading.step)
            if reading.compute is not None:
                self._computes.append((now, reading.compute))
                if len(self._computes) > COMPUTE_SAMPLES_KEPT:
                    del self._computes[0]
        self.reading = reading

    def compute_window(self, now: float) -> ComputeWindow | None:
        """The window's compute so far; None without a sample."""
        if not self._computes:
            return None
        return ComputeWindow(
            median=round(statistics.median(c for _, c in self._computes), 6),
            samples=len(self._computes),
            seconds=round(max(0.0, now - self._computes[0][0]), 3),
        )

    @property
    def sent_compute(self) -> float | None:
        """The compute median of the last summary sent (None before one with a window)."""
        return self._sent_median

    def shifted(self) -> bool:
        """Whether the compute moved past `SHIFT_RATIO` of the median last sent, by the median
        of the latest `SHIFT_SAMPLES` samples. If so, the window starts again where the shift
        began: at the longest run of latest samples whose median is past that ratio, from the
        first of them past it. What came before says nothing of the worker now, and the
        window's start is when the shift began, though it may be told a while later (not
        sooner than `SHIFT_MIN_SECONDS` after the previous summary)."""
        sent = self._sent_median
        if sent is None or len(self._computes) < SHIFT_SAMPLES:
            return False
        samples = [c for _, c in self._computes]
        median = statistics.median(samples[-SHIFT_SAMPLES:])
        low, high = sorted((sent, median))
        if high < SHIFT_RATIO * low or high <= 0:
            return False
        slower = median > sent

        def past(c: float) -> bool:
            return c >= SHIFT_RATIO * sent if slower else c * SHIFT_RATIO <= sent

        start = next(
            (
                i
                for i in range(len(samples))
                if past(samples[i]) and past(statistics.median(samples[i:]))
            ),
            len(samples) - SHIFT_SAMPLES,
        )
        del self._computes[:start]
        return True

    def due(self, now: float) -> bool:
        """Whether a stall begins now if the trainer runs."""
        return (
            self.stalled_since is None
            and self.hang_seconds is not None
            and self.changed_at is not None
            and now - self.changed_at >= self.hang_seconds
        )

    def check(self, now: float, running: bool) -> bool:
        """True once when a stall begins (again only after the step changed)."""
        if not running or not self.due(now):
            return False
        self.stalled_since = self.changed_at
        return True

    def summary(self, now: float) -> Summary | None:
        """The progress so far (None before the first report); the rate is the trainer's while
        it stepped: from the last summary `sent` (or the first report) to the step's last
        change, or the last such rate if it has not stepped since. A stall's summary thus
        carries the rate before it, which the controller prices the steps it lost at."""
        reading, changed_at = self.reading, self.changed_at
        if reading is None or changed_at is None:
            return None
        rate = self._rate
        if self._window is not None and changed_at > self._window[0]:
            stepped = reading.step - self._window[1]
            if stepped > 0:
                rate = self._rate = stepped / (changed_at - self._window[0])
        return Summary(
            step=reading.step,
            checkpoint=reading.checkpoint,
            compute=reading.compute,
            steps_per_second=rate,
            idle_seconds=max(0.0, now - changed_at),
            stalled=self.stalled_since is not None,
            malformed=self.malformed,
            compute_window=self.compute_window(now),
        )

    def sent(self, at: float, summary: Summary) -> None:
        """`summary`, made at `at`, reached the controller: the next rate starts there, and the
        next compute window after its samples."""
        self._window = (at, summary.step)
        if summary.compute_window is not None:
            self._sent_median = summary.compute_window.median
            self._computes = [(t, c) for t, c in self._computes if t > at]
