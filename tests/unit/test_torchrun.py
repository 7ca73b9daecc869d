"""Unit tests of the torchrun contract: controller.policy.torchrun (nprocPerNode, the PET_*
variables), its place in the worker pod (controller.policy.podspec) and the agent's `launch`,
which gives the trainer the epoch's rendezvous id."""

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from agent.cli import launch_env
from agent.protocol import rendezvous_id
from api.constants import WRAPPED_ZIPAPP
from api.naming import master_addr
from api.v1alpha1 import GangJobStatus, RestartMode
from controller.policy.podspec import TrainerCommandRequired, build_pod
from controller.policy.torchrun import gpu_limit, nproc_per_node, torchrun_env
from tests.unit.builders import JOB_NAME, TEMPLATE, job_dict, make_job, with_status
from tests.unit.test_podspec import AGENT, env_of


def env_map(pod: dict[str, Any], container: str = "trainer") -> dict[str, str]:
    return {e["name"]: e["value"] for e in env_of(pod, container) if "value" in e}


def gpu_template(limits: dict[str, str]) -> dict[str, Any]:
    trainer = {**TEMPLATE["spec"]["containers"][0], "resources": {"limits": limits}}
    return {"spec": {"containers": [trainer]}}


@pytest.mark.parametrize(
    ("value", "limits", "expected"),
    [
        (None, {}, 1),
        (None, {"nvidia.com/gpu": "8"}, 1),
        (4, {"nvidia.com/gpu": "8"}, 4),
        ("auto", {"nvidia.com/gpu": "8"}, 8),
        ("auto", {"amd.com/gpu": "2", "cpu": "4"}, 2),
        ("auto", {"cpu": "4"}, 1),
        ("auto", {}, 1),
    ],
)
def test_nproc_per_node(value: int | str | None, limits: dict[str, str], expected: int) -> None:
    assert nproc_per_node(value, {"resources": {"limits": limits}}) == expected


def test_a_gpu_request_without_a_limit_is_no_gpu() -> None:
    assert gpu_limit({"resources": {"requests": {"nvidia.com/gpu": "8"}}}) == 0


def test_torchrun_env() -> None:
    assert torchrun_env(3, 4, 8, "job-0.job", 29500) == [
        {"name": "PET_NNODES", "value": "4"},
        {"name": "PET_NODE_RANK", "value": "3"},
        {"name": "PET_NPROC_PER_NODE", "value": "8"},
        {"name": "PET_MASTER_ADDR", "value": "job-0.job"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
        {"name": "PET_MAX_RESTARTS", "value": "0"},
    ]


@pytest.mark.parametrize("value", [0, -1, "4", "all", 1.5])
def test_nproc_per_node_rejects(value: Any) -> None:
    with pytest.raises(ValidationError, match="nprocPerNode"):
        make_job(nprocPerNode=value)


@pytest.mark.parametrize("mode", list(RestartMode))
def test_every_worker_gets_the_torchrun_env_beside_the_plain_one(mode: RestartMode) -> None:
    job = make_job(4, template=gpu_template({"nvidia.com/gpu": "8"}), nprocPerNode="auto",
                   restart={"mode": str(mode)})  # fmt: skip
    for rank in range(4):
        env = env_map(build_pod(job, rank, AGENT))
        assert env["WORLD_SIZE"] == "4"  # pods, as before
        assert env["RANK"] == str(rank)
        assert env["PET_NNODES"] == "4"
        assert env["PET_NODE_RANK"] == str(rank)
        assert env["PET_NPROC_PER_NODE"] == "8"
        assert env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == master_addr(JOB_NAME)
        assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] == "29500"
        assert env["PET_MAX_RESTARTS"] == "0"
        # The id changes with the epoch: never in the pod, which an in-place restart keeps.
        assert "PET_RDZV_ID" not in env


@pytest.mark.parametrize("mode", [RestartMode.POD, RestartMode.RECREATE])
def test_nproc_per_node_launches_the_trainer_through_the_agent(mode: RestartMode) -> None:
    job = make_job(2, nprocPerNode=2, restart={"mode": str(mode)})
    pod = build_pod(job, 1, AGENT)
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert trainer["command"] == ["python3", WRAPPED_ZIPAPP, "launch", "--", "python", "train.py"]
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    # The zipapp is copied in before the sidecar starts, and so before the trainer.
    assert names == ["gangjob-agent-install", "gangjob-agent"]


def test_without_nproc_per_node_the_pod_mode_trainer_runs_as_given() -> None:
    pod = build_pod(make_job(2), 0, AGENT)
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert trainer["command"] == ["python", "train.py"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gangjob-agent"]


def test_nproc_per_node_needs_the_trainer_command() -> None:
    template = {"spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}
    job = make_job(2, template=template, nprocPerNode=1)
    with pytest.raises(TrainerCommandRequired, match=r"containers\[0\]\.command.*nprocPerNode"):
        build_pod(job, 0, AGENT)


def test_the_pod_is_built_at_any_epoch_alike() -> None:
    job = make_job(2, nprocPerNode=2)
    later = with_status(job, GangJobStatus(epoch=5))
    assert env_of(build_pod(job, 1, AGENT), "trainer") == env_of(
        build_pod(later, 1, AGENT), "trainer"
    )


def test_launch_env_reads_the_epoch_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "epoch").write_text("3\n")
    env = launch_env({"GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path), "X": "1"})
    assert env == {
        "GANGJOB_NAME": "llama",
        "GANGJOB_DIR": str(tmp_path),
        "X": "1",
        "GANGJOB_EPOCH": "3",
        "PET_RDZV_ID": "llama-epoch-3",
        "GANGJOB_PROGRESS": str(tmp_path / "progress" / "steps"),
        "PYTHONPATH": str(tmp_path / "python"),
    }
    assert rendezvous_id("llama", 3) != rendezvous_id("llama", 4)


def test_launch_env_names_what_is_missing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="GANGJOB_NAME"):
        launch_env({"GANGJOB_DIR": str(tmp_path)})
    with pytest.raises(ValueError, match="epoch"):
        launch_env({"GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path)})


def _launch(tmp_path: pathlib.Path, script: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "epoch").write_text("7\n")
    env = {**os.environ, "GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "agent", "launch", "--", "sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_launch_runs_the_command_with_the_epoch_and_says_it_succeeded(
    tmp_path: pathlib.Path,
) -> None:
    # The sidecar said the job has finished: the launcher does not hold the container.
    (tmp_path / "finished").write_text("1\n")
    done = _launch(tmp_path, 'echo "$GANGJOB_EPOCH $PET_RDZV_ID"')
    assert (done.returncode, done.stdout) == (0, "7 llama-epoch-7\n")
    # For the sidecar to report: the trainer exited 0 at epoch 7.
    assert (tmp_path / "trainer-exit").read_text() == "7:0\n"


def test_launch_ends_with_a_failed_commands_code(tmp_path: pathlib.Path) -> None:
    done = _launch(tmp_path, "exit 3")
    assert done.returncode == 3
    assert not (tmp_path / "trainer-exit").exists()


def test_launch_exits_127_for_a_missing_command(tmp_path: pathlib.Path) -> None:
    (tmp_path / "epoch").write_text("0\n")
    env = {**os.environ, "GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "agent", "launch", "--", "/nonexistent/trainer"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 127
    assert "/nonexistent/trainer" in done.stderr


def test_job_dict_round_trips_nproc_auto() -> None:
    assert job_dict(2, nprocPerNode="auto")["spec"]["nprocPerNode"] == "auto"
    assert make_job(2, nprocPerNode="auto").spec.nproc_per_node == "auto"
