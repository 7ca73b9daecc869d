"""The success policy: when a worker's training has succeeded, and when the job has, by
`spec.success` (`All` or `Any` worker of some roles) or `successPolicy` (`All`, `Rank0`)
(docs/design.md sections 3b, 3.10 and 5.2)."""

from __future__ import annotations

from collections.abc import Mapping, Set

from api.constants import (
    REASON_ALL_SUCCEEDED,
    REASON_ANY_SUCCEEDED,
    REASON_RANK0_SUCCEEDED,
    REASON_SUCCEEDED,
    ConditionType,
)
from api.v1alpha1 import (
    GangJob,
    Phase,
    RoleState,
    SuccessOperator,
    SuccessPolicy,
)
from controller.policy import failure, lifecycle
from controller.policy.gang import POD_SUCCEEDED, at_epoch
from controller.policy.passstate import EventSpec, Pass
from controller.policy.views import PodView


def complete(p: Pass) -> bool:
    """The job succeeds per its success policy; then it is finished and handled as such (the
    pods of the roles still running are stopped)."""
    ignored = failure.ignored_workers(p)
    complete_roles = {name for name, r in p.roles.items() if r.state is RoleState.COMPLETE}
    outcome = job_succeeded(p.job, p.gang.live, ignored, complete_roles, p.dropped())
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


def job_succeeded(
    job: GangJob,
    workers: Mapping[int, PodView],
    ignored: Set[int] = frozenset(),
    complete_roles: Set[str] = frozenset(),
    outside: Set[int] = frozenset(),
) -> tuple[str, str] | None:
    """(reason, message) if the job has succeeded by its success policy, else None.

    A worker has succeeded if its role completed, or by `worker_succeeded`; under `All` a
    worker whose failure the policy ignores (`ignored`) counts as done too, so a tolerated
    failure never keeps the job from finishing. `spec.success` decides if set, over the workers
    of its roles (`All` of them, or `Any`); else `successPolicy` (`All` workers, or `Rank0`).
    The workers an elastic gang goes on without (`outside`: its spares, workers it could not
    place) are no part of it: they run nothing, and the world's success is the job's.
    """
    epoch = job.status.epoch
    succeeded = {
        w.worker
        for w in job.spec.workers
        if w.role.name in complete_roles
        or (
            w.worker in workers
            and worker_succeeded(workers[w.worker], epoch, w.role.trainer_container_name)
        )
    }
    rule = job.spec.success
    if rule is None and job.spec.success_policy is SuccessPolicy.RANK0:
        if 0 in succeeded:
            return REASON_RANK0_SUCCEEDED, "Rank 0 succeeded"
        return None
    names = set(rule.roles or ()) if rule is not None else set()
    targets = [
        w.worker
        for w in job.spec.workers
        if (not names or w.role.name in names) and w.worker not in outside
    ]
    if rule is not None and rule.operator is SuccessOperator.ANY:
        first = next((w for w in targets if w in succeeded), None)
        if first is None:
            return None
        slot = job.spec.workers[first]
        return REASON_ANY_SUCCEEDED, (
            f"Worker {slot.index} of role {slot.role.name} succeeded (success: Any)"
        )
    done = succeeded | set(ignored)
    if not all(w in done for w in targets) or not succeeded & set(targets):
        return None
    of_roles = f" of role(s) {', '.join(sorted(names))}" if names else ""
    message = f"All {len(targets)} workers{of_roles} succeeded"
    tolerated = sum(w not in succeeded for w in targets)
    if tolerated:
        message += f" ({tolerated} with a failure the policy ignores)"
    return REASON_ALL_SUCCEEDED, message
