"""The agent's reading of progress (agent/progress.py): the line format, the files written either
way, torchrun's files per local process, and the stall rule on a fake clock."""

from __future__ import annotations

import os
import pathlib

import pytest

from agent.progress import Line, ProgressFile, ProgressFiles, Reading, Tracker, parse_line


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("step=12", Line(12)),
        ("step=12\n", Line(12)),
        ("  step=3   compute=0.25  checkpoint=2 ", Line(3, 0.25, 2)),
        ("checkpoint=0 step=0", Line(0, None, 0)),
        ("step=7 compute=1e-3", Line(7, 0.001)),
        ("step=7 loss=0.31", Line(7)),  # keys of later versions are ignored
    ],
)
def test_a_good_line(text: str, line: Line) -> None:
    assert parse_line(text) == line


@pytest.mark.parametrize(
    "text",
    [
        "",
        "12",
        "step=",
        "step=-1",
        "step=1.5",
        "step=0x10",
        "step=١٢",  # digits, but not ASCII ones
        "step=1 step=2",
        "compute=1",
        "step=1 compute=nan",
        "step=1 compute=inf",
        "step=1 compute=-2",
        "step=1 compute=fast",
        "step=1 checkpoint=x",
        "step=1 =3",
        "step=1 checkpoint",
        "step=" + "9" * 19,
    ],
)
def test_a_malformed_line(text: str) -> None:
    assert parse_line(text) is None


def write(path: pathlib.Path, text: str, mode: str = "w") -> None:
    with open(path, mode) as f:
        f.write(text)
    # Two writes within the filesystem's timestamp granularity can leave mtime and size alone:
    # the test moves mtime itself, as time would.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_file_overwritten_at_each_step(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    assert f.poll() is None  # no file yet
    write(f.path, "step=9\n")
    assert f.poll() == Line(9)
    assert f.poll() is None  # unchanged: one stat, nothing read
    write(f.path, "step=10 checkpoint=8\n")  # longer than before
    assert f.poll() == Line(10, None, 8)
    assert f.latest == Line(10, None, 8)
    assert f.malformed == 0


def test_a_file_appended_to(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    write(f.path, "step=1\nstep=2\n")
    assert f.poll() == Line(2)
    write(f.path, "step=3\nstep=4\n\n", "a")  # only the newest counts; blank lines are skipped
    assert f.poll() == Line(4)


def test_a_line_without_its_newline_is_taken_once_the_file_rests(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    write(f.path, "step=1\nstep=2")  # the writer may still be writing "step=2..."
    assert f.poll() == Line(1)  # the last line that is whole for sure
    assert f.poll() == Line(2)  # unchanged for a whole poll: complete
    write(f.path, "\n", "a")
    assert f.poll() is None  # the same line, now ended: not new


def test_malformed_lines_are_counted_once_each_and_ignored(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    write(f.path, "step=5\n")
    assert f.poll() == Line(5)
    write(f.path, "step=five\n")
    assert f.poll() is None
    assert f.poll() is None  # the same bad line read again is not counted again
    write(f.path, "epoch done\n", "a")
    assert f.poll() is None
    assert (f.malformed, f.latest) == (2, Line(5))  # the last good line stands
    write(f.path, "step=6\n", "a")
    assert f.poll() == Line(6)


def test_every_line_written_between_two_polls_is_read_once(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    write(f.path, "step=1\nstep=2\nbad\n")
    assert f.poll() == Line(2)  # the last good line, and the bad one after it counted
    write(f.path, "worse\n", "a")
    assert f.poll() is None
    assert (f.latest, f.malformed) == (Line(2), 2)
    write(f.path, "step=9\n")  # rewritten, shorter: all of it is new
    assert f.poll() == Line(9)
    write(f.path, "bad\nstep=10\n")  # rewritten, longer, same inode
    assert f.poll() == Line(10)
    assert f.malformed == 3


def test_a_long_file_is_read_by_its_tail(tmp_path: pathlib.Path) -> None:
    f = ProgressFile(tmp_path / "steps")
    write(f.path, "".join(f"step={i}\n" for i in range(100_000)))
    assert f.poll() == Line(99_999)
    write(f.path, "".join(f"step={i}\n" for i in range(100_000, 200_000)), "a")
    assert f.poll() == Line(199_999)
    assert f.malformed == 0  # a line cut by the tail's start is skipped, not counted


def test_torchrun_local_processes_report_in_files_of_their_own(tmp_path: pathlib.Path) -> None:
    files = ProgressFiles(tmp_path, "steps")
    assert files.poll() is None
    write(tmp_path / "steps.0", "step=10 compute=0.5 checkpoint=8\n")
    write(tmp_path / "steps.1", "step=9 compute=0.7 checkpoint=8\n")
    write(tmp_path / "steps.x", "step=1\n")  # not a local rank: not ours
    write(tmp_path / "stacks.123", "pid=123 start=1\n")
    assert files.poll() == Reading(step=9, checkpoint=8, compute=0.7)
    write(tmp_path / "steps.1", "step=11 compute=0.2\n")  # no checkpoint: none known for all
    assert files.poll() == Reading(step=10, checkpoint=None, compute=0.5)
    write(tmp_path / "steps.0", "garbage\n")
    assert files.poll() == Reading(step=10, checkpoint=None, compute=0.5)
    assert files.malformed == 1


HANG = 30.0


def stalled_at(tracker: Tracker, times: list[float], running: bool = True) -> list[float]:
    """The times of `times` at which `check` says a stall begins."""
    return [t for t in times if tracker.check(t, running)]


def test_a_worker_that_stops_reporting_stalls_once() -> None:
    tracker = Tracker(HANG)
    tracker.observe(100.0, Reading(1))
    tracker.observe(101.0, Reading(2))
    tracker.observe(102.0, Reading(2))  # reported again, no advance
    assert stalled_at(tracker, [110.0, 130.9, 131.0, 133.0, 500.0]) == [131.0]
    assert tracker.stalled_since == 101.0
    summary = tracker.summary(140.0)
    assert summary is not None
    assert (summary.step, summary.stalled, summary.idle_seconds) == (2, True, 39.0)


def test_a_stall_counts_from_when_the_step_was_written_not_when_it_was_seen() -> None:
    tracker = Tracker(HANG)
    tracker.observe(100.0, Reading(1))
    tracker.observe(101.0, Reading(2), ago=0.75)  # written at 100.25, seen at the next poll
    assert tracker.changed_at == 100.25
    assert stalled_at(tracker, [130.0, 130.25]) == [130.25]


def test_a_stalled_worker_that_resumes_can_stall_again() -> None:
    tracker = Tracker(HANG)
    tracker.observe(0.0, Reading(1))
    assert stalled_at(tracker, [30.0]) == [30.0]
    tracker.observe(45.0, Reading(2))
    assert tracker.stalled_since is None
    assert stalled_at(tracker, [60.0, 75.0, 76.0]) == [75.0]


def test_a_step_that_goes_back_is_progress() -> None:
    tracker = Tracker(HANG)
    tracker.observe(0.0, Reading(50))
    tracker.observe(20.0, Reading(40))  # resumed from its checkpoint
    assert stalled_at(tracker, [30.0, 49.0, 50.0]) == [50.0]


def test_a_trainer_that_never_reported_never_stalls() -> None:
    tracker = Tracker(HANG)
    tracker.observe(0.0, None, malformed=3)
    assert stalled_at(tracker, [0.0, 1000.0, 1e6]) == []
    assert tracker.summary(1e6) is None


def test_no_stall_while_the_trainer_does_not_run_or_without_hang_seconds() -> None:
    tracker = Tracker(HANG)
    tracker.observe(0.0, Reading(1))
    assert stalled_at(tracker, [100.0], running=False) == []
    assert stalled_at(tracker, [101.0]) == [101.0]
    for off in (None, 0.0):
        quiet = Tracker(off)
        quiet.observe(0.0, Reading(1))
        assert stalled_at(quiet, [1e9]) == []


def test_the_rate_is_the_trainers_while_it_stepped_since_the_last_summary_sent() -> None:
    tracker = Tracker(HANG)
    tracker.observe(10.0, Reading(100))
    first = tracker.summary(10.0)
    assert first is not None
    assert first.steps_per_second is None  # nothing to compare with yet
    tracker.observe(20.0, Reading(150))
    summary = tracker.summary(20.0)
    assert summary is not None
    assert summary.steps_per_second == 5.0
    tracker.sent(20.0, summary)
    tracker.observe(30.0, Reading(170))
    summary = tracker.summary(40.0)
    assert summary is not None
    # 20 steps from the summary to the step's last change: the 10 s since, idle, are not the
    # rate at which it trains (a stall's summary prices the lost steps at it).
    assert summary.steps_per_second == 2.0
    assert summary.same(tracker.summary(50.0))  # only the time-dependent figures moved
    tracker.sent(40.0, summary)
    stalled = tracker.summary(80.0)
    assert stalled is not None
    assert stalled.steps_per_second == 2.0  # no step since: the rate before it


def _stepped(tracker: Tracker, start: int, computes: list[float], t0: float) -> float:
    """One poll a second, each at a new step with its compute; the time after the last."""
    for i, compute in enumerate(computes):
        tracker.observe(t0 + i, Reading(start + i, compute=compute))
    return t0 + len(computes)


def test_a_summary_carries_the_median_compute_of_its_window() -> None:
    tracker = Tracker(HANG)
    # A checkpoint step and a data-loader hiccup among 28 ordinary steps move no median.
    computes = [0.5] * 10 + [9.0] + [0.5] * 10 + [3.0] + [0.52] * 8
    now = _stepped(tracker, 1, computes, 0.0)
    summary = tracker.summary(now)
    assert summary is not None
    assert summary.compute_window is not None
    assert summary.compute == 0.52  # the latest step's, as before
    assert summary.compute_window.median == 0.5
    assert summary.compute_window.samples == len(computes)
    assert summary.compute_window.seconds == len(computes)  # since its first sample
    tracker.sent(now, summary)
    assert tracker.compute_window(now) is None  # the next window starts empty
    tracker.observe(now + 1, Reading(100))  # a step without compute is no sample
    assert tracker.compute_window(now + 1) is None


def test_a_step_seen_again_is_no_new_sample() -> None:
    tracker = Tracker(HANG)
    for t in range(5):
        tracker.observe(float(t), Reading(1, compute=0.5))
    window = tracker.compute_window(5.0)
    assert window is not None
    assert window.samples == 1


def test_a_shift_of_the_compute_is_news_and_restarts_the_window() -> None:
    tracker = Tracker(HANG)
    now = _stepped(tracker, 1, [1.0] * 20, 0.0)
    first = tracker.summary(now)
    assert first is not None
    tracker.sent(now, first)
    # Ten more ordinary steps, then the device slows down to twice the compute.
    now = _stepped(tracker, 21, [1.0] * 10, now)
    assert not tracker.shifted()
    now = _stepped(tracker, 31, [2.0] * 2, now)
    assert not tracker.shifted()  # 2 slow samples of the latest 5: not yet ...
    now = _stepped(tracker, 33, [2.0], now)
    assert tracker.shifted()  # ... 3 of 5 make their median slow
    summary = tracker.summary(now)
    assert summary is not None
    assert summary.compute_window is not None
    # The window starts at the shift: the slow samples, not the fast ones before them.
    assert summary.compute_window.median == 2.0
    assert summary.compute_window.samples == 3
    tracker.sent(now, summary)
    now = _stepped(tracker, 34, [2.1, 1.9, 2.0, 2.2, 2.0, 1.8], now)
    assert not tracker.shifted()  # jitter around the new median is no shift


def test_one_slow_step_or_jitter_is_no_shift() -> None:
    tracker = Tracker(HANG)
    now = _stepped(tracker, 1, [1.0] * 10, 0.0)
    first = tracker.summary(now)
    assert first is not None
    tracker.sent(now, first)
    now = _stepped(tracker, 11, [1.1, 0.9, 8.0, 1.05, 0.95, 1.1, 1.2, 0.9], now)
    assert not tracker.shifted()
    # Recovering is a shift too: back to the healthy compute, said at once.
    slow = Tracker(HANG)
    now = _stepped(slow, 1, [2.0] * 10, 0.0)
    summary = slow.summary(now)
    assert summary is not None
    slow.sent(now, summary)
    _stepped(slow, 11, [1.0] * 5, now)
    assert slow.shifted()


def test_no_shift_before_a_median_was_sent() -> None:
    tracker = Tracker(HANG)
    _stepped(tracker, 1, [1.0] * 10 + [3.0] * 10, 0.0)
    assert not tracker.shifted()


def test_a_shift_told_late_starts_its_window_where_it_began() -> None:
    # The agent may tell a shift only SHIFT_MIN_SECONDS after its previous summary: the window
    # still starts at the slowdown, not at the samples that made it news.
    tracker = Tracker(HANG)
    now = _stepped(tracker, 1, [1.0] * 10, 0.0)
    first = tracker.summary(now)
    assert first is not None
    tracker.sent(now, first)
    now = _stepped(tracker, 11, [1.0, 1.1, 2.0, 2.1, 0.9, 2.0, 1.9, 2.2, 2.0, 2.1], now)
    assert tracker.shifted()
    window = tracker.compute_window(now)
    assert window is not None
    # From the first slow sample on (one healthy-looking step among them moves no median).
    assert (window.samples, window.median) == (8, 2.0)
