"""Failure rules on the trainer's termination message on a real kubelet: the trainer writes its
error to /dev/termination-log (or only prints it, with `terminationMessagePolicy:
FallbackToLogsOnError`), the kubelet puts it in the container's status, and the controller's
`onMessagePatterns` rule fails the job, quoting it."""

from __future__ import annotations

import pytest

from api import builders
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.tools import ControllerProcess
from tests.integration.harness import watch_job

pytestmark = pytest.mark.e2e

ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"
# Rank 1 fails at once with the error, as a trainer's last words; the others train.
TRAINER = r"""
trap 'exit 0' TERM
if [ "$RANK" = 1 ]; then
  echo "step 1"; echo "$ERROR" > "$SINK"; exit 1
fi
while :; do sleep 1; done
"""


def gangjob(name: str, sink: str) -> JsonDict:
    trainer = {
        "imagePullPolicy": "Never",
        "env": [{"name": "ERROR", "value": ERROR}, {"name": "SINK", "value": sink}],
    }
    if sink == "/dev/stdout":
        trainer["terminationMessagePolicy"] = "FallbackToLogsOnError"
    rules = [{"action": "FailJob", "onMessagePatterns": ["CUDA error: an illegal memory access"]}]
    return builders.gangjob(
        name, 2,
        image="localhost/busybox:dev", command=["sh", "-c", TRAINER], container=trainer,
        pod_spec={"terminationGracePeriodSeconds": 5},
        failure_rules=rules,
    )  # fmt: skip


@pytest.mark.parametrize("sink", ["/dev/termination-log", "/dev/stdout"])
async def test_a_termination_message_rule_fails_the_job(
    node_kube: Kube, node_namespace: str, controller: ControllerProcess, sink: str
) -> None:
    ns = node_namespace
    await node_kube.create(GANGJOBS, gangjob("cuda", sink), ns)
    job = await watch_job(
        node_kube, ns, "cuda",
        lambda j: j.get("status", {}).get("phase") in ("Failed", "Succeeded"),
        timeout=120, what="finished",
    )  # fmt: skip
    failed = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
    assert job["status"]["phase"] == "Failed", job["status"]
    assert failed["reason"] == "FailurePolicy"
    assert "spec.failurePolicy.rules[0] fails the job" in failed["message"]
    assert f"message: {ERROR}" in failed["message"]
    assert job["status"]["epoch"] == 0
