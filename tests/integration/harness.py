"""What the integration tests share: the CRD installed, GangJob manifests, watch-based waits
on jobs; the controller subprocess and kubectl come from `localcluster.tools`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from api import builders
from api.constants import LABEL_NAME
from controller.k8s import CRDS, GANGJOBS, PODS, JsonDict, Kube, NotFound
from localcluster.addons import crd_established
from localcluster.procs import free_port
from localcluster.tools import (
    REPO,
    SA,
    SYSTEM_NS,
    ControllerProcess,
    controller_kubeconfig,
    kubectl,
)
from tests.waiting import wait_for

CRD_FILE = REPO / "manifests" / "crd" / "gangjob.io_gangjobs.yaml"

__all__ = [
    "SA",
    "SYSTEM_NS",
    "ControllerProcess",
    "controller_kubeconfig",
    "free_port",
    "gang_pods",
    "gangjob",
    "install_crd",
    "kubectl",
    "phase_is",
    "watch_job",
]


async def install_crd(kube: Kube) -> None:
    """Applies the committed CRD (create or replace) and waits until it is Established."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    name = crd["metadata"]["name"]
    try:
        current = await kube.get(CRDS, name)
        crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await kube.replace(CRDS, name, crd)
    except NotFound:
        await kube.create(CRDS, crd)

    await wait_for(kube, CRDS, name, None, crd_established, timeout=60, what="Established")


def gangjob(name: str, replicas: int, **spec: Any) -> JsonDict:
    """A GangJob manifest with a busybox trainer (KWOK runs it; nothing executes on sim)."""
    return builders.gangjob(
        name, replicas, image="localhost/busybox:dev", command=["true"], spec=spec
    )


async def gang_pods(kube: Kube, ns: str, job: str) -> list[JsonDict]:
    return (await kube.list(PODS, ns, label_selector=f"{LABEL_NAME}={job}")).items


async def watch_job(
    kube: Kube,
    ns: str,
    name: str,
    predicate: Callable[[JsonDict], bool],
    timeout: float = 60,
    what: str = "",
) -> JsonDict:
    return await wait_for(kube, GANGJOBS, name, ns, predicate, timeout=timeout, what=what)


async def watch_finished(kube: Kube, ns: str, name: str, timeout: float) -> JsonDict:
    """The GangJob once it has ended, Succeeded or Failed."""
    return await watch_job(
        kube, ns, name,
        lambda j: (j.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout, "finished",
    )  # fmt: skip


def phase_is(phase: str) -> Callable[[JsonDict], bool]:
    return lambda job: job.get("status", {}).get("phase") == phase
