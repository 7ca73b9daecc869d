"""A spare on the real kubelet (docs/design.md section 3.12): two workers and a spare in
`Process` mode; worker 1's trainer exits with a code a `RecreateWorker` rule names (a device
gone, as the trainer tells it: the one loss that a test can cause on the only real node), and
the spare, its pod started long before, takes worker 1's rank at the next epoch in its own
container; worker 1's new pod starts its agent and no trainer, the next spare."""

from __future__ import annotations

import pytest

from api import builders
from controller.k8s import CORE_EVENTS, GANGJOBS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import AGENT_IMAGE
from localcluster.tools import ControllerProcess, kubectl
from tests.integration.harness import gang_pods, watch_job

pytestmark = pytest.mark.e2e

LOST = 42
"""The exit code of a trainer whose device is gone: recreated, by the job's rule."""

# Every run says what it was given; a run whose "device" the test takes away (the file
# /tmp/lost) exits 42. A trainer leaves on SIGTERM at once, as the agent stops it so.
TRAINER = r"""
trap 'exit 0' TERM
echo "run: rank $RANK of $WORLD_SIZE at epoch $GANGJOB_EPOCH in $HOSTNAME"
while :; do [ -f /tmp/lost ] && exit 42; sleep 1; done
"""


def spare_job() -> JsonDict:
    return builders.gangjob(
        "sp", 2,
        image=AGENT_IMAGE, command=["sh", "-c", TRAINER],
        container={"imagePullPolicy": "Never"},
        pod_spec={"terminationGracePeriodSeconds": 5},
        restart_mode="Process",
        spec={
            "elastic": {"minReplicas": 1, "maxReplicas": 2, "spares": 1},
            "failurePolicy": {
                "rules": [
                    {
                        "action": "RecreateWorker",
                        "onExitCodes": {
                            "containerName": "trainer", "operator": "In", "values": [LOST],
                        },
                    }
                ]
            },
        },
    )  # fmt: skip


def runs(cluster: Cluster, ns: str, pod: str) -> list[str]:
    log = kubectl(cluster, "-n", ns, "logs", pod, "-c", "trainer")
    return [line for line in log.splitlines() if line.startswith("run: ")]


async def test_a_spare_takes_a_recreated_workers_rank_in_its_own_container(
    node_kube: Kube,
    node_namespace: str,
    node_cluster: Cluster,
    controller: ControllerProcess,
) -> None:
    ns = node_namespace
    await node_kube.create(GANGJOBS, spare_job(), ns)

    def running(j: JsonDict) -> bool:
        # The workers past the barrier of epoch 0, the spare arrived there too.
        st = j.get("status", {})
        return bool(st.get("barrierEpoch") == 0 and st.get("workers", {}).get("arrived") == 3)

    job = await watch_job(node_kube, ns, "sp", running, 180, "running with its spare")
    assert (job["status"]["worldSize"], job["status"]["dropped"]) == (2, [2])
    before = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, "sp")}
    kubectl(node_cluster, "-n", ns, "exec", "sp-1", "-c", "trainer", "--", "touch", "/tmp/lost")

    def swapped(j: JsonDict) -> bool:
        st = j.get("status", {})
        return bool(st.get("barrierEpoch") == 1 and st.get("dropped") == [1])

    job = await watch_job(node_kube, ns, "sp", swapped, 180, "spare 2 in worker 1's place")
    st = job["status"]
    assert st["worldSize"] == 2
    last = st["lastRestart"]
    assert last["trigger"]["action"] == "RecreateWorker"
    assert last["trigger"]["worker"] == 1
    assert last["trigger"]["detail"].endswith("; spare 2 takes worker 1's place")
    assert last["recreated"] == [1]
    assert st["restarts"]["total"] == 1

    # Worker 1's new pod: its agent up and arrived, no trainer run; the next spare.
    def new_spare(j: JsonDict) -> bool:
        return bool((j.get("status") or {}).get("workers", {}).get("arrived") == 3)

    await watch_job(node_kube, ns, "sp", new_spare, 120, "the new spare arrived")
    pods = {p["metadata"]["name"]: p for p in await gang_pods(node_kube, ns, "sp")}
    assert set(pods) == {"sp-0", "sp-1", "sp-2"}
    assert pods["sp-1"]["metadata"]["uid"] != before["sp-1"]["metadata"]["uid"]
    # The spare and worker 0 are the pods they were: in place, in their containers.
    for name in ("sp-0", "sp-2"):
        assert pods[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
        statuses = pods[name]["status"]["containerStatuses"]
        trainer = next(c for c in statuses if c["name"] == "trainer")
        assert trainer["restartCount"] == 0, name
    assert runs(node_cluster, ns, "sp-0") == [
        "run: rank 0 of 2 at epoch 0 in sp-0",
        "run: rank 0 of 2 at epoch 1 in sp-0",
    ]
    # The spare ran nothing at epoch 0 and worker 1's rank at epoch 1.
    assert runs(node_cluster, ns, "sp-2") == ["run: rank 1 of 2 at epoch 1 in sp-2"]
    assert runs(node_cluster, ns, "sp-1") == []
    log = kubectl(node_cluster, "-n", ns, "logs", "sp-1", "-c", "trainer")
    assert "is outside the world of epoch 1 (a spare)" in log
    events = (await node_kube.list(CORE_EVENTS, ns)).items
    assert [e["message"] for e in events if e["reason"] == "SpareTookOver"] == [
        "Spare 2 takes worker 1's place at epoch 1; worker 1's new pod will be a spare"
    ]
