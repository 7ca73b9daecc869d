"""`gangjob logs -f` through the real kubelet: the log of one rank followed across an in-place
gang restart (a Pod-mode restart starts a new container), ending when the job does."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from controller.k8s import GANGJOBS, Kube
from localcluster.cluster import Cluster
from localcluster.tools import ControllerProcess
from tests.integration.harness import watch_job

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
    job = await watch_job(
        node_kube, ns, "logs",
        lambda j: (j.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout=180, what="finished",
    )  # fmt: skip
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
