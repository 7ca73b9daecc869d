"""Elastic gangs outside the policy (docs/design.md section 3.12): the API's bounds, the
worker pod an elastic job gets, the agent's ranks per epoch and its `world` file, and the
launcher reading it."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.cli import launch_env
from agent.config import Config
from agent.protocol import (
    JobState,
    dense_rank,
    epoch_env,
    in_world,
    read_world_file,
    world_file_text,
)
from agent.watch import newest
from api.failures import FAILURE_CLASSES, FailureClass
from api.v1alpha1 import parse_gangjob
from controller.arrivals.server import state_line
from controller.policy.podspec import build_pod
from tests.unit.builders import job_dict

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


def test_per_role_elastic_is_refused() -> None:
    body = job_dict(2, elastic=ELASTIC)
    spec = body["spec"]
    template = spec.pop("template")
    spec.pop("replicas")
    spec["roles"] = [{"name": "worker", "replicas": 2, "template": template}]
    with pytest.raises(ValidationError, match="per-role elastic is not supported"):
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
