"""Unit tests of controller.podspec: the headless Service and the worker pods of a gang."""

from typing import Any

import pytest

from api.v1alpha1 import GangJobStatus, RestartMode
from controller.podspec import (
    apply_restart_mode,
    build_pod,
    build_service,
    master_addr,
    pod_name,
)
from controller.views import PodView
from tests.unit.builders import JOB_NAME, JOB_UID, NAMESPACE, TEMPLATE, make_job, with_status

AGENT = "localhost/gangjob-agent:dev"
OWNER = {
    "apiVersion": "gangjob.io/v1alpha1",
    "kind": "GangJob",
    "name": JOB_NAME,
    "uid": JOB_UID,
    "controller": True,
    "blockOwnerDeletion": True,
}


def env_of(pod: dict[str, Any], container: str) -> list[dict[str, Any]]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    env: list[dict[str, Any]] = found.get("env", [])
    return env


def test_service() -> None:
    service = build_service(make_job(master_port=1234))
    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": JOB_NAME,
            "namespace": NAMESPACE,
            "labels": {"gangjob.io/name": JOB_NAME},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"gangjob.io/name": JOB_NAME},
            "ports": [{"name": "rendezvous", "port": 1234, "targetPort": 1234, "protocol": "TCP"}],
        },
    }


def test_worker_pod() -> None:
    job = with_status(make_job(replicas=4), GangJobStatus(epoch=3))
    pod = build_pod(job, 2, AGENT)
    meta = pod["metadata"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert meta["name"] == pod_name(JOB_NAME, 2) == "llama-2"
    assert meta["namespace"] == NAMESPACE
    assert meta["labels"] == {"team": "ml", "gangjob.io/name": JOB_NAME, "gangjob.io/rank": "2"}
    assert meta["annotations"] == {"note": "x", "gangjob.io/created-epoch": "3"}
    assert meta["ownerReferences"] == [OWNER]
    spec = pod["spec"]
    assert spec["hostname"] == "llama-2"
    assert spec["subdomain"] == JOB_NAME
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"gpu": "true"}
    # Ours first (and the user's RANK replaced), so the user's env may refer to $(RANK).
    assert env_of(pod, "trainer") == [
        {"name": "MASTER_ADDR", "value": "llama-0.llama"},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "WORLD_SIZE", "value": "4"},
        {"name": "RANK", "value": "2"},
        {"name": "GANGJOB_NAME", "value": JOB_NAME},
        {"name": "LR", "value": "0.1"},
    ]
    assert env_of(pod, "logger") == []


def test_worker_pod_parses_back_as_the_worker() -> None:
    view = PodView.from_pod(build_pod(make_job(), 1, AGENT))
    assert view.rank == 1
    assert view.controller_uid == JOB_UID
    assert view.created_epoch == 0
    assert view.arrived_epoch is None


def test_master_addr_goes_through_the_headless_service() -> None:
    assert master_addr("llama") == "llama-0.llama"


def test_trainer_container_named() -> None:
    pod = build_pod(make_job(trainerContainer="logger"), 0, AGENT)
    assert [e["name"] for e in env_of(pod, "logger")][:4] == [
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
    ]
    assert env_of(pod, "trainer") == TEMPLATE["spec"]["containers"][0]["env"]


def test_template_restart_policy_kept() -> None:
    job = make_job()
    job.spec.template["spec"]["restartPolicy"] = "OnFailure"
    assert build_pod(job, 0, AGENT)["spec"]["restartPolicy"] == "OnFailure"


def test_protocol_annotations_of_the_template_are_dropped() -> None:
    """A template cannot make a fresh worker look arrived or report a fake exit."""
    job = make_job()
    job.spec.template["metadata"]["annotations"] = {
        "gangjob.io/epoch": "5",
        "gangjob.io/exit": "5:1",
        "gangjob.io/created-epoch": "5",
        "keep": "me",
    }
    assert build_pod(job, 0, AGENT)["metadata"]["annotations"] == {
        "keep": "me",
        "gangjob.io/created-epoch": "0",
    }


def test_controller_labels_win() -> None:
    job = make_job()
    job.spec.template["metadata"]["labels"] = {"gangjob.io/rank": "7", "gangjob.io/name": "x"}
    labels = build_pod(job, 0, AGENT)["metadata"]["labels"]
    assert labels == {"gangjob.io/name": JOB_NAME, "gangjob.io/rank": "0"}


def test_pods_share_nothing_with_the_template() -> None:
    job = make_job()
    first, second = build_pod(job, 0, AGENT), build_pod(job, 1, AGENT)
    first["spec"]["containers"][0]["image"] = "changed"
    first["spec"]["nodeSelector"]["gpu"] = "changed"
    assert second["spec"]["containers"][0]["image"] == "trainer:1"
    assert job.spec.template == TEMPLATE


def test_template_without_metadata() -> None:
    job = make_job()
    del job.spec.template["metadata"]
    pod = build_pod(job, 0, AGENT)
    assert pod["metadata"]["labels"] == {"gangjob.io/name": JOB_NAME, "gangjob.io/rank": "0"}


def test_a_job_without_uid_cannot_own_pods() -> None:
    job = make_job()
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": None})})
    with pytest.raises(ValueError, match="uid"):
        build_pod(job, 0, AGENT)


@pytest.mark.parametrize("mode", list(RestartMode))
def test_apply_restart_mode_is_a_seam_for_now(mode: RestartMode) -> None:
    job = make_job()
    pod = build_pod(job, 0, AGENT)
    assert apply_restart_mode(pod, job, mode, AGENT) is pod
