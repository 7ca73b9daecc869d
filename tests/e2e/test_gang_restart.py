"""The restart protocol on a real kubelet: real containers exit, the kubelet applies the restart
rules (KEP-5307/5532), the agent image runs in every pod, the controller (a subprocess with the
RBAC and admission policy of manifests/) restarts the gang in place."""

from __future__ import annotations

from typing import Any

import pytest

from api import builders
from controller.k8s import GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import ControllerProcess, kubectl
from tests.integration.harness import gang_pods, watch_job

pytestmark = pytest.mark.e2e

# Rank 1's trainer fails once (exit $CRASH_CODE), then trains; every trainer says which epoch
# it runs at. It leaves on SIGTERM at once, as a trainer should (the kubelet's RestartAllContainers
# stops the other containers with SIGTERM).
TRAINER = r"""
trap 'exit 0' TERM
if [ "$RANK" = 1 ] && [ ! -f /scratch/crashed ]; then
  touch /scratch/crashed; echo "rank 1 crashing with $CRASH_CODE"; exit "$CRASH_CODE"
fi
echo "training at epoch $(cat $GANGJOB_DIR/epoch)"
while :; do sleep 1; done
"""


def gangjob(name: str, mode: str, crash_code: int = 1, **spec: Any) -> JsonDict:
    # Process mode runs the agent inside the trainer's container: that image needs python3.
    image = AGENT_IMAGE if mode == "Process" else "localhost/busybox:dev"
    return builders.gangjob(
        name, 3,
        image=image, command=["sh", "-c", TRAINER],
        container={
            "imagePullPolicy": "Never",
            "env": [{"name": "CRASH_CODE", "value": str(crash_code)}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        },
        pod_spec={
            "terminationGracePeriodSeconds": 5,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
        restart_mode=mode,
        spec=spec,
    )  # fmt: skip


def at_epoch(epoch: int) -> Any:
    def check(job: JsonDict) -> bool:
        st = job.get("status", {})
        return bool(
            st.get("epoch") == epoch
            and st.get("barrierEpoch") == epoch
            and st.get("workers", {}).get("arrived") == 3
        )

    return check


def uids(pods: list[JsonDict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


@pytest.mark.parametrize("mode", ["Pod", "Process"])
async def test_a_trainer_that_exits_once_restarts_the_gang_in_place(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
    mode: str,
) -> None:
    ns = node_namespace
    await node_kube.create(GANGJOBS, gangjob("ddp", mode), ns)
    # Rank 1 fails on its first run, once the barrier of epoch 0 let the trainers start.
    job = await watch_job(node_kube, ns, "ddp", at_epoch(1), timeout=120, what="at epoch 1")
    st = job["status"]
    assert st["restarts"]["total"] == 1
    assert st["restarts"]["inPlace"] == 1
    last = st["lastRestart"]
    assert last["epoch"] == 1
    assert last["trigger"]["worker"] == 1
    assert last["trigger"]["class"] == "ProcessExit"
    assert last["recreated"] == []
    assert 0 < last["durationSeconds"] < 60
    pods = await gang_pods(node_kube, ns, "ddp")
    assert len(pods) == 3
    created = {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in pods}
    assert len(set(uids(pods).values())) == 3
    # The gang was placed whole through its PodGroup (the node cluster runs with KEP-4671 gang
    # scheduling), and the in-place restart kept every pod where it was.
    for p in pods:
        assert p["spec"]["schedulingGroup"] == {"podGroupName": "ddp-of-3"}, p["metadata"]["name"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["GangScheduling"]["status"] == "True"
    if mode == "Pod":
        # The whole pod restarted in place, every container of every worker: same pod (UID,
        # creation time), containers run again.
        for p in pods:
            trainer = next(c for c in p["status"]["containerStatuses"] if c["name"] == "trainer")
            assert trainer["restartCount"] >= 1, p["metadata"]["name"]
    else:
        # No kubelet restart at all: the agent ran the training process again in the container.
        for p in pods:
            trainer = next(c for c in p["status"]["containerStatuses"] if c["name"] == "trainer")
            assert trainer["restartCount"] == 0, p["metadata"]["name"]
    # The trainer of every worker reads the epoch it runs at.
    job = await watch_job(
        node_kube, ns, "ddp", lambda j: j["status"].get("phase") == "Running", 60, "Running"
    )
    for name in created:
        log = kubectl(node_cluster, "-n", ns, "logs", name, "-c", "trainer")
        assert "training at epoch 1" in log, (name, log)
    assert {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in pods} == created
    # Every arrival went to the controller directly, each agent showing the token the kubelet
    # projected for it: no pod carries the annotation, and the endpoint took 2 x 3 reports.
    assert all("gangjob.io/epoch" not in p["metadata"].get("annotations", {}) for p in pods)
    assert controller.metric("gangjob_arrival_reports_total", {"result": "accepted"}) >= 6
    assert controller.metric("gangjob_arrival_reports_total", {"result": "unauthorized"}) == 0


async def test_a_non_retriable_exit_code_fails_the_job_with_that_code(
    node_kube: Kube, node_namespace: str, controller: ControllerProcess
) -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]
    body = gangjob("bug", "Pod", crash_code=3, failurePolicy={"rules": rules})
    await node_kube.create(GANGJOBS, body, node_namespace)
    job = await watch_job(
        node_kube, node_namespace, "bug",
        lambda j: j.get("status", {}).get("phase") == "Failed", 120, "Failed",
    )  # fmt: skip
    failed = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
    assert failed["status"] == "True"
    assert "code 3" in failed["message"], failed
    assert job["status"]["epoch"] == 0  # no restart was spent on a bug
