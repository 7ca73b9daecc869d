"""The observed pods sorted into a gang (workers by rank, strays, names still taken) and where
each worker stands in the restart protocol: the epoch it is at (docs/design.md sections 3.3 and
5.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from api.naming import worker_pod_names
from api.v1alpha1 import GangJob, GangJobStatus
from controller.policy.views import PodView

# Pod phases (core/v1).
POD_RUNNING: Final = "Running"
POD_SUCCEEDED: Final = "Succeeded"
POD_FAILED: Final = "Failed"
POD_TERMINAL: Final = frozenset({POD_SUCCEEDED, POD_FAILED})


@dataclass(frozen=True)
class Gang:
    """The observed pods sorted out once: workers by rank, and the rest."""

    workers: dict[int, PodView]
    """Worker number (`gangjob.io/rank`) -> its pod: ours (controller ownerReference to this
    job), number in range, named as `api.naming.worker_pod_name` names it. At most one per number,
    because the name is derived from the number."""
    strays: list[PodView]
    """Ours, but not a worker: number missing or out of range, or the wrong name."""
    names: frozenset[str]
    """Names of every observed pod, ours or not, terminating or not: a name still taken."""
    live: dict[int, PodView]
    """The workers not being deleted: those that can still work, fail or succeed."""


def sort_pods(job: GangJob, pods: Sequence[PodView]) -> Gang:
    workers: dict[int, PodView] = {}
    strays: list[PodView] = []
    uid, names = job.metadata.uid, worker_pod_names(job)
    for pod in pods:
        # A pod controlled by another object (a deleted namesake GangJob's leftovers, or an
        # orphan) is not ours to count or delete; it still holds its name.
        if uid is None or pod.controller_uid != uid:
            continue
        rank = pod.rank
        if rank is not None and 0 <= rank < len(names) and pod.name == names[rank]:
            workers[rank] = pod
        else:
            strays.append(pod)
    live = {rank: pod for rank, pod in workers.items() if not pod.terminating}
    return Gang(workers, strays, frozenset(pod.name for pod in pods), live)


POD_SCHEDULED: Final = "PodScheduled"
UNSCHEDULABLE: Final = "Unschedulable"


def unschedulable_since(pod: PodView) -> datetime | None:
    """When the scheduler found no node for this unbound, pending pod; None if it did not."""
    if pod.node_name or pod.terminating or pod.phase not in (None, "Pending"):
        return None
    if pod.conditions.get(POD_SCHEDULED) != ("False", UNSCHEDULABLE):
        return None
    return pod.condition_times.get(POD_SCHEDULED, pod.creation_timestamp)


def epoch_workers(status: GangJobStatus) -> int | None:
    """How many worker numbers an elastic gang's epoch spans: its world and the workers it
    goes on without (docs/design.md section 3.12); None before the first pass."""
    if status.world_size is None:
        return None
    return status.world_size + len(status.dropped)


def surplus(job: GangJob, status: GangJobStatus, strays: Sequence[PodView]) -> list[PodView]:
    """The pods of the workers an elastic resize removes (docs/design.md section 3.12): strays
    numbered at or above the job's new size and below the numbers the epoch spans."""
    spanned = epoch_workers(status)
    if job.spec.elasticity is None or spanned is None:
        return []
    new = len(job.spec.workers)
    return [pod for pod in strays if pod.rank is not None and new <= pod.rank < spanned]


def arrived_by_barrier(pods: Sequence[PodView], status: GangJobStatus) -> list[PodView]:
    """The pods, each known to have arrived at `status.epoch` if its barrier is open.

    The barrier opened only when every worker present had arrived, so the status alone says
    where they stand afterwards. Arrivals reported to the controller directly live in its
    memory until then (controller.arrivals); a controller restarted later still knows every
    worker is at the epoch, and judges their failures as failures of the gang."""
    epoch, opened = status.epoch, status.barrier_opened_at
    if status.barrier_epoch != epoch or opened is None:
        return list(pods)
    # Only pods older than the barrier: one created since (a deleted worker replaced while its
    # restart waits out the backoff) has yet to arrive. Whole seconds on both sides, and a pod
    # of the barrier's own second is left to its own report.
    cutoff = opened.replace(microsecond=0)
    # Nor the pods of the workers an elastic gang goes on without: the barrier did not wait
    # for them (docs/design.md section 3.12).
    dropped = frozenset(status.dropped)
    return [
        pod.evolve(arrived_epoch=epoch)
        if (pod.arrived_epoch is None or pod.arrived_epoch < epoch)
        and pod.creation_timestamp is not None
        and pod.creation_timestamp < cutoff
        and pod.rank not in dropped
        else pod
        for pod in pods
    ]


def worker_epoch(pod: PodView) -> int | None:
    """The epoch a worker is at: the one it arrived at, else (a fresh pod whose agent has not
    arrived yet) the one it was created at; None if the pod says neither."""
    return pod.arrived_epoch if pod.arrived_epoch is not None else pod.created_epoch


def at_epoch(pod: PodView, epoch: int) -> bool:
    """The worker is at `epoch`: its failures are failures of the gang at that epoch. A worker
    below is expected to restart; one above (against the protocol: a status written back from
    an old copy) is no one's to restart for, and the barrier timeout recreates it."""
    return worker_epoch(pod) == epoch
