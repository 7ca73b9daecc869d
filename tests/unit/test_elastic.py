"""Elastic gangs outside the policy (docs/design.md section 3.12): the API's bounds, the
worker pod an elastic job gets, the agent's ranks per epoch and its `world` file, and the
launcher reading it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.agent import Agent, Step
from agent.cli import launch_env
from agent.config import Config
from agent.protocol import (
    JobState,
    dense_rank,
    epoch_env,
    in_world,
    outside_world,
    outside_world_env,
    read_world_file,
    world_file_text,
)
from agent.watch import newest
from api.builders import leader_and_elastic
from api.constants import (
    ANNOTATION_EPOCH,
    BARRIER_PATH,
    EPOCH_FILE,
    FINISHED_FILE,
    RESTART_EXIT_CODE,
    TRAINER_EXIT_FILE,
    WORLD_FILE,
)
from api.failures import FAILURE_CLASSES, FailureClass
from api.v1alpha1 import Elasticity, parse_gangjob
from controller.arrivals.server import state_line
from controller.policy.podspec import build_pod
from controller.policy.scheduling import gang_size
from tests.unit.builders import job_dict
from tests.unit.test_agent import DEADLINE, FakeApi, at, make_config, polled, running, until
from tests.unit.test_agent_http import fetch

AGENT = "agent:1"
ELASTIC = {"minReplicas": 2, "maxReplicas": 8}


def elastic_job(replicas: int = 4, **elastic: Any) -> dict[str, Any]:
    return job_dict(replicas, elastic={**ELASTIC, **elastic})


def test_elastic_bounds_parse() -> None:
    job = parse_gangjob(elastic_job(4))
    assert job.spec.elastic is not None
    assert (job.spec.elastic.min_replicas, job.spec.elastic.max_replicas) == (2, 8)
    assert job.spec.elastic.wait_seconds == 300
    assert job.spec.elastic.grow_after_seconds == 600


@pytest.mark.parametrize("replicas", [1, 9])
def test_replicas_outside_the_bounds_are_refused_naming_the_field(replicas: int) -> None:
    with pytest.raises(ValidationError, match=r"replicas must be within spec\.elastic"):
        parse_gangjob(elastic_job(replicas))


def test_min_above_max_is_refused() -> None:
    with pytest.raises(
        ValidationError, match=r"elastic\.minReplicas must be <= elastic\.maxReplicas"
    ):
        parse_gangjob(job_dict(4, elastic={"minReplicas": 5, "maxReplicas": 3}))


def roles_job(workers: int = 3, leaders: int = 1, **elastic: Any) -> dict[str, Any]:
    """A leader role (the coordinator) and an elastic role `worker`, last."""
    return leader_and_elastic(job_dict(2), workers, {**ELASTIC, **elastic}, leaders)


def test_an_elastic_role_bounds_the_workers_numbered_after_the_other_roles() -> None:
    job = parse_gangjob(roles_job(3, leaders=2, spares=1))
    elastic = job.spec.elasticity
    assert elastic is not None
    assert (elastic.first, elastic.field) == (2, "spec.roles[worker].elastic")
    assert elastic.min_world == 2 + ELASTIC["minReplicas"]
    # The spare is a worker of the elastic role, numbered after its replicas.
    assert [(w.role.name, w.index, w.worker) for w in job.spec.workers] == [
        ("leader", 0, 0), ("leader", 1, 1),
        ("worker", 0, 2), ("worker", 1, 3), ("worker", 2, 4), ("worker", 3, 5),
    ]  # fmt: skip
    assert gang_size(job) == 2 + ELASTIC["minReplicas"] + 1
    # Every worker's trainer learns the epoch's RANK and WORLD_SIZE from its agent: a
    # leader's WORLD_SIZE changes with the elastic role's size too.
    leader = build_pod(job, 0, AGENT)
    assert leader["spec"]["containers"][0]["command"][2:4] == ["launch", "--"]
    assert parse_gangjob(elastic_job(4)).spec.elasticity == Elasticity(
        parse_gangjob(elastic_job(4)).spec.elastic,  # type: ignore[arg-type]
        0,
        "spec.elastic",
    )


def _move_elastic_first(body: dict[str, Any]) -> None:
    body["spec"]["roles"].reverse()


def _unranked_leader(body: dict[str, Any]) -> None:
    body["spec"]["roles"][0]["ranked"] = False


def _depends(body: dict[str, Any]) -> None:
    body["spec"]["roles"][1]["dependsOn"] = [{"role": "leader", "status": "Ready"}]


def _outside(body: dict[str, Any]) -> None:
    body["spec"]["roles"][1]["replicas"] = 9


def _on_spec(body: dict[str, Any]) -> None:
    body["spec"]["elastic"] = body["spec"]["roles"][1].pop("elastic")


def _spares_recreate(body: dict[str, Any]) -> None:
    body["spec"]["roles"][1]["elastic"]["spares"] = 1
    body["spec"]["restart"] = {"mode": "Recreate"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_move_elastic_first, r"roles\[\]\.elastic: only the last role of spec\.roles"),
        (_unranked_leader, r"roles\[\]\.ranked: every role of a job with an elastic role"),
        (_depends, r"roles\[worker\]\.dependsOn: an elastic role starts with the gang"),
        (_outside, r"roles\[worker\]\.replicas must be within the role's elastic"),
        (_on_spec, r"elastic: with spec\.roles, set elastic on the role that resizes"),
        (_spares_recreate, r"roles\[\]\.elastic\.spares requires a restart mode"),
    ],
)
def test_what_an_elastic_role_may_not_be_is_refused_naming_the_field(
    change: Any, message: str
) -> None:
    body = roles_job()
    change(body)
    with pytest.raises(ValidationError, match=message):
        parse_gangjob(body)


def test_resized_is_an_uncounted_gang_restart() -> None:
    meaning = FAILURE_CLASSES[FailureClass.RESIZED]
    assert not meaning.counted
    assert not meaning.infrastructure


def test_a_process_mode_elastic_pod_tells_the_wrapping_agent_its_rank() -> None:
    body = elastic_job(4)
    body["spec"]["restart"] = {"mode": "Process"}
    pod = build_pod(parse_gangjob(body), 1, AGENT)
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"][2] == "wrap"
    rank = next(e for e in trainer["env"] if e["name"] == "GANGJOB_RANK")
    assert rank["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['gangjob.io/rank']"}}


def test_elastic_pod_launches_its_trainer_and_tells_the_sidecar_its_rank() -> None:
    pod = build_pod(parse_gangjob(elastic_job(4)), 2, AGENT)
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"][:4] == ["python3", "/gangjob/agent.pyz", "launch", "--"]
    assert trainer["command"][4:] == ["python", "train.py"]
    [sidecar] = [c for c in pod["spec"]["initContainers"] if c["name"] == "gangjob-agent"]
    rank = next(e for e in sidecar["env"] if e["name"] == "GANGJOB_RANK")
    assert rank["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['gangjob.io/rank']"}}
    assert pod["metadata"]["labels"]["gangjob.io/rank"] == "2"


def test_a_job_without_elastic_keeps_its_pod() -> None:
    pod = build_pod(parse_gangjob(job_dict(4)), 2, AGENT)
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"] == ["python", "train.py"]
    [sidecar] = [c for c in pod["spec"]["initContainers"] if c["name"] == "gangjob-agent"]
    assert "GANGJOB_RANK" not in {e["name"] for e in sidecar["env"]}


def test_the_state_line_carries_the_world_and_the_agent_reads_it() -> None:
    job = {"metadata": {"name": "llama"}, "status": {"epoch": 3, "worldSize": 6, "dropped": [2]}}
    line = state_line(job)
    assert b'"worldSize": 6' in line
    assert b'"dropped": [2]' in line
    assert JobState.from_object(job).world_size == 6
    assert JobState.from_object(job).dropped == {2}
    assert JobState.from_object({"status": {"epoch": 3}}).world_size is None


def test_the_world_follows_the_later_epoch() -> None:
    old = JobState(epoch=3, world_size=8)
    new = JobState(epoch=4, world_size=6)
    assert newest(old, new).world_size == 6
    assert newest(new, old).world_size == 6  # a stale view never brings back the old world
    assert newest(new, JobState(epoch=4)).world_size == 6
    shrunk = JobState(epoch=5, world_size=5, dropped=frozenset({3}))
    assert newest(new, shrunk).dropped == {3}
    assert newest(shrunk, new).dropped == {3}


def test_epoch_env_gives_rank_and_world_for_torchrun_too() -> None:
    assert epoch_env(5, 2, 6) == {
        "GANGJOB_EPOCH": "5",
        "RANK": "2",
        "WORLD_SIZE": "6",
        "PET_NODE_RANK": "2",
        "PET_NNODES": "6",
    }
    assert epoch_env(5, 2, None) == {"GANGJOB_EPOCH": "5"}  # the pod's environment stands


def test_a_surplus_or_dropped_worker_is_outside_the_world() -> None:
    assert in_world(3, JobState(world_size=4))
    assert not in_world(4, JobState(world_size=4))  # surplus of a shrink to 4
    assert in_world(None, JobState(world_size=4))
    assert in_world(7, JobState())  # not elastic: the pod's environment stands
    dropped = JobState(world_size=4, dropped=frozenset({1}))  # workers 0, 2, 3, 4
    assert not in_world(1, dropped)
    assert in_world(4, dropped)
    assert not in_world(5, dropped)


def test_ranks_stay_dense_around_dropped_workers() -> None:
    dropped = frozenset({1, 3})
    assert [dense_rank(w, dropped) for w in range(6)] == [0, None, 1, None, 2, 3]
    assert dense_rank(None, dropped) is None


def test_a_spare_in_a_lost_workers_place_takes_its_rank_and_moves_nobody() -> None:
    # Workers 0..5, spare 6; worker 2 lost, spare 6 in its place; 2's new pod is a spare.
    dropped, places = frozenset({2}), ((6, 2),)
    assert [dense_rank(w, dropped, places) for w in range(7)] == [0, 1, None, 3, 4, 5, 2]
    # The state lines carry it, and a later epoch's view wins.
    state = JobState.from_object(
        {
            "status": {
                "epoch": 3,
                "worldSize": 6,
                "dropped": [2],
                "places": [{"worker": 6, "place": 2}],
            }
        }
    )
    assert state.places == places
    assert not in_world(2, state)
    assert in_world(6, state)
    assert newest(JobState(epoch=2, world_size=6), state).places == places


@given(
    spanned=st.integers(1, 12),
    data=st.data(),
)
def test_ranks_with_places_are_the_members_in_place_order(
    spanned: int, data: st.DataObject
) -> None:
    """Whatever `status.dropped` and `status.places` say (places may collide: a dropped worker
    that rejoins while a spare holds its place), every member gets one rank of 0..n-1, in
    the order of (place, number)."""
    numbers = list(range(spanned))
    dropped = frozenset(data.draw(st.sets(st.sampled_from(numbers))))
    places = tuple(
        sorted(
            data.draw(st.dictionaries(st.sampled_from(numbers), st.sampled_from(numbers))).items()
        )
    )
    at = dict(places)
    members = sorted((w for w in numbers if w not in dropped), key=lambda w: (at.get(w, w), w))
    assert [dense_rank(w, dropped, places) for w in members] == list(range(len(members)))
    assert all(dense_rank(d, dropped, places) is None for d in dropped)


def test_the_world_file_round_trips() -> None:
    env = epoch_env(5, 2, 6)
    text = world_file_text(env)
    assert "WORLD_SIZE=6\n" in text
    assert read_world_file(text + "garbage\n") == env


def test_the_agent_takes_its_rank_from_gangjob_rank_only() -> None:
    base = {"GANGJOB_NAME": "llama", "POD_NAME": "llama-2", "POD_NAMESPACE": "ml"}
    assert Config.from_env({**base, "GANGJOB_RANK": "2"}).rank == 2
    # A gang that is not elastic: the trainer's own RANK (the user's, maybe) is left alone.
    assert Config.from_env({**base, "RANK": "99"}).rank is None


def test_launch_env_takes_the_world_of_its_epoch(tmp_path: pathlib.Path) -> None:
    (tmp_path / "epoch").write_text("5\n")
    (tmp_path / "world").write_text(world_file_text(epoch_env(5, 2, 6)))
    env = {"GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path), "WORLD_SIZE": "8", "RANK": "2"}
    got = launch_env(env)
    assert (got["WORLD_SIZE"], got["RANK"], got["PET_NNODES"], got["GANGJOB_EPOCH"]) == (
        "6",
        "2",
        "6",
        "5",
    )
    # Another epoch's world file is not this epoch's: the pod's environment stands.
    (tmp_path / "world").write_text(world_file_text(epoch_env(4, 2, 3)))
    assert launch_env(env)["WORLD_SIZE"] == "8"


def test_the_last_arrival_is_counted_without_the_dropped_workers() -> None:
    from controller.manager import barrier_waits_for

    status = {"dropped": [2], "roles": [{"name": "worker", "state": "Running", "replicas": 4}]}
    assert barrier_waits_for({"replicas": 4}, status) == 3
    assert barrier_waits_for({"replicas": 4}, {"dropped": [1, 2]}) == 2


# A spare in `Pod` mode: its sidecar opens the startup probe and says, in the `world` file, that
# the worker is outside the world; its launcher starts nothing (docs/design.md section 3.12).


def spare_agent(
    tmp_path: pathlib.Path, fake: FakeApi, rank: int, *, launched: bool = True
) -> Agent:
    config = make_config(tmp_path, pod=f"train-{rank}", rank=rank, launched=launched)
    return Agent(dataclasses.replace(config, probe_port=0, probe_host="127.0.0.1"), fake)


def two_and_a_spare() -> FakeApi:
    """A gang of two at the open barrier of epoch 0, and its spare, worker 2, in pod train-2."""
    fake = FakeApi(epoch=0)
    fake.set_status(worldSize=2, dropped=[2], barrierEpoch=0)
    fake.add_pod("train-2")
    return fake


@pytest.mark.parametrize(
    ("rank", "world"),
    [
        (2, {"worldSize": 2, "dropped": [2]}),  # a spare
        (3, {"worldSize": 3, "dropped": []}),  # a surplus worker of a shrink to 3
    ],
)
async def test_a_pod_mode_worker_outside_the_world_opens_its_probe_for_a_launcher_that_holds(
    tmp_path: pathlib.Path, rank: int, world: dict[str, Any]
) -> None:
    """A probe kept shut would fail past its failureThreshold while the spare idles: the
    kubelet would restart the sidecar in a loop. Open, the kubelet starts the launcher, which
    reads the world file and starts nothing."""
    fake = FakeApi(epoch=4)
    fake.set_status(**world)
    fake.add_pod(f"train-{rank}")
    a = spare_agent(tmp_path, fake, rank)
    async with running(a) as task:
        port = await asyncio.wait_for(a.probe_port(), DEADLINE)
        await until(a, at(Step.AT_BARRIER, 4))
        assert (await fetch(port, BARRIER_PATH))[0] == 503
        fake.set_status(barrierEpoch=4)
        state = await until(a, lambda s: s.probe_open)
        assert (state.step, state.barrier_open) == (Step.WAITING_FOR_EPOCH, False)
        assert (await fetch(port, BARRIER_PATH))[0] == 200
        world_file = read_world_file((a.config.dir / WORLD_FILE).read_text())
        assert world_file == {"GANGJOB_EPOCH": "4"}
        assert outside_world(world_file, 4)
        assert (a.config.dir / EPOCH_FILE).read_text() == "4\n"
        fake.set_status(epoch=5)  # the gang moves on: the pod restarts in place, as every pod
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE


async def test_a_pod_mode_spare_that_joins_the_world_restarts_in_place_and_gets_its_rank(
    tmp_path: pathlib.Path,
) -> None:
    fake = two_and_a_spare()
    spare = spare_agent(tmp_path, fake, 2)
    async with running(spare) as task:
        await until(spare, lambda s: s.probe_open)
        fake.set_status(epoch=1, dropped=[1])  # spare 2 takes worker 1's place
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    # The kubelet restarted every container of the pod: a new agent, the same directory.
    member = spare_agent(tmp_path, fake, 2)
    async with running(member):
        await until(member, at(Step.AT_BARRIER, 1))
        assert not member.state.probe_open
        fake.set_status(barrierEpoch=1)
        await until(member, lambda s: s.barrier_open and s.probe_open)
        world_file = read_world_file((member.config.dir / WORLD_FILE).read_text())
        assert (world_file["RANK"], world_file["WORLD_SIZE"]) == ("1", "2")
        assert not outside_world(world_file, 1)
    assert fake.annotations("train-2")[ANNOTATION_EPOCH] == "1"


async def test_a_pod_mode_spare_without_the_launcher_keeps_its_probe_shut(
    tmp_path: pathlib.Path,
) -> None:
    """Its trainer would start with the pod's own environment: nothing holds it but the
    probe."""
    fake = two_and_a_spare()
    a = spare_agent(tmp_path, fake, 2, launched=False)
    async with running(a):
        port = await asyncio.wait_for(a.probe_port(), DEADLINE)
        await until(a, at(Step.WAITING_FOR_EPOCH, 0))
        assert (await fetch(port, BARRIER_PATH))[0] == 503
        assert not (a.config.dir / WORLD_FILE).exists()


async def test_a_pod_mode_spare_releases_its_launcher_when_the_job_finishes(
    tmp_path: pathlib.Path,
) -> None:
    fake = two_and_a_spare()
    a = spare_agent(tmp_path, fake, 2)
    async with running(a) as task:
        await until(a, lambda s: s.probe_open)
        fake.set_status(phase="Succeeded")
        await polled(lambda: (a.config.dir / FINISHED_FILE).exists())
        assert not task.done()  # idle until the kubelet stops the pod
        assert a.state.last_exit is None  # a spare reports no exit


def _held_launcher(tmp_path: pathlib.Path, script: str) -> subprocess.Popen[str]:
    """`agent launch` of a spare at epoch 0; returns once it said it holds."""
    (tmp_path / WORLD_FILE).write_text(world_file_text(outside_world_env(0)))
    (tmp_path / EPOCH_FILE).write_text("0\n")
    env = {**os.environ, "GANGJOB_NAME": "llama", "GANGJOB_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "launch", "--", "sh", "-c", script],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "outside the world of epoch 0 (a spare): no trainer started" in line, line
    return proc


def test_a_spares_launcher_starts_nothing_and_ends_when_the_job_finishes(
    tmp_path: pathlib.Path,
) -> None:
    proc = _held_launcher(tmp_path, "echo started")
    (tmp_path / FINISHED_FILE).write_text("1\n")
    out, _ = proc.communicate(timeout=DEADLINE)
    assert (proc.returncode, out) == (0, "")
    assert not (tmp_path / TRAINER_EXIT_FILE).exists()


def test_a_spares_launcher_ends_at_once_on_sigterm(tmp_path: pathlib.Path) -> None:
    """As the container's PID 1 it would otherwise ignore the kubelet's SIGTERM until the
    SIGKILL, and hold up the pod's restart in place by the grace period."""
    proc = _held_launcher(tmp_path, "echo started")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=DEADLINE)
    assert (proc.returncode, out) == (0, "")


def test_a_spares_launcher_launches_at_a_later_epoch_that_has_it(tmp_path: pathlib.Path) -> None:
    """Only if its sidecar restarted alone and arrived at a later epoch (the pod did not
    restart): the launcher runs the trainer with that epoch's world."""
    proc = _held_launcher(tmp_path, 'echo "run $RANK of $WORLD_SIZE at $GANGJOB_EPOCH"; exit 3')
    (tmp_path / WORLD_FILE).write_text(world_file_text(epoch_env(1, 1, 2)))
    (tmp_path / EPOCH_FILE).write_text("1\n")
    out, _ = proc.communicate(timeout=DEADLINE)
    assert (proc.returncode, out) == (3, "run 1 of 2 at 1\n")


def test_the_world_file_of_a_worker_outside_the_world_names_only_its_epoch() -> None:
    assert outside_world({"GANGJOB_EPOCH": "4"}, 4)
    assert not outside_world({"GANGJOB_EPOCH": "3"}, 4)  # another epoch's: says nothing
    assert not outside_world({}, 4)  # none (not elastic): the pod's environment stands
    assert not outside_world(epoch_env(4, 0, 2), 4)
