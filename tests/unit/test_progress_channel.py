"""Progress from the agent to the controller's book, without a cluster: the monitor's batching and
its one message per stall on a fake clock, the summary's parsing and the book's keeping of it,
and a real `Process`-mode agent whose shell trainer reports to the real endpoint in-process."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import random
import signal
import subprocess
from typing import Any

import pytest

from agent.agent import Agent, Step
from agent.apiclient import ApiError, HttpClient
from agent.config import Config, ConfigError
from agent.direct import progress_body
from agent.monitor import ProgressMonitor, proc_state
from agent.progress import ComputeWindow, Reading, Summary
from api.constants import (
    PROGRESS_FILE,
    PROGRESS_PATH,
    RESTART_EXIT_CODE,
    STACKS_FILE,
    AgentPlacement,
)
from controller.arrivals.book import ArrivalBook, ProgressReport
from controller.arrivals.server import BadReport, parse_progress
from tests.unit.test_agent import DEADLINE, NS, FakeApi, make_config, polled, running, until
from tests.unit.test_arrivals import Controller, controller

__all__ = ["controller"]  # the endpoint fixture, shared

# -- the monitor, on a fake clock ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sent:
    """The controller's side of the channel: what reached it, or refused while `down`."""

    def __init__(self) -> None:
        self.summaries: list[Summary] = []
        self.attempts = 0
        self.down = False

    async def __call__(self, epoch: int, summary: Summary) -> bool:
        self.attempts += 1
        if self.down:
            return False
        self.summaries.append(summary)
        return True


class Run:
    """A monitor at epoch 0 with a trainer that writes `steps` as the test says."""

    def __init__(self, tmp_path: pathlib.Path, **config: Any) -> None:
        settings = {"hang_seconds": 30.0, "progress_summary_seconds": 15.0, **config}
        self.config = make_config(tmp_path, progress_poll_seconds=1.0, **settings)
        self.clock = Clock()
        self.sent = Sent()
        log = logging.LoggerAdapter(logging.getLogger("test"))
        self.monitor = ProgressMonitor(self.config, log, self.sent, clock=self.clock)
        self.monitor.prepare()
        self.file = self.config.dir / PROGRESS_FILE

    def report(self, step: int) -> None:
        self.file.write_text(f"step={step}\n")

    async def ticks(self, seconds: int, step: int | None = None, pid: int | None = None) -> None:
        """One poll a second for `seconds`; the trainer advances a step at each, from `step`.
        `pid`: the trainer the agent started (`Process` mode)."""
        for i in range(seconds):
            if step is not None:
                self.report(step + i)
            self.monitor.tick(0, pid)
            for _ in range(3):  # the send the tick started
                await asyncio.sleep(0)
            self.clock.now += 1.0


@pytest.fixture(params=[0.0, 0.5, 1.0], ids=["jitter-none", "jitter-half", "jitter-all"])
def jitter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where in its first period the monitor's summaries start (random in an agent)."""
    monkeypatch.setattr(random, "uniform", lambda a, b: a + (b - a) * request.param)


async def test_summaries_are_batched_and_a_stall_is_one_message(
    tmp_path: pathlib.Path, jitter: None
) -> None:
    run = Run(tmp_path)
    await run.ticks(60, step=1)  # a step a second for a minute
    assert 3 <= len(run.sent.summaries) <= 4  # every 15 s, not one per step
    assert not any(s.stalled for s in run.sent.summaries)
    last = run.sent.summaries[-1]
    assert last.steps_per_second == 1.0

    await run.ticks(120)  # the trainer hangs at step 60
    stalls = [s for s in run.sent.summaries if s.stalled]
    assert len(stalls) == 1  # at once, and nothing after it while the stall lasts
    assert (stalls[0].step, stalls[0].idle_seconds) == (60, 30.0)
    assert run.sent.summaries[-1] is stalls[0]
    assert run.monitor.stalls == 1

    run.report(61)  # it resumes: said at once
    await run.ticks(1)
    assert not run.sent.summaries[-1].stalled
    await run.monitor.stop()  # the stall's stack collection finished
    assert "no trainer process to ask for stacks" in (run.config.dir / STACKS_FILE).read_text()


async def test_the_poll_after_a_step_comes_when_its_stall_would_fall_due(
    tmp_path: pathlib.Path,
) -> None:
    run = Run(tmp_path)  # polls every second, hangSeconds 30
    t0 = run.clock.now
    await run.ticks(3, step=1)  # steps 1-3, the last read at t0 + 2
    tracker = run.monitor.tracker
    assert tracker.changed_at == t0 + 2  # seen as written: the read came at once
    assert run.monitor.until_next_poll() == 1.0  # a poll period
    run.clock.now = t0 + 31.5
    assert run.monitor.until_next_poll() == 0.5  # the stall's due time, t0 + 32
    run.clock.now = t0 + 32
    run.monitor.tick(0, None)
    assert run.monitor.stalls == 1
    assert run.monitor.until_next_poll() == 1.0  # stalled: a poll period again


async def test_a_new_checkpoint_is_sent_at_once(tmp_path: pathlib.Path, jitter: None) -> None:
    # A failure's lost work counts from the checkpoint: the controller must know the latest one,
    # and checkpoints are rare, so each costs one message.
    run = Run(tmp_path)
    for step in range(1, 41):
        run.file.write_text(f"step={step} checkpoint={step // 10 * 10}\n")
        await run.ticks(1)
    checkpoints = [s.checkpoint for s in run.sent.summaries]
    for checkpoint in (10, 20, 30, 40):
        sent = next(s for s in run.sent.summaries if s.checkpoint == checkpoint)
        assert sent.step == checkpoint  # the tick that read it sent it
    assert len(run.sent.summaries) <= len(set(checkpoints)) + 3  # and little else


async def test_a_summary_says_what_the_agent_sees_of_the_trainers_processes(
    tmp_path: pathlib.Path,
) -> None:
    run = Run(tmp_path, progress_summary_seconds=1.0)
    await run.ticks(2, step=1)
    assert run.sent.summaries[-1].trainer_state is None  # a sidecar that sees nothing
    trainer = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220 - returns at once
    try:
        os.kill(trainer.pid, signal.SIGSTOP)  # as a wedged device or a debugger leaves it
        # The signal takes hold when the child next runs: on a loaded machine, a moment later.
        for _ in range(100):
            seen = proc_state(trainer.pid)
            if seen is not None and seen.state == "T":
                break
            await asyncio.sleep(0.05)
        await run.ticks(2, step=3, pid=trainer.pid)
        last = run.sent.summaries[-1]
        assert (last.step, last.trainer_state) == (4, "T")
        assert last.trainer_cpu_seconds is not None
    finally:
        trainer.kill()
        trainer.wait()


async def test_a_trainer_that_never_reports_costs_no_message(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path)
    run.file.write_text("not a step\n")
    await run.ticks(200)
    assert (run.sent.attempts, run.monitor.stalls) == (0, 0)
    assert run.monitor.files.malformed == 1


async def test_with_the_endpoint_down_progress_pauses(tmp_path: pathlib.Path, jitter: None) -> None:
    run = Run(tmp_path)
    run.sent.down = True
    await run.ticks(45, step=1)
    assert run.sent.attempts <= 4  # a failed send is tried again a period later, not each poll
    run.sent.down = False
    await run.ticks(20, step=46)
    assert run.sent.summaries[-1].step >= 46


async def test_a_stall_is_not_held_back_by_an_earlier_summarys_failed_send(
    tmp_path: pathlib.Path, jitter: None
) -> None:
    # The endpoint away a moment (a controller failover) as a periodic summary goes: the
    # summaries wait a period; a stall that comes meanwhile goes at once.
    run = Run(tmp_path, hang_seconds=5.0, progress_summary_seconds=30.0)
    await run.ticks(10, step=1)
    sent = len(run.sent.summaries)
    run.sent.down = True
    await run.ticks(25, step=11)  # the periodic summary of these fails
    assert run.sent.attempts == sent + 1
    run.sent.down = False
    await run.ticks(10)  # the trainer hangs: 5 s later, a stall, not 30 s after the failure
    stalls = [s for s in run.sent.summaries if s.stalled]
    assert len(stalls) == 1
    assert stalls[0].idle_seconds <= 6.0


async def test_without_hang_seconds_no_stall(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path, hang_seconds=None)
    await run.ticks(5, step=1)
    await run.ticks(1000)
    assert run.monitor.stalls == 0
    assert not any(s.stalled for s in run.sent.summaries)


def test_a_pods_agent_follows_progress_and_knows_hang_seconds() -> None:
    env = {"GANGJOB_NAME": "j", "POD_NAME": "p", "POD_NAMESPACE": "n"}
    config = Config.from_env(env)
    assert (config.progress_poll_seconds, config.hang_seconds) == (1.0, None)
    assert config.progress_summary_seconds == 30.0
    summaries = Config.from_env(env | {"GANGJOB_PROGRESS_SUMMARY_SECONDS": "120"})
    assert summaries.progress_summary_seconds == 120.0
    assert Config.from_env(env | {"GANGJOB_HANG_SECONDS": "0"}).hang_seconds is None
    assert Config.from_env(env | {"GANGJOB_HANG_SECONDS": "90"}).hang_seconds == 90.0
    with pytest.raises(ConfigError, match="GANGJOB_HANG_SECONDS"):
        Config.from_env(env | {"GANGJOB_HANG_SECONDS": "soon"})


# -- the summary on the wire and in the book ----------------------------------------------------


def summary(**kw: Any) -> Summary:
    fields: dict[str, Any] = {
        "step": 10,
        "checkpoint": 8,
        "compute": 0.25,
        "steps_per_second": 2.0,
        "idle_seconds": 4.0,
        "stalled": False,
        "malformed": 1,
    }
    return Summary(**{**fields, **kw})


def test_the_agents_summary_parses_into_the_books_progress(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, pod_uid="u0")
    sent = summary(stalled=True, trainer_state="D", trainer_cpu_seconds=1.5)
    posted = parse_progress(progress_body(config, 3, sent))
    assert (posted.namespace, posted.job, posted.pod, posted.uid) == (NS, "train", "train-0", "u0")
    assert posted.progress(now=100.0) == ProgressReport(
        uid="u0",
        epoch=3,
        step=10,
        steps_per_second=2.0,
        checkpoint=8,
        compute_seconds=0.25,
        step_changed_at=96.0,
        stalled_since=96.0,
        malformed=1,
        received_at=100.0,
        trainer_state="D",
        trainer_cpu_seconds=1.5,
    )
    first = parse_progress(
        progress_body(config, 0, summary(steps_per_second=None, checkpoint=None))
    )
    assert (first.steps_per_second, first.checkpoint, first.trainer_state) == (None, None, None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"progress": None}, "progress"),
        ({"uid": ""}, "uid"),
        ({"epoch": -1}, "epoch"),
        ({"progress": {"idleSeconds": 1}}, "progress.step"),
        ({"progress": {"step": 1.5, "idleSeconds": 1}}, "progress.step"),
        ({"progress": {"step": 1}}, "progress.idleSeconds"),
        ({"progress": {"step": 1, "idleSeconds": 1, "stepsPerSecond": "fast"}}, "stepsPerSecond"),
        ({"progress": {"step": 1, "idleSeconds": 1, "checkpoint": True}}, "progress.checkpoint"),
        ({"progress": {"step": 1, "idleSeconds": 1, "stalled": "yes"}}, "progress.stalled"),
        ({"progress": {"step": 1, "idleSeconds": 1, "trainer": []}}, "progress.trainer"),
        ({"progress": {"step": 1, "idleSeconds": 1, "trainer": {}}}, "progress.trainer.state"),
        (
            {
                "progress": {
                    "step": 1,
                    "idleSeconds": 1,
                    "trainer": {"state": "S", "cpuSeconds": -1},
                }
            },
            "progress.trainer.cpuSeconds",
        ),
    ],
)
def test_a_bad_summary_names_the_field(
    tmp_path: pathlib.Path, change: dict[str, Any], field: str
) -> None:
    body = {**progress_body(make_config(tmp_path, pod_uid="u0"), 0, summary()), **change}
    with pytest.raises(BadReport, match=field):
        parse_progress(body)


def progress(
    uid: str = "u0", epoch: int = 1, step: int = 5, stalled: bool = False
) -> ProgressReport:
    return ProgressReport(
        uid, epoch, step, 1.0, None, None, 10.0, 10.0 if stalled else None, 0, 20.0
    )


def test_the_book_keeps_each_workers_latest_progress() -> None:
    book, job = ArrivalBook(), f"{NS}/train"
    assert book.progress(NS, "train-0") is None
    # The job's first summary of an epoch is news for the controller's pass (it takes the
    # status's progress up and looks again at its period); the others' are not.
    assert book.record_progress(job, "train-0", progress()) is True
    assert book.record_progress(job, "train-1", progress(uid="u1", step=4)) is False
    assert book.progress_of(job) == {"train-0": progress(), "train-1": progress(uid="u1", step=4)}
    # Then only a stall's beginning and end are news.
    assert book.record_progress(job, "train-0", progress(step=6, stalled=True)) is True
    assert book.record_progress(job, "train-0", progress(step=6, stalled=True)) is False
    assert book.record_progress(job, "train-0", progress(step=7)) is True
    # An older epoch's summary, late, is not kept; a new epoch's or a new pod's replaces it.
    assert book.record_progress(job, "train-0", progress(epoch=0, step=99)) is False
    assert book.progress(NS, "train-0") == progress(step=7)
    assert book.record_progress(job, "train-0", progress(epoch=2, step=1, stalled=True)) is True
    assert book.record_progress(job, "train-1", progress(uid="u1", epoch=2, step=1)) is False
    # The same worker hanging again at the next epoch, its first word there a stall: news too
    # (the pass that restarts the gang waits for it).
    assert book.record_progress(job, "train-0", progress(epoch=3, step=1, stalled=True)) is True
    # A deleted pod's progress goes with it, and not another pod's of its name.
    book.forget(NS, "train-0", "another-uid")
    assert book.progress(NS, "train-0") is not None
    book.forget(NS, "train-0", "u0")
    book.forget(NS, "train-1", "u1")
    assert (book.progress(NS, "train-0"), dict(book.progress_of(job))) == (None, {})
    # A job of the name again (deleted and created anew) starts at epoch 0: news again.
    assert book.record_progress(job, "train-0", progress(epoch=0)) is True


def test_a_summarys_compute_window_reaches_the_book_and_folds_into_the_runs(
    tmp_path: pathlib.Path,
) -> None:
    config = make_config(tmp_path, pod_uid="u0")
    window = ComputeWindow(median=0.5, samples=28, seconds=29.0)
    posted = parse_progress(progress_body(config, 1, summary(compute_window=window)))
    held = posted.progress(now=100.0)
    assert (held.compute_median_seconds, held.compute_samples, held.compute_since) == (
        0.5, 28, 71.0,
    )  # fmt: skip
    book, job = ArrivalBook(), f"{NS}/train"
    book.record_progress(job, "train-0", held)
    assert book.progress(NS, "train-0").compute_runs == ((71.0, 0.5),)  # type: ignore[union-attr]
    slower = ComputeWindow(median=1.0, samples=5, seconds=5.0)
    posted = parse_progress(progress_body(config, 1, summary(step=20, compute_window=slower)))
    # Twice the compute: news for the pass (a straggler may begin).
    assert book.record_progress(job, "train-0", posted.progress(now=110.0)) is True
    kept = book.progress(NS, "train-0")
    assert kept is not None
    assert kept.compute_runs == ((71.0, 0.5), (105.0, 1.0))
    assert kept.view().compute_runs == kept.compute_runs
    assert kept.view().compute_median_seconds == 1.0
    # The next epoch's compute is judged afresh.
    posted = parse_progress(progress_body(config, 2, summary(step=1, compute_window=slower)))
    assert book.record_progress(job, "train-0", posted.progress(now=130.0)) is True  # its first
    assert book.progress(NS, "train-0").compute_runs == ((125.0, 1.0),)  # type: ignore[union-attr]


def test_an_agent_that_sends_no_window_has_its_latest_compute_stand_for_one() -> None:
    book, job = ArrivalBook(), f"{NS}/train"
    first = dataclasses.replace(progress(), compute_seconds=0.5, received_at=20.0)
    book.record_progress(job, "train-0", first)
    later = dataclasses.replace(progress(step=9), compute_seconds=0.7, received_at=50.0)
    book.record_progress(job, "train-0", later)
    kept = book.progress(NS, "train-0")
    assert kept is not None
    assert kept.compute_median_seconds == 0.7
    assert kept.compute_runs == ((20.0, 0.5), (20.0, 0.7))  # since the summary before it


async def test_a_shift_of_the_compute_is_sent_at_once(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path, progress_summary_seconds=30.0)
    for step in range(1, 66):  # summaries at the 1st, 31st and 61st ticks
        run.file.write_text(f"step={step} compute=0.5\n")
        await run.ticks(1)
    before = len(run.sent.summaries)
    assert run.sent.summaries[-1].compute_window is not None
    assert run.sent.summaries[-1].compute_window.median == 0.5
    # The device slows down: the agent says so within a few polls, not a period later (at
    # most one shift per SHIFT_MIN_SECONDS after the last summary: at the 71st tick).
    for step in range(66, 76):
        run.file.write_text(f"step={step} compute=1.0\n")
        await run.ticks(1)
    assert len(run.sent.summaries) == before + 1
    shifted = run.sent.summaries[-1]
    assert shifted.compute_window is not None
    # Its window starts where the slowdown began, though told later: the 6 slow samples.
    assert (shifted.compute_window.median, shifted.compute_window.samples) == (1.0, 6)
    assert shifted.step == 71


# -- a real agent and the real endpoint, in-process ---------------------------------------------

TRAINER = """\
for i in 1 2 3; do echo "step=$i compute=0.01" > "$GANGJOB_PROGRESS"; done
echo "not progress" >> "$GANGJOB_PROGRESS"
exec sleep 30
"""


async def test_a_trainers_progress_and_its_stall_reach_the_book(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    ctl = controller
    pod, uid = "train-0", "uid-train-0"
    config: Config = make_config(
        tmp_path,
        pod,
        pod_uid=uid,
        arrival_url=ctl.url,
        arrival_token_file=tmp_path / f"{pod}.token",
        progress_poll_seconds=0.02,
        progress_summary_seconds=0.1,
        hang_seconds=0.5,
    )
    config.arrival_token_file.write_text(f"{pod}/{uid}")
    ctl.fake.add_pod(pod)
    ctl.fake.pods[pod]["metadata"]["uid"] = uid
    async with HttpClient(ctl.url) as client:
        agent = Agent(config, ctl.fake, mode=AgentPlacement.WRAPPER, command=["sh", "-c", TRAINER],
                      arrival_client=client)  # fmt: skip
        task = asyncio.create_task(agent.run())
        try:
            await until(agent, lambda s: s.step == Step.AT_BARRIER)
            ctl.set_status(barrierEpoch=0)
            await until(agent, lambda s: s.step == Step.RUNNING)

            def stalled() -> bool:
                held = ctl.book.progress(NS, pod)
                return held is not None and held.stalled_since is not None

            await polled(stalled)
            held = ctl.book.progress(NS, pod)
            assert held is not None
            assert (held.uid, held.epoch, held.step, held.compute_seconds) == (uid, 0, 3, 0.01)
            assert held.malformed == 1
            assert held.trainer_state == "S"  # `sleep`, as the agent started it
            assert agent.progress is not None
            assert agent.progress.stalls == 1
            # One pass for the epoch's first summary, one for the stall's message.
            assert ctl.stalls == [f"{NS}/train"] * 2
        finally:
            agent.stop()
            await asyncio.wait_for(task, 30)
    assert "registered no stack dump" in (config.dir / STACKS_FILE).read_text()
    # Refused like an arrival report: the token is another pod's.
    async with HttpClient(ctl.url) as client:
        body = progress_body(config, 0, summary())
        with pytest.raises(ApiError, match="403"):
            await client.post(PROGRESS_PATH, body, token="train-1/uid-train-1")


async def test_a_sidecar_follows_the_trainer_it_cannot_see_from_the_barrier_on(
    tmp_path: pathlib.Path,
) -> None:
    """`Pod` mode, arriving by annotation (no endpoint): the kubelet starts the trainer, which
    writes the file; the sidecar clears what an earlier epoch left, tells the stall itself and
    stops following when the gang moves on."""
    fake = FakeApi(epoch=1)
    fake.add_pod("train-0", {"gangjob.io/epoch": "0"})
    config = make_config(tmp_path, progress_poll_seconds=0.01, hang_seconds=0.2)
    steps = config.dir / PROGRESS_FILE
    steps.parent.mkdir(parents=True)
    steps.write_text("step=900\n")  # the trainer of epoch 0, before the pod restarted
    agent = Agent(config, fake)
    async with running(agent) as task:
        await until(agent, lambda s: s.step == Step.AT_BARRIER and s.epoch == 1)
        assert not steps.exists()
        assert (config.dir / "python" / "gangjob_progress.py").exists()
        fake.set_status(barrierEpoch=1)
        await until(agent, lambda s: s.barrier_open)
        steps.write_text("step=1\n")  # the trainer, started by the kubelet
        assert agent.progress is not None
        monitor = agent.progress
        await polled(lambda: monitor.stalls == 1)
        assert monitor.tracker.reading == Reading(1)
        fake.set_status(epoch=2)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    assert "no trainer process to ask for stacks" in (config.dir / STACKS_FILE).read_text()


def test_a_restarted_agent_logs_the_stacks_its_last_run_collected(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A whole-pod restart replaces the agent's container and its log; the directory stays.
    run = Run(tmp_path)
    (run.config.dir / STACKS_FILE).write_text("== pid 7 (state T): stopped\n")
    with caplog.at_level(logging.WARNING):
        run.monitor.replay_stacks()
    assert "stacks collected at the last stall" in caplog.text
    assert "== pid 7 (state T): stopped" in caplog.text
    assert not (run.config.dir / STACKS_FILE).exists()
    caplog.clear()
    run.monitor.replay_stacks()  # once: the next restart logs nothing again
    assert caplog.text == ""
