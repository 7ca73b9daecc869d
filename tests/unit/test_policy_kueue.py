"""Unit tests of controller.policy.kueue: a queued GangJob's workers are one Kueue pod group."""

from api.constants import (
    KUEUE_POD_GROUP_NAME_LABEL,
    KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION,
    KUEUE_QUEUE_NAME_LABEL,
)
from api.v1alpha1 import parse_gangjob
from controller.policy.podspec import build_pod
from tests.unit.builders import JOB_NAME, job_dict

AGENT = "localhost/gangjob-agent:dev"


def test_a_queued_gangjob_makes_every_worker_a_member_of_one_pod_group() -> None:
    body = job_dict(replicas=3)
    body["metadata"]["labels"] = {KUEUE_QUEUE_NAME_LABEL: "team-a"}
    job = parse_gangjob(body)
    pods = [build_pod(job, rank, AGENT) for rank in range(3)]
    for pod in pods:
        meta = pod["metadata"]
        assert meta["labels"][KUEUE_QUEUE_NAME_LABEL] == "team-a"
        assert meta["labels"][KUEUE_POD_GROUP_NAME_LABEL] == JOB_NAME
        assert meta["annotations"][KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION] == "3"


def test_the_group_labels_win_over_the_templates() -> None:
    body = job_dict(replicas=2)
    body["metadata"]["labels"] = {KUEUE_QUEUE_NAME_LABEL: "team-a"}
    body["spec"]["template"]["metadata"] = {
        "labels": {KUEUE_QUEUE_NAME_LABEL: "other", KUEUE_POD_GROUP_NAME_LABEL: "mine"},
        "annotations": {KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION: "9"},
    }
    pod = build_pod(parse_gangjob(body), 0, AGENT)
    assert pod["metadata"]["labels"][KUEUE_QUEUE_NAME_LABEL] == "team-a"
    assert pod["metadata"]["labels"][KUEUE_POD_GROUP_NAME_LABEL] == JOB_NAME
    assert pod["metadata"]["annotations"][KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION] == "2"


def test_an_unqueued_gangjob_leaves_kueue_alone() -> None:
    pod = build_pod(parse_gangjob(job_dict(replicas=2)), 1, AGENT)
    kueue_keys = {k for k in (*pod["metadata"]["labels"], *pod["metadata"]["annotations"])
                  if k.startswith("kueue.x-k8s.io/")}  # fmt: skip
    assert kueue_keys == set()
