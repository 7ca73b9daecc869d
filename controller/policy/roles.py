"""The roles of a GangJob as the pass sees them (docs/design.md section 3.10): which roles run,
in what order they start (`dependsOn`: Ready or Complete), which workers the gang's protocol
spans (the running roles'; a Complete role is never run again), and the per-role counts of the
status. Pure.
"""

from __future__ import annotations

from api.v1alpha1 import DependencyStatus, Role, RoleState, RoleStatus
from controller.policy.gang import POD_FAILED, POD_RUNNING, at_epoch
from controller.policy.passstate import Pass, RoleProgress
from controller.policy.success import worker_succeeded
from controller.policy.views import PodView


def advance(p: Pass) -> bool:
    """Each role's state for this pass, in spec order (a role depends only on earlier ones):
    `Complete` stays; a running role whose every worker succeeded completes; a waiting role
    starts once every role it depends on has reached the status named (or has pods already: a
    role that started is never held back again)."""
    for role in p.job.spec.effective_roles:
        progress = p.roles.get(role.name, RoleProgress(RoleState.WAITING))
        if progress.state is RoleState.WAITING:
            if _has_pods(p, role):
                progress = RoleProgress(RoleState.RUNNING)
            elif all(_reached(p, dep.role, dep.status) for dep in role.depends_on):
                # Started behind an open barrier: its pods join the running gang at this epoch.
                late = p.status.epoch if p.status.barrier_epoch == p.status.epoch else None
                progress = RoleProgress(RoleState.RUNNING, late)
        if progress.state is RoleState.RUNNING and _all_succeeded(p, role):
            progress = RoleProgress(RoleState.COMPLETE)
        p.roles[role.name] = progress
    return False


def _workers(p: Pass, role: Role) -> list[int]:
    return [w.worker for w in p.job.spec.workers if w.role.name == role.name]


def _has_pods(p: Pass, role: Role) -> bool:
    return any(w in p.gang.workers for w in _workers(p, role))


def _all_succeeded(p: Pass, role: Role) -> bool:
    trainer = role.trainer_container_name
    live = p.gang.live
    return all(
        w in live and worker_succeeded(live[w], p.status.epoch, trainer) for w in _workers(p, role)
    )


def _reached(p: Pass, name: str, status: DependencyStatus) -> bool:
    """The role named has reached `status`: Complete, or (for Ready) every pod Ready."""
    progress = p.roles.get(name)
    if progress is None:
        return False
    if progress.state is RoleState.COMPLETE:
        return True
    if status is DependencyStatus.COMPLETE or progress.state is not RoleState.RUNNING:
        return False
    role = p.job.spec.role(name)
    assert role is not None  # the spec's dependsOn names roles (CEL, pydantic)
    live = p.gang.live
    return all(
        w in live and live[w].phase == POD_RUNNING and live[w].ready for w in _workers(p, role)
    )


def _failed(pod: PodView, epoch: int, trainer: str) -> bool:
    """The worker's pod failed, or at `epoch` its trainer ended with a non-zero code."""
    if pod.phase == POD_FAILED:
        return True
    if not at_epoch(pod, epoch):
        return False
    reported = pod.reported_exit
    if reported is not None and reported[0] == epoch and reported[1] != 0:
        return True
    container = pod.container(trainer)
    return container is not None and container.state == "terminated" and container.exit_code != 0


def statuses(p: Pass) -> list[RoleStatus]:
    """`status.roles`: each role's state and counts, as they will be once the plan is carried
    out (as `Pass.workers_status`)."""
    staying = p.staying()
    out: list[RoleStatus] = []
    for role in p.job.spec.effective_roles:
        progress = p.roles.get(role.name, RoleProgress(RoleState.WAITING))
        trainer, epoch = role.trainer_container_name, p.status.epoch
        complete = progress.state is RoleState.COMPLETE
        # One walk over the role's pods for every count: a pass over a gang of 5000 made four.
        ready = arrived = succeeded = failed = 0
        for w in _workers(p, role):
            pod = staying.get(w)
            if pod is None:
                continue
            ready += pod.ready
            arrived += pod.arrived_epoch == epoch
            succeeded += not complete and worker_succeeded(pod, epoch, trainer)
            failed += _failed(pod, epoch, trainer)
        out.append(
            RoleStatus(
                name=role.name,
                state=progress.state,
                replicas=role.replicas,
                ready=ready,
                arrived=arrived,
                succeeded=role.replicas if complete else succeeded,
                failed=failed,
                started_late_at=progress.started_late_at,
            )
        )
    return out
