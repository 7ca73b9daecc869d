"""`gangjob logs` through the real kubelet: the log of one rank followed across an in-place
gang restart (a Pod-mode restart starts a new container), ending when the job does; and every
rank's log once the job has finished, its pods kept, stopped (`cleanPodPolicy: None`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from api import builders
from controller.k8s import GANGJOBS, PODS, Kube
from localcluster.cluster import Cluster
from localcluster.tools import ControllerProcess, kubectl
from tests.integration.harness import watch_finished
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

GANGJOB = Path(sys.executable).with_name("gangjob")
# Rank 1 fails once at epoch 0, after a while (so that its log is followed live), while rank 0
# still trains; every rank prints its epoch, read from the file the agent writes when the
# barrier opens.
SCRIPT = (
    'E=$(cat "$GANGJOB_DIR/epoch"); echo "rank $RANK starts at epoch $E"; '
    'if [ "$E" = 0 ]; then '
    '[ "$RANK" = 1 ] && { sleep 4; echo "rank 1 fails"; exit 1; }; sleep 120; fi; '
    'sleep 2; echo "rank $RANK done at epoch $E"'
)


async def test_logs_follow_one_rank_across_an_in_place_restart(
    node_kube: Kube, node_cluster: Cluster, node_namespace: str, controller: ControllerProcess
) -> None:
    ns, kubeconfig = node_namespace, str(node_cluster.kubeconfig)
    submit = await asyncio.create_subprocess_exec(
        str(GANGJOB), "submit", "--kubeconfig", kubeconfig, "-n", ns, "--name", "logs",
        "--image", "localhost/busybox:dev", "--workers", "2", "--", "sh", "-c", SCRIPT,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(submit.communicate(), 60)
    assert (submit.returncode, out.decode().strip()) == (0, "logs")
    logs = await asyncio.create_subprocess_exec(
        str(GANGJOB), "logs", "--kubeconfig", kubeconfig, "-n", ns, "logs", "--rank", "1", "-f",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    job = await watch_finished(node_kube, ns, "logs", 180)
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["restarts"]["inPlace"] == 1, job["status"]
    # `logs -f` ends by itself once the job has ended.
    printed, err = await asyncio.wait_for(logs.communicate(), 120)
    assert logs.returncode == 0, err.decode()
    lines = printed.decode().splitlines()
    assert lines == [
        "rank 1 starts at epoch 0",
        "rank 1 fails",
        "rank 1 starts at epoch 1",
        "rank 1 done at epoch 1",
    ], lines
    await node_kube.delete(GANGJOBS, "logs", ns)


# Rank 0 says its piece and succeeds; rank 1 trains on until it is stopped. `successPolicy:
# Rank0` finishes the job with rank 1 still running.
RANK0_FINISHES = (
    'echo "rank $RANK starts"; '
    'if [ "$RANK" = 0 ]; then sleep 2; echo "rank 0 done"; exit 0; fi; '
    "while :; do sleep 1; done"
)


async def test_a_finished_job_keeps_its_pods_stopped_and_their_logs(
    node_kube: Kube, node_cluster: Cluster, node_namespace: str, controller: ControllerProcess
) -> None:
    ns, kubeconfig, name = node_namespace, str(node_cluster.kubeconfig), "kept"
    job = builders.gangjob(
        name, 2,
        image="localhost/busybox:dev", command=["sh", "-c", RANK0_FINISHES],
        container={"imagePullPolicy": "Never"},
        pod_spec={"terminationGracePeriodSeconds": 5},
        spec={"successPolicy": "Rank0"},
    )  # fmt: skip
    await node_kube.create(GANGJOBS, job, ns)
    done = await watch_finished(node_kube, ns, name, 180)
    assert done["status"]["phase"] == "Succeeded"
    # Rank 1 was running: it is stopped by the kubelet, its pod kept (cleanPodPolicy: None).
    stopped = await wait_for(
        node_kube, PODS, f"{name}-1", ns,
        lambda p: p.get("status", {}).get("phase") == "Failed",
        timeout=120, what="rank 1 stopped",
    )  # fmt: skip
    assert stopped["status"].get("reason") == "DeadlineExceeded", stopped["status"]
    succeeded = await wait_for(
        node_kube, PODS, f"{name}-0", ns,
        lambda p: p.get("status", {}).get("phase") in ("Succeeded", "Failed"),
        timeout=120, what="rank 0 ended",
    )  # fmt: skip
    assert succeeded["status"]["phase"] == "Succeeded"

    async def gangjob_logs(*args: str) -> tuple[int | None, str, str]:
        run = await asyncio.create_subprocess_exec(
            str(GANGJOB), "logs", "--kubeconfig", kubeconfig, "-n", ns, name, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(run.communicate(), 60)
        return run.returncode, out.decode(), err.decode()

    assert await gangjob_logs("--rank", "0") == (0, "rank 0 starts\nrank 0 done\n", "")
    assert await gangjob_logs("--rank", "1", "-f") == (0, "rank 1 starts\n", "")
    # What the demo's closing hint runs.
    assert kubectl(node_cluster, "-n", ns, "logs", f"{name}-1", "-c", "trainer") == (
        "rank 1 starts\n"
    )
    await node_kube.delete(GANGJOBS, name, ns)
