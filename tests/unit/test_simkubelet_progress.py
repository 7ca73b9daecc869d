"""The simulated kubelet's stand-in trainer reports progress as the contract says, read back by
the agent's own reader (localcluster/simkubelet.py `SimTrainer.report`), and stops when hung;
its agent's settings come from the pod's agent environment (`agent_env`)."""

from __future__ import annotations

from pathlib import Path

from agent.progress import ProgressFiles
from api.constants import ENV_EPOCH, ENV_GANGJOB_NAME, ENV_HANG_SECONDS, ENV_PROGRESS
from localcluster.simkubelet import SimProgress, SimTrainer, agent_env

PROGRESS = SimProgress(steps_per_second=2.0, checkpoint_every=4)


async def started(tmp_path: Path) -> tuple[SimTrainer, ProgressFiles]:
    run = SimTrainer(["train"], {ENV_EPOCH: "3", ENV_PROGRESS: str(tmp_path / "steps")})
    await run.start()
    return run, ProgressFiles(tmp_path, "steps")


async def test_a_run_reports_its_steps_and_checkpoints_to_the_agents_reader(
    tmp_path: Path,
) -> None:
    run, files = await started(tmp_path)
    assert run.started_at is not None
    t0 = run.started_at

    assert run.report(t0, PROGRESS)  # step 0 at once
    reading = files.poll()
    assert reading is not None
    assert (reading.step, reading.checkpoint) == (0, 0)

    assert not run.report(t0 + 0.4, PROGRESS)  # still step 0: nothing written
    # A line of another length: the reader tells the change by the file's size even within
    # one tick of the filesystem's clock.
    assert run.report(t0 + 5.1, PROGRESS)
    reading = files.poll()
    assert reading is not None
    assert (reading.step, reading.checkpoint) == (10, 8)
    assert (run.step, run.reported_at) == (10, t0 + 5.1)
    assert files.malformed == 0


async def test_a_hung_run_reports_nothing_more_and_keeps_running(tmp_path: Path) -> None:
    run, files = await started(tmp_path)
    assert run.started_at is not None
    t0 = run.started_at
    run.report(t0 + 1.0, PROGRESS)
    run.hang()

    assert not run.report(t0 + 30.0, PROGRESS)
    assert run.running
    reading = files.poll()
    assert reading is not None
    assert reading.step == 2
    assert run.reported_at == t0 + 1.0  # its last step


async def test_an_ended_run_reports_nothing(tmp_path: Path) -> None:
    run, _ = await started(tmp_path)
    assert run.started_at is not None
    run.exit(143)
    assert not run.report(run.started_at + 5.0, PROGRESS)
    assert not (tmp_path / "steps").exists()


def test_the_agents_settings_come_from_the_container_that_names_the_gangjob() -> None:
    env = [{"name": ENV_GANGJOB_NAME, "value": "j"}, {"name": ENV_HANG_SECONDS, "value": "10"},
           {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]  # fmt: skip
    pod = {
        "spec": {
            "initContainers": [{"name": "install", "env": [{"name": "X", "value": "1"}]}],
            "containers": [{"name": "trainer", "env": env}],
        }
    }
    assert agent_env(pod) == {ENV_GANGJOB_NAME: "j", ENV_HANG_SECONDS: "10"}
    assert agent_env({"spec": {"containers": [{"name": "trainer"}]}}) == {}


async def test_a_run_reports_its_compute_at_its_slowness_and_the_gangs_pace(
    tmp_path: Path,
) -> None:
    # A step a second: 0.6 s of compute, 0.4 s of the rest. Twice as slow a device makes the
    # gang's step 1.6 s, and its own compute 1.2 s.
    progress = SimProgress(steps_per_second=1.0, compute_seconds=0.6, jitter=0.1)
    assert progress.step_seconds() == 1.0
    assert progress.step_seconds(2.0) == 1.6
    run, files = await started(tmp_path)
    assert run.started_at is not None
    t0 = run.started_at
    assert run.report(t0 + 10.0, progress, progress.step_seconds(), 1.0)
    reading = files.poll()
    assert reading is not None
    assert reading.step == 10
    assert reading.compute is not None
    assert 0.54 <= reading.compute <= 0.66
    # Slowed from now on: 16 s more make 10 steps of 1.6 s.
    assert run.report(t0 + 26.0, progress, progress.step_seconds(2.0), 2.0)
    reading = files.poll()
    assert reading is not None
    assert reading.step == 20
    assert reading.compute is not None
    assert 1.08 <= reading.compute <= 1.32
