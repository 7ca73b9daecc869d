"""The README's "On your own cluster" path, step by step as a newcomer types it, on the real
kubelet: `make install`, `make run` in the background with the arrival address the README
gives for the local `node` cluster, `kubectl apply -f` of a GangJob whose worker fails once,
then `make uninstall`. The gang must restart in place and end Succeeded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from api import builders
from api.constants import ANNOTATION_EPOCH, LABEL_NAME
from controller.k8s import PODS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.node import Bridge
from localcluster.procs import free_port
from localcluster.tools import REPO, kubectl
from tests.integration.harness import phase_is, watch_job

pytestmark = pytest.mark.e2e

# Every rank reads the epoch the agent wrote. At epoch 0 rank 1 fails (exit 1, retriable) and
# the others train until the gang restarts; at epoch 1 every rank ends its training (exit 0).
TRAINER = r"""
trap 'exit 0' TERM
epoch=$(cat "$GANGJOB_DIR/epoch")
echo "rank $RANK at epoch $epoch"
if [ "$epoch" = 0 ]; then
  if [ "$RANK" = 1 ]; then exit 1; fi
  while :; do sleep 1; done
fi
"""

JOB: JsonDict = builders.gangjob(
    "fails-once",
    2,
    image="localhost/busybox:dev",
    command=["sh", "-c", TRAINER],
    container={"imagePullPolicy": "Never"},
    pod_spec={"terminationGracePeriodSeconds": 5},
)

MAKE_TIMEOUT = 300  # `make` runs `setup` first: an up-to-date .venv takes no time


def make(cluster: Cluster, *args: str) -> str:
    """`make <args>` from the repository root, with KUBECONFIG pointing at ``cluster``."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    res = subprocess.run(
        ["make", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=MAKE_TIMEOUT
    )
    assert res.returncode == 0, f"make {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def pinned_kubectl(cluster: Cluster, *args: str) -> str:
    """`.venv/bin/localcluster kubectl -- <args>` with KUBECONFIG pointing at ``cluster``, as
    the README has it."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    res = subprocess.run(
        [str(REPO / ".venv" / "bin" / "localcluster"), "kubectl", "--", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, f"kubectl {' '.join(args)}:\n{res.stderr}"
    return res.stdout


class MakeRun:
    """`make run ...` in the background, in a session of its own: stopped by its process group
    (make and the controller it runs), whose id is make's PID."""

    def __init__(self, cluster: Cluster, log: Path) -> None:
        self.health = f"127.0.0.1:{free_port()}"
        self.metrics = f"127.0.0.1:{free_port()}"
        # The address the README gives: the host address that `localcluster status` shows.
        gateway = Bridge.for_slot(cluster.ports.slot).gateway
        args = [
            f"ARRIVAL_ADDRESS={gateway}:{free_port()}",
            f"METRICS_ADDRESS={self.metrics}",
            f"HEALTH_ADDRESS={self.health}",
        ]
        self.log = log
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(
                ["make", "run", *args],
                cwd=REPO,
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def ready(self) -> bool:
        """/readyz answers 200 once the controller's caches have synced."""
        try:
            with urllib.request.urlopen(f"http://{self.health}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def metric(self, sample: str) -> float:
        """The value of one sample of /metrics, named with its labels as exposed (0 if absent)."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as resp:
            lines = resp.read().decode().splitlines()
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(sample + " "))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def wait_ready(run: MakeRun, deadline_s: float = 120) -> None:
    """Until the controller of `make run` is ready; its health port is on this host, not
    cluster state, so there is nothing to watch."""
    deadline = time.monotonic() + deadline_s
    while not run.ready():
        assert run.proc.poll() is None, f"make run exited:\n{run.logs()}"
        assert time.monotonic() < deadline, f"make run not ready:\n{run.logs()}"
        time.sleep(0.2)


class PodsSeen:
    """Every pod of a gang the apiserver reported while the test ran (from a watch, so that a
    pod recreated and deleted between two looks is seen too): their UIDs, and how often each
    worker's trainer was restarted."""

    def __init__(self) -> None:
        self.uids: dict[str, set[str]] = {}
        self.trainer_restarts: dict[str, int] = {}
        self.annotated: set[str] = set()  # pods that carried the arrival annotation

    async def watch(self, kube: Kube, ns: str, job: str) -> None:
        stream = kube.watch(PODS, ns, label_selector=f"{LABEL_NAME}={job}")
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                meta = ev.object["metadata"]
                self.uids.setdefault(meta["name"], set()).add(meta["uid"])
                if ANNOTATION_EPOCH in meta.get("annotations", {}):
                    self.annotated.add(meta["name"])
                for c in ev.object.get("status", {}).get("containerStatuses", []):
                    if c["name"] == "trainer":
                        count = max(self.trainer_restarts.get(meta["name"], 0), c["restartCount"])
                        self.trainer_restarts[meta["name"]] = count


async def test_the_readme_path_restarts_a_failed_worker_in_place(
    node_cluster: Cluster, node_kube: Kube, node_namespace: str, tmp_path: Path
) -> None:
    ns = node_namespace
    make(node_cluster, "install")
    run = MakeRun(node_cluster, tmp_path / "make-run.log")
    seen = PodsSeen()
    watching: asyncio.Task[None] | None = None
    try:
        wait_ready(run)
        # A watch from no resourceVersion starts with every pod that exists then: this one
        # starts at the first await below, milliseconds after the apply, and the gang's pods
        # live for seconds.
        watching = asyncio.create_task(seen.watch(node_kube, ns, "fails-once"))
        manifest = tmp_path / "fails-once.yaml"
        manifest.write_text(yaml.safe_dump(JOB))
        pinned_kubectl(node_cluster, "-n", ns, "apply", "-f", str(manifest))
        job = await watch_job(node_kube, ns, "fails-once", phase_is("Succeeded"), 180, "Succeeded")
        accepted = run.metric('gangjob_arrival_reports_total{result="accepted"}')
    finally:
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        run.stop()
        print(run.logs())
    st = job["status"]
    assert st["epoch"] == 1
    assert st["barrierEpoch"] == 1
    assert st["restarts"]["total"] == 1
    assert st["restarts"]["inPlace"] == 1
    last = st["lastRestart"]
    assert last["epoch"] == 1
    assert last["trigger"]["worker"] == 1
    assert last["trigger"]["class"] == "ProcessExit"
    assert last["recreated"] == []
    assert last["durationSeconds"] > 0
    # Restarted in place: one pod per worker for the whole run (the same UID throughout), and
    # every worker's trainer ran again.
    assert {name: len(u) for name, u in seen.uids.items()} == {
        "fails-once-0": 1,
        "fails-once-1": 1,
    }
    assert all(seen.trainer_restarts[name] >= 1 for name in seen.uids), seen.trainer_restarts
    # The agents reported their arrivals to `make run` at the address the README gives, and
    # never fell back to annotating their pods.
    assert accepted >= 4, run.logs()  # 2 workers, at epochs 0 and 1
    assert seen.annotated == set()
    make(node_cluster, "uninstall")
    for kind, name in (
        ("crd", "gangjobs.gangjob.io"),
        ("clusterrole", "gangjob-worker"),
        ("validatingadmissionpolicy", "gangjob-worker-pods"),
        ("validatingadmissionpolicybinding", "gangjob-worker-pods"),
        ("validatingadmissionpolicy", "gangjob-queued-size"),
        ("validatingadmissionpolicybinding", "gangjob-queued-size"),
    ):
        got = kubectl(node_cluster, "get", kind, "--ignore-not-found", "-o", "name", name)
        assert got.strip() == "", f"make uninstall left {kind}/{name}"


async def test_the_readme_path_says_why_a_gang_is_stuck_without_the_worker_role(
    node_cluster: Cluster, node_kube: Kube, node_namespace: str, tmp_path: Path
) -> None:
    """The issue's newcomer: the ClusterRole `gangjob-worker` is not there, every agent gets
    403, and the GangJob says so within a minute (so does `make run`'s log, at start-up)."""
    ns = node_namespace
    make(node_cluster, "install")
    kubectl(node_cluster, "delete", "clusterrole", "gangjob-worker")
    run = MakeRun(node_cluster, tmp_path / "make-run.log")
    try:
        wait_ready(run)
        # Said once the caches are synced, which may come a moment after the health port
        # answers ready: wait for the line, bounded.
        deadline = time.monotonic() + 30
        while "ClusterRole gangjob-worker not found" not in run.logs():
            assert time.monotonic() < deadline, f"no warning about the role:\n{run.logs()}"
            await asyncio.sleep(0.2)
        manifest = tmp_path / "fails-once.yaml"
        manifest.write_text(yaml.safe_dump(JOB))
        pinned_kubectl(node_cluster, "-n", ns, "apply", "-f", str(manifest))

        def stuck_on_rbac(job: JsonDict) -> bool:
            conditions = (job.get("status") or {}).get("conditions") or []
            return any(
                c["type"] == "Stuck"
                and c["status"] == "True"
                and c["reason"] == "WorkerRBACMissing"
                for c in conditions
            )

        job = await watch_job(node_kube, ns, "fails-once", stuck_on_rbac, 60, "Stuck on RBAC")
        described = pinned_kubectl(node_cluster, "-n", ns, "describe", "gangjob", "fails-once")
    finally:
        run.stop()
        print(run.logs())
    stuck = next(c for c in job["status"]["conditions"] if c["type"] == "Stuck")
    assert f"ServiceAccount {ns}/gangjob-worker, which may not get pods" in stuck["message"]
    assert "manifests/rbac/worker_role.yaml" in stuck["message"]
    assert job["status"]["phase"] == "Pending"
    # `kubectl describe` shows the condition and the Event.
    assert "WorkerRBACMissing" in described
    assert "Warning  WorkerRBACMissing" in described
    make(node_cluster, "uninstall")
