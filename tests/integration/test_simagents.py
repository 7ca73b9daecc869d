"""`localcluster up --profile sim --agents` as a user runs it: a cluster of its own whose
`sim-agents` component runs the real agent for every GangJob pod, a GangJob applied with
kubectl, a worker killed with `localcluster kill-worker` ten times in a row, the gang
restarted in place each time (same pods), and `localcluster down` leaving no process
behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api import builders
from controller.k8s import PODS, JsonDict, Kube
from localcluster.cluster import SIM_AGENTS, SIMULATED_KUBELET_LABEL, Cluster
from localcluster.tools import REPO, ControllerProcess, controller_kubeconfig, install_crd, kubectl
from tests.integration.harness import phase_is, watch_job

pytestmark = pytest.mark.integration

NAME = f"{os.environ.get('GANGJOB_TEST_CLUSTERS', 'test')}-agents"
WORKERS = 200
RESTARTS = 10
NS = "default"


def localcluster(*args: str, timeout: float = 300) -> str:
    """The `localcluster` command, as a user runs it; raises with its output on failure."""
    res = subprocess.run(
        [sys.executable, "-m", "localcluster.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, f"localcluster {' '.join(args)}: {res.stdout}{res.stderr}"
    return res.stdout


def _processes_of(cluster: str) -> list[int]:
    """Every process on this host running `localcluster.simagents` for `cluster`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"localcluster.simagents" in argv and cluster.encode() in argv:
            pids.append(int(d.name))
    return pids


@pytest.fixture
def agents_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, ControllerProcess]]:
    cluster = Cluster(NAME)
    if cluster.procs():
        localcluster("down", "--name", NAME)  # a fresh cluster: this test starts it
    localcluster("up", "--profile", "sim", "--agents", "--name", NAME, "--nodes", "1")
    ctl: ControllerProcess | None = None
    try:
        install_crd(cluster)
        ctl = ControllerProcess(
            controller_kubeconfig(cluster), [], tmp_path / "ctl.log", arrivals=True
        )
        ctl.start()
        ctl.wait_ready()
        yield cluster, ctl
    finally:
        if ctl is not None:
            ctl.stop()
            print(ctl.logs()[-3000:])
        print((cluster.logs / f"{SIM_AGENTS}.log").read_text(errors="replace")[-3000:])
        if cluster.procs():
            localcluster("down", "--name", NAME)


def _uids(pods: list[JsonDict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


async def test_a_killed_worker_restarts_its_gang_in_place_and_down_leaves_nothing(
    agents_cluster: tuple[Cluster, ControllerProcess],
) -> None:
    cluster, ctl = agents_cluster
    record = {p.name: p for p in cluster.procs()}
    assert record[SIM_AGENTS].alive()
    job = builders.gangjob(
        "g", WORKERS, namespace=NS,
        image="localhost/busybox:dev", command=["sh", "-c", "sleep infinity"],
        pod_labels={SIMULATED_KUBELET_LABEL: "true"}, max_restarts=RESTARTS + 1,
    )  # fmt: skip
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(job))

    def at(epoch: int) -> Callable[[JsonDict], bool]:
        def ok(j: JsonDict) -> bool:
            st = j.get("status", {})
            return bool(
                st.get("epoch") == epoch
                and st.get("barrierEpoch") == epoch
                and st.get("workers", {}).get("arrived") == WORKERS
            )

        return ok

    async with await Kube.from_kubeconfig(cluster.kubeconfig, request_timeout=10) as kube:
        await watch_job(kube, NS, "g", at(0), 180, "every worker arrived at epoch 0")
        selector = "gangjob.io/name=g"
        before = _uids((await kube.list(PODS, NS, label_selector=selector)).items)
        assert len(before) == WORKERS

        for epoch in range(1, RESTARTS + 1):
            rank = (epoch * 37) % WORKERS  # a different worker each time
            out = await asyncio.to_thread(
                localcluster, "kill-worker", "g", str(rank), "--name", NAME, "--code", "1"
            )
            assert f"default/g-{rank}" in out, out
            assert "restarted in place" in out, out
            job_now = await watch_job(
                kube, NS, "g", at(epoch), 180, f"every worker arrived at epoch {epoch}"
            )
            assert job_now["status"]["lastRestart"]["epoch"] == epoch
            assert job_now["status"]["lastRestart"]["trigger"]["worker"] == rank
            pods = (await kube.list(PODS, NS, label_selector=selector)).items
            assert _uids(pods) == before  # in place: the same pods, every time
            killed = next(p for p in pods if p["metadata"]["name"] == f"g-{rank}")
            counts = [c.get("restartCount", 0) for c in killed["status"]["containerStatuses"]]
            assert counts, killed["status"]
            assert all(n >= 1 for n in counts), killed["status"]
        assert job_now["status"]["restarts"]["counted"] == RESTARTS
        await watch_job(kube, NS, "g", phase_is("Running"), 60, "Running again")

    # A rank nobody has is refused with a message, not a traceback.
    res = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "localcluster.cli", "kill-worker", "g", "999", "--name", NAME],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout
    assert "no pod of worker 999 of g" in res.stderr, res.stderr

    ctl.stop()
    await asyncio.to_thread(localcluster, "down", "--name", NAME)
    assert not any(p.alive() for p in record.values())
    assert _processes_of(NAME) == []
    assert not (cluster.dir / "sim-agents.sock").exists()
