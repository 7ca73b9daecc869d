"""Builders of GangJobs, and of Pods and Nodes as raw dicts shaped like the apiserver's, for the
unit tests of the controller's policy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.builders import gangjob
from api.v1alpha1 import GangJob, GangJobStatus, parse_gangjob

JOB_NAME = "llama"
NAMESPACE = "ml"
JOB_UID = "0b6d2c55-6f7e-4a39-9a53-5a0e8f4c1d2e"
T0 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "image": "trainer:1",
                "command": ["python", "train.py"],
                "env": [{"name": "RANK", "value": "99"}, {"name": "LR", "value": "0.1"}],
            },
            {"name": "logger", "image": "logger:1"},
        ],
        "nodeSelector": {"gpu": "true"},
    },
}


def _stamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def job_dict(
    replicas: int = 4, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    body = gangjob(JOB_NAME, replicas, namespace=NAMESPACE, template=TEMPLATE, spec=spec)
    body["metadata"].update(uid=JOB_UID, generation=1, creationTimestamp=_stamp(T0))
    body["status"] = status or {}
    return body


def make_job(replicas: int = 4, **spec: Any) -> GangJob:
    return parse_gangjob(job_dict(replicas, **spec))


def with_status(job: GangJob, status: GangJobStatus) -> GangJob:
    return job.model_copy(update={"status": status})


def owner(uid: str = JOB_UID) -> dict[str, Any]:
    return {
        "apiVersion": "gangjob.io/v1alpha1",
        "kind": "GangJob",
        "name": JOB_NAME,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def make_pod(
    rank: int | None,
    *,
    phase: str = "Running",
    ready: bool | None = None,
    epoch: int | None = None,
    terminating: bool = False,
    name: str | None = None,
    owner_uid: str = JOB_UID,
    exit_code: int | None = None,
    node: str = "node-0",
) -> dict[str, Any]:
    """A worker pod as the apiserver returns it, in the given phase (Ready when Running, unless
    `ready` says otherwise)."""
    if ready is None:
        ready = phase == "Running"
    labels = {"gangjob.io/name": JOB_NAME, "team": "ml"}
    if rank is not None:
        labels["gangjob.io/rank"] = str(rank)
    annotations = {"gangjob.io/created-epoch": "0"}
    if epoch is not None:
        annotations["gangjob.io/epoch"] = str(epoch)
    metadata: dict[str, Any] = {
        "name": name or f"{JOB_NAME}-{rank}",
        "namespace": NAMESPACE,
        "uid": f"uid-{name or rank}",
        "creationTimestamp": _stamp(T0),
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner(owner_uid)],
    }
    if terminating:
        metadata["deletionTimestamp"] = _stamp(T0)
    if phase == "Running":
        state: dict[str, Any] = {"running": {"startedAt": _stamp(T0)}}
    elif phase in ("Succeeded", "Failed"):
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        reason = "Completed" if code == 0 else "Error"
        state = {"terminated": {"exitCode": code, "reason": reason}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": "trainer",
                "restartCount": 0,
                "ready": ready,
                "started": phase == "Running",
                "state": state,
            }
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "trainer:1"}]},
        "status": status,
    }


RESTART_ALL_CONTAINERS_FEATURE = "RestartAllContainersOnContainerExits"


def make_node(
    name: str = "node-0",
    *,
    ready: str = "True",
    taints: tuple[str, ...] = (),
    features: tuple[str, ...] = (RESTART_ALL_CONTAINERS_FEATURE,),
    conditions: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as the apiserver returns it: Ready (unless `ready` says otherwise), declaring
    KEP-5532's feature, with the given taints (effect NoExecute) and extra conditions. Its
    labels default to ones the template of `make_job` selects (`gpu: "true"`)."""
    node_conditions = [{"type": "Ready", "status": ready}]
    node_conditions += [{"type": t, "status": s} for t, s in (conditions or {}).items()]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {"gpu": "true"})},
        },
        "spec": {"taints": [{"key": key, "effect": "NoExecute"} for key in taints]},
        "status": {
            "conditions": node_conditions,
            "allocatable": {"cpu": "8", "pods": "110", **(allocatable or {})},
            "capacity": {"cpu": "8", "pods": "110", **(capacity or {})},
            "declaredFeatures": list(features),
        },
    }
