"""JobSet v0.12.0, the scale benchmark's peer, runs out of cluster on the `sim` cluster: its pods
stay Running on KWOK nodes, and one failed pod restarts the whole JobSet."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator

import pytest

from controller.k8s import PODS, JsonDict, Kube, ResourceKind, selector
from localcluster import jobset
from localcluster.cluster import Cluster
from localcluster.outofcluster import AddonProcess

pytestmark = pytest.mark.integration

JOBSETS = ResourceKind(jobset.GROUP, jobset.API_VERSION.split("/")[1], jobset.PLURAL, jobset.KIND)
WORKERS = 3


@pytest.fixture
def jobset_controller(sim_cluster: Cluster) -> Iterator[AddonProcess]:
    """The JobSet controller (built on first use), stopped after the test."""
    if not jobset.keeps_pods_running(sim_cluster):
        pytest.fail(
            f"KWOK of cluster {sim_cluster.name!r} completes Job-owned pods at once: its "
            f"pod-complete stage ({sim_cluster.dir / 'kwok-stages.yaml'}) must skip pods "
            f"labelled {jobset.KEEP_RUNNING_LABEL} (see localcluster.jobset)"
        )
    ctl = jobset.start_controller(sim_cluster, out=sys.stderr)
    try:
        yield ctl
    finally:
        ctl.stop()
        assert not ctl.alive()


def _running(pod: JsonDict) -> bool:
    meta, status = pod["metadata"], pod.get("status", {})
    return status.get("phase") == "Running" and "deletionTimestamp" not in meta


async def wait_attempt_running(
    kube: Kube, namespace: str, name: str, attempt: int, timeout: float
) -> list[JsonDict]:
    """The `WORKERS` pods of restart attempt `attempt`, once all of them run. Fails at once if
    KWOK completes one (the peer's pods must stay Running until failed on purpose)."""
    labels = selector({jobset.JOBSET_NAME_LABEL: name, jobset.RESTART_ATTEMPT_LABEL: str(attempt)})
    pods: dict[str, JsonDict] = {}

    def check() -> list[JsonDict] | None:
        done = [p for p in pods.values() if p.get("status", {}).get("phase") == "Succeeded"]
        assert not done, f"KWOK completed {done[0]['metadata']['name']}: it must stay Running"
        running = [p for p in pods.values() if _running(p)]
        return running if len(running) == WORKERS else None

    async def run() -> list[JsonDict]:
        listed = await kube.list(PODS, namespace, label_selector=labels)
        pods.update({p["metadata"]["name"]: p for p in listed.items})
        if (got := check()) is not None:
            return got
        stream = kube.watch(
            PODS, namespace, label_selector=labels, resource_version=listed.resource_version
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type == "BOOKMARK":
                    continue
                if ev.type == "DELETED":
                    pods.pop(ev.object["metadata"]["name"], None)
                else:
                    pods[ev.object["metadata"]["name"]] = ev.object
                if (got := check()) is not None:
                    return got
        raise AssertionError("watch ended")

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        phases = {n: p.get("status", {}).get("phase") for n, p in pods.items()}
        raise AssertionError(
            f"JobSet {namespace}/{name}: attempt {attempt} has not {WORKERS} pods Running "
            f"after {timeout}s; its pods: {phases}"
        ) from None


async def test_one_failed_pod_restarts_the_whole_jobset(
    sim_kube: Kube, namespace: str, jobset_controller: AddonProcess
) -> None:
    name = "peer"
    manifest = jobset.jobset_manifest(name, workers=WORKERS, max_restarts=3)
    await sim_kube.create(JOBSETS, manifest, namespace)

    first = await wait_attempt_running(sim_kube, namespace, name, attempt=0, timeout=60)
    assert all(p["spec"]["nodeName"].startswith("kwok-node-") for p in first)

    # As the benchmark fails a worker: a status patch, as a kubelet would report its exit.
    victim = min(first, key=lambda p: str(p["metadata"]["name"]))
    await sim_kube.patch_status(
        PODS, victim["metadata"]["name"], jobset.failed_pod_status(victim), namespace
    )

    second = await wait_attempt_running(sim_kube, namespace, name, attempt=1, timeout=120)
    assert {p["metadata"]["uid"] for p in second}.isdisjoint(p["metadata"]["uid"] for p in first)
    js = await sim_kube.get(JOBSETS, name, namespace)
    assert js["status"]["restarts"] == 1
    assert jobset_controller.alive()
