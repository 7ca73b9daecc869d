"""The names of a gang's objects: its headless Service, its worker pods and the coordinator's DNS
name. Pure; shared by the controller's pod builder and the command line.
"""

from __future__ import annotations

from api.v1alpha1 import GangJob


def service_name(job_name: str) -> str:
    """The headless Service of a gang has the gang's name."""
    return job_name


def pod_name(job_name: str, index: int, role: str | None = None) -> str:
    """Worker pods are `<job>-<role>-<index>`, or `<job>-<index>` when `role` is None (a job
    written with `replicas` + `template`); the name is also the pod's hostname."""
    return f"{job_name}-{index}" if role is None else f"{job_name}-{role}-{index}"


def worker_pod_name(job: GangJob, worker: int) -> str:
    """The pod name of worker number `worker` (`gangjob.io/rank`) of the job."""
    return worker_pod_names(job)[worker]


def worker_pod_names(job: GangJob) -> tuple[str, ...]:
    """Every worker's pod name, by worker number (kept on the parsed spec)."""
    memo = job.spec.pod_names
    names = memo.get(job.metadata.name)
    if names is None:
        shorthand = job.spec.shorthand
        names = tuple(
            pod_name(job.metadata.name, slot.index, None if shorthand else slot.role.name)
            for slot in job.spec.workers
        )
        memo[job.metadata.name] = names
    return names


def coordinator_pod_name(job: GangJob) -> str:
    """The pod `MASTER_ADDR` names: `spec.coordinator`'s, by default rank 0's."""
    return worker_pod_name(job, job.spec.coordinator_worker.worker)


def master_addr(job_name: str, coordinator: str | None = None) -> str:
    """The coordinator's DNS name, `<pod>.<job>`: by default rank 0's, `<job>-0.<job>`.

    A pod with `hostname` and `subdomain` under a headless Service of the subdomain's name gets
    the record `<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>`, and every pod's
    resolv.conf searches `<namespace>.svc.<cluster-domain>`: the short form therefore resolves
    from any pod of the gang, without hard-coding the cluster domain (which is not always
    `cluster.local`).
    """
    return f"{coordinator or pod_name(job_name, 0)}.{service_name(job_name)}"
