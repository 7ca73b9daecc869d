"""Gang admission on the real 1.36 scheduler (KEP-4671, `localcluster up --gang-scheduling`):
two gangs that each need 60% of the cluster's GPUs, submitted together. With gang scheduling
one runs whole and the other has no pod bound until the first finishes; without it the
scheduler binds pods of both and strands them half-placed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from api.constants import LABEL_NAME
from controller.k8s import GANGJOBS, PODGROUPS, PODS, JsonDict, Kube
from localcluster.cluster import Cluster
from tests.conftest import SIM_OPTIONS
from tests.integration.harness import (
    ControllerProcess,
    controller_kubeconfig,
    gangjob,
    install_crd,
    phase_is,
    watch_job,
)
from tests.waiting import wait_for, wait_for_pods

pytestmark = pytest.mark.integration

GPUS = SIM_OPTIONS.nodes * SIM_OPTIONS.gpus_per_node  # 32
WORKERS = 5
GPUS_PER_WORKER = 4  # a gang: 20 GPUs, 62.5% of the cluster; two never fit together
TIMEOUT = 240  # the machine is shared and loaded: generous, never a sleep


@pytest.fixture
async def controller(
    sim_cluster: Cluster, sim_kube: Kube, namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerProcess]:
    await install_crd(sim_kube)
    ctl = ControllerProcess(
        controller_kubeconfig(sim_cluster), [f"--namespace={namespace}"], tmp_path / "ctl.log"
    )
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        print(ctl.logs()[-3000:])


def gpu_gang(name: str, gang: str) -> JsonDict:
    gpus = {"nvidia.com/gpu": str(GPUS_PER_WORKER)}
    return gangjob(
        name,
        WORKERS,
        scheduling={"gang": gang},
        template={
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "localhost/busybox:dev",
                        "command": ["true"],
                        "resources": {"requests": gpus, "limits": gpus},
                    }
                ]
            }
        },
    )


def bound(pods: list[JsonDict], job: str) -> int:
    return sum(
        1
        for p in pods
        if p["metadata"]["labels"].get(LABEL_NAME) == job and p.get("spec", {}).get("nodeName")
    )


def of(pods: list[JsonDict], job: str) -> list[JsonDict]:
    return [p for p in pods if p["metadata"]["labels"].get(LABEL_NAME) == job]


async def succeed(kube: Kube, ns: str, pod: JsonDict) -> None:
    """What the kubelet reports when every container of a worker exited 0."""
    statuses: list[dict[str, Any]] = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": "2026-01-01T00:00:00Z",
                    "finishedAt": "2026-01-01T00:00:01Z",
                }
            },
        }
        for c in pod["spec"]["containers"]
    ]
    body = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
    await kube.patch_status(PODS, pod["metadata"]["name"], body, ns)


def gang_condition(job: JsonDict) -> dict[str, str]:
    conds = {c["type"]: c for c in job.get("status", {}).get("conditions", [])}
    return dict(conds.get("GangScheduling", {}))


async def test_with_gang_scheduling_one_gang_runs_whole_and_the_other_waits_unbound(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    assert 2 * WORKERS * GPUS_PER_WORKER > GPUS >= WORKERS * GPUS_PER_WORKER
    for name in ("a", "b"):
        await sim_kube.create(GANGJOBS, gpu_gang(name, "Auto"), namespace)

    def one_whole(pods: list[JsonDict]) -> bool:
        return len(pods) == 2 * WORKERS and WORKERS in (bound(pods, "a"), bound(pods, "b"))

    pods = await wait_for_pods(sim_kube, namespace, one_whole, TIMEOUT, "one gang bound whole")
    first, second = ("a", "b") if bound(pods, "a") == WORKERS else ("b", "a")
    # The scheduler tried the second gang as a whole and found it does not fit: none of its
    # pods was bound, though 12 GPUs are free (3 of its 5 workers would fit).
    group = await wait_for(
        sim_kube,
        PODGROUPS,
        f"{second}-of-{WORKERS}",
        namespace,
        lambda g: any(
            c["type"] == "PodGroupScheduled" and c["status"] == "False"
            for c in g.get("status", {}).get("conditions", [])
        ),
        TIMEOUT,
        "PodGroupScheduled=False",
    )
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": WORKERS}}
    pods = (await sim_kube.list(PODS, namespace)).items
    assert bound(pods, second) == 0
    assert bound(pods, first) == WORKERS
    for pod in of(pods, second):
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"{second}-of-{WORKERS}"}
    job = await sim_kube.get(GANGJOBS, second, namespace)
    assert gang_condition(job)["status"] == "True"
    assert gang_condition(job)["reason"] == "PodGroupGangPolicy"

    # The first gang finishes; its GPUs are free and the second is placed whole.
    for pod in of(pods, first):
        await succeed(sim_kube, namespace, pod)
    await watch_job(sim_kube, namespace, first, phase_is("Succeeded"), TIMEOUT, "Succeeded")
    await wait_for_pods(
        sim_kube,
        namespace,
        lambda pods: bound(pods, second) == WORKERS,
        TIMEOUT,
        f"gang {second} bound whole",
    )


async def test_without_gang_scheduling_both_gangs_are_placed_in_part(
    sim_kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    for name in ("a", "b"):
        await sim_kube.create(GANGJOBS, gpu_gang(name, "Off"), namespace)
    fits = GPUS // GPUS_PER_WORKER  # 8 workers of the 10

    def full(pods: list[JsonDict]) -> bool:
        return len(pods) == 2 * WORKERS and bound(pods, "a") + bound(pods, "b") == fits

    pods = await wait_for_pods(sim_kube, namespace, full, TIMEOUT, f"{fits} workers bound")
    counts = sorted((bound(pods, "a"), bound(pods, "b")))
    # 8 = 5 + 3 or 4 + 4: a gang holds GPUs for workers that wait for ones that never start.
    assert 0 < counts[0] < WORKERS
    job = await sim_kube.get(GANGJOBS, "a", namespace)
    assert gang_condition(job)["reason"] == "GangSchedulingOff"
