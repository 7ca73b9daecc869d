"""Unit tests of controller.policy.kueue: a queued GangJob's workers are one Kueue pod group."""

from api.constants import (
    KUEUE_POD_FINALIZER,
    KUEUE_POD_GROUP_NAME_LABEL,
    KUEUE_POD_GROUP_TOTAL_COUNT_ANNOTATION,
    KUEUE_QUEUE_NAME_LABEL,
)
from api.v1alpha1 import parse_gangjob
from controller.policy.plan import FinalizerRelease, plan
from controller.policy.podspec import build_pod
from tests.unit.builders import JOB_NAME, job_dict
from tests.unit.gangs import gang, worker

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


def test_a_deleted_worker_loses_kueues_finalizer_and_keeps_the_others() -> None:
    # Kueue lifts it only once the replacement exists, which has the old pod's name.
    going = worker(1, 0, terminating=True)
    going["metadata"].update(finalizers=["example.com/keep", KUEUE_POD_FINALIZER])
    going["metadata"]["resourceVersion"] = "42"
    staying = worker(0, 0)
    staying["metadata"].update(finalizers=[KUEUE_POD_FINALIZER], resourceVersion="41")
    result = plan(gang(replicas=2, pods=[staying, going]))
    assert result.release_finalizers == [
        FinalizerRelease(name="llama-1", resource_version="42", kept=("example.com/keep",))
    ]


def test_no_finalizer_is_released_from_a_pod_without_kueues() -> None:
    going = worker(1, 0, terminating=True)
    going["metadata"].update(finalizers=["example.com/keep"], resourceVersion="42")
    assert plan(gang(replicas=2, pods=[worker(0, 0), going])).release_finalizers == []
