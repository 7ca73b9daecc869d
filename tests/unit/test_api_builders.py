"""api.builders: what it builds parses with the API models and conforms to the CRD's schema, and
each keyword lands where the API reads it."""

from typing import Any

import pytest

from api.builders import gangjob
from api.constants import API_VERSION, KIND
from api.v1alpha1 import FailureAction, RestartMode, parse_gangjob
from tests.unit.test_crd import conforms, schema

RULES = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]


def every_keyword() -> dict[str, Any]:
    return gangjob(
        "llama",
        8,
        namespace="ml",
        labels={"team": "ml"},
        image="trainer:1",
        command=["python", "train.py"],
        container={"env": [{"name": "LR", "value": "0.1"}]},
        pod_labels={"app": "llama"},
        pod_spec={"nodeSelector": {"gpu": "true"}, "terminationGracePeriodSeconds": 5},
        restart_mode=RestartMode.PROCESS,
        max_restarts=3,
        failure_rules=RULES,
        spec={"restart": {"backoffSeconds": 1}, "nodeLoss": {"forceDeleteAfterSeconds": 0}},
    )


@pytest.mark.parametrize(
    "body",
    [
        gangjob("tiny", 1, image="busybox"),
        gangjob("pair", 2, containers=[{"name": "a", "image": "a:1"}, {"name": "b", "image": "b"}]),
        gangjob("copy", 4, template={"spec": {"containers": [{"name": "t", "image": "t:1"}]}}),
        every_keyword(),
    ],
    ids=["image", "containers", "template", "every-keyword"],
)
def test_what_it_builds_parses_and_conforms_to_the_crd(body: dict[str, Any]) -> None:
    job = parse_gangjob(body)
    assert job.spec.replicas == body["spec"]["replicas"]
    assert conforms(body, schema()) == []


def test_each_keyword_lands_where_the_api_reads_it() -> None:
    body = every_keyword()
    assert (body["apiVersion"], body["kind"]) == (API_VERSION, KIND)
    job = parse_gangjob(body)
    assert (job.metadata.name, job.metadata.namespace) == ("llama", "ml")
    assert job.metadata.labels == {"team": "ml"}
    assert job.spec.restart.mode is RestartMode.PROCESS
    assert job.spec.restart.max_restarts == 3
    assert job.spec.restart.backoff_seconds == 1  # merged into restart, not replacing it
    assert job.spec.node_loss.force_delete_after_seconds == 0
    assert job.spec.failure_policy.rules[0].action is FailureAction.FAIL_JOB
    assert job.spec.trainer_container_name == "trainer"
    template = job.spec.effective_roles[0].template
    assert template["metadata"]["labels"] == {"app": "llama"}
    assert template["spec"]["nodeSelector"] == {"gpu": "true"}
    assert template["spec"]["terminationGracePeriodSeconds"] == 5
    assert template["spec"]["containers"] == [
        {
            "name": "trainer",
            "image": "trainer:1",
            "command": ["python", "train.py"],
            "env": [{"name": "LR", "value": "0.1"}],
        }
    ]


def test_unset_keywords_are_left_to_the_api_defaults() -> None:
    body = gangjob("tiny", 1, image="busybox")
    assert body["metadata"] == {"name": "tiny"}
    assert set(body["spec"]) == {"replicas", "template"}


def test_a_template_is_copied_not_shared() -> None:
    template: dict[str, Any] = {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"containers": [{"name": "t"}]},
    }
    body = gangjob("copy", 1, template=template, pod_labels={"b": "2"})
    assert body["spec"]["template"]["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert template["metadata"]["labels"] == {"a": "1"}


def test_what_the_api_rejects_can_still_be_built() -> None:
    body = gangjob("zero", 0, image="busybox", spec={"restart": {"mode": "Teleport"}})
    assert conforms(body, schema()) == [
        ".spec.replicas: below minimum",
        ".spec.restart.mode: not in enum",
    ]


def test_the_trainer_is_built_one_way() -> None:
    with pytest.raises(ValueError, match="not with a template"):
        gangjob("both", 1, image="busybox", containers=[{"name": "t", "image": "t"}])
