"""The manifests the controller creates for a GangJob: its headless Service and its worker pods
(`<job>-<rank>`, built from the user's template), and the seam where the restart mode shapes a
worker pod. Pure: returns dicts, talks to nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final

from api.constants import (
    ANNOTATION_EPOCH,
    ANNOTATION_EXIT,
    API_VERSION,
    ENV_GANGJOB_NAME,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_WORLD_SIZE,
    KIND,
    LABEL_NAME,
    LABEL_RANK,
)
from api.v1alpha1 import GangJob, RestartMode
from controller.views import ANNOTATION_CREATED_EPOCH

RENDEZVOUS_PORT_NAME: Final = "rendezvous"

# Annotations only the agent (or the controller at creation) may write: copied from a template
# they would make a fresh worker look arrived, or report an exit that never happened.
_PROTOCOL_ANNOTATIONS: Final = frozenset(
    {ANNOTATION_EPOCH, ANNOTATION_EXIT, ANNOTATION_CREATED_EPOCH}
)


def service_name(job_name: str) -> str:
    """The headless Service of a gang has the gang's name."""
    return job_name


def pod_name(job_name: str, rank: int) -> str:
    """Worker pods are `<job>-<rank>`; the name is also the pod's hostname."""
    return f"{job_name}-{rank}"


def master_addr(job_name: str) -> str:
    """Rank 0's DNS name, `<job>-0.<job>`.

    A pod with `hostname` and `subdomain` under a headless Service of the subdomain's name gets
    the record `<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>`, and every pod's
    resolv.conf searches `<namespace>.svc.<cluster-domain>`: the short form therefore resolves
    from any pod of the gang, without hard-coding the cluster domain (which is not always
    `cluster.local`).
    """
    return f"{pod_name(job_name, 0)}.{service_name(job_name)}"


def owner_reference(job: GangJob) -> dict[str, Any]:
    """The controller ownerReference to the GangJob, so garbage collection deletes what it owns
    and `blockOwnerDeletion` keeps a foreground deletion of the job waiting for its pods."""
    if not job.metadata.uid:
        raise ValueError(f"GangJob {job.metadata.name} has no metadata.uid to own pods with")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_service(job: GangJob) -> dict[str, Any]:
    """The headless Service `<job>` that gives every worker the DNS name `<job>-<rank>.<job>`.

    `publishNotReadyAddresses`: workers must resolve rank 0 before any of them is Ready, since
    rendezvous is what makes them ready.
    """
    name = job.metadata.name
    port = job.spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(name),
            "namespace": job.metadata.namespace,
            "labels": {LABEL_NAME: name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_NAME: name},
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def worker_env(job: GangJob, rank: int) -> list[dict[str, Any]]:
    """The environment every trainer gets (DESIGN.md 3b).

    The epoch is not in it: the epoch changes without the pod being recreated, so the agent
    hands it to the training process instead.
    """
    name = job.metadata.name
    return [
        {"name": ENV_MASTER_ADDR, "value": master_addr(name)},
        {"name": ENV_MASTER_PORT, "value": str(job.spec.master_port)},
        {"name": ENV_WORLD_SIZE, "value": str(job.spec.replicas)},
        {"name": ENV_RANK, "value": str(rank)},
        {"name": ENV_GANGJOB_NAME, "value": name},
    ]


def _merge_env(user_env: Iterable[Any], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Ours replace the user's namesakes, and come first: Kubernetes expands `$(VAR)` only from
    # variables defined earlier in the list, so the user's own may then refer to `$(RANK)`.
    names = {entry["name"] for entry in ours}
    kept = [e for e in user_env if not (isinstance(e, Mapping) and e.get("name") in names)]
    return [*ours, *kept]


def build_pod(job: GangJob, rank: int, agent_image: str) -> dict[str, Any]:
    """The worker pod `<job>-<rank>` built from `spec.template`.

    The template's labels and annotations are kept; the controller's labels win over same-named
    ones. The pod records the `status.epoch` it is created at (`gangjob.io/created-epoch`);
    `gangjob.io/epoch` is left to the agent, which writes it when the worker arrives.
    `restartPolicy` is the template's, else `Never`: restarts are the gang's business.
    """
    name = job.metadata.name
    template = job.spec.template
    template_meta: Mapping[str, Any] = template.get("metadata") or {}
    # A deep copy: the template belongs to the GangJob object, and pods must not share dicts.
    spec: dict[str, Any] = copy.deepcopy(template["spec"])

    labels = {**(template_meta.get("labels") or {}), LABEL_NAME: name, LABEL_RANK: str(rank)}
    annotations = {
        key: value
        for key, value in (template_meta.get("annotations") or {}).items()
        if key not in _PROTOCOL_ANNOTATIONS
    }
    annotations[ANNOTATION_CREATED_EPOCH] = str(job.status.epoch)

    spec["hostname"] = pod_name(name, rank)
    spec["subdomain"] = service_name(name)
    spec.setdefault("restartPolicy", "Never")
    trainer = job.spec.trainer_container_name
    for container in spec["containers"]:
        if container.get("name") == trainer:
            container["env"] = _merge_env(container.get("env") or [], worker_env(job, rank))

    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, rank),
            "namespace": job.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
    mode = job.status.mode or job.spec.restart.mode
    return apply_restart_mode(pod, job, mode, agent_image)


def apply_restart_mode(
    pod: dict[str, Any], job: GangJob, mode: RestartMode, agent_image: str
) -> dict[str, Any]:
    """Shape a worker pod for the restart mode in effect. Not implemented yet: the pod is
    returned unchanged for every mode.

    The next issue fills it: `Pod` injects the agent as a native sidecar (restartable init
    container from `agent_image`, startup probe as the barrier) and gives the trainer
    `restartPolicy: Never` with a `RestartAllContainers` rule for the retriable exit codes;
    `Process` wraps the trainer's command with the agent; `Recreate` leaves the pod as built.
    """
    del job, mode, agent_image  # used once the modes are implemented
    return pod
