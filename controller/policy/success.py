"""The success policy: when a worker's training has succeeded, and when the job has by its
`successPolicy` (`All`, `Rank0`) (docs/design.md sections 3b and 5.2)."""

from __future__ import annotations

from collections.abc import Mapping

from api.constants import (
    REASON_ALL_SUCCEEDED,
    REASON_RANK0_SUCCEEDED,
    REASON_SUCCEEDED,
    ConditionType,
)
from api.v1alpha1 import GangJob, Phase, SuccessPolicy
from controller.policy import lifecycle
from controller.policy.gang import POD_SUCCEEDED, at_epoch
from controller.policy.passstate import EventSpec, Pass
from controller.policy.views import PodView


def complete(p: Pass) -> bool:
    """The job succeeds per its successPolicy; then it is finished and handled as such."""
    outcome = job_succeeded(p.job, p.gang.live)
    if outcome is None:
        return False
    reason, message = outcome
    lifecycle.finish(p, Phase.SUCCEEDED, ConditionType.SUCCEEDED, reason, message)
    p.events.append(EventSpec("Normal", REASON_SUCCEEDED, message))
    return lifecycle.finished(p)


def worker_succeeded(pod: PodView, epoch: int, trainer: str) -> bool:
    """The worker's training finished with success: its pod Succeeded, or at `epoch` its
    trainer exited 0 (its container, or as the agent reported in `Process` mode)."""
    if pod.phase == POD_SUCCEEDED:
        return True
    if not at_epoch(pod, epoch):
        return False
    if pod.reported_exit == (epoch, 0):
        return True
    container = pod.container(trainer)
    return container is not None and container.state == "terminated" and container.exit_code == 0


def job_succeeded(job: GangJob, workers: Mapping[int, PodView]) -> tuple[str, str] | None:
    """(reason, message) if the job has succeeded by its successPolicy, else None."""
    epoch, trainer = job.status.epoch, job.spec.trainer_container_name
    succeeded = {rank for rank, pod in workers.items() if worker_succeeded(pod, epoch, trainer)}
    if job.spec.success_policy is SuccessPolicy.RANK0:
        if 0 in succeeded:
            return REASON_RANK0_SUCCEEDED, "Rank 0 succeeded"
        return None
    if len(succeeded) == job.spec.replicas:
        return REASON_ALL_SUCCEEDED, f"All {job.spec.replicas} workers succeeded"
    return None
