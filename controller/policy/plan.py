"""The controller's policy, pure: from what was observed of one GangJob (the job, its pods, the
nodes, the time) to a `Plan` of what reconcile must do (the desired status, pods and Service to
create, pods to delete, Events). The one entry point of `controller.policy`; no I/O.

`plan` runs the flat sequence of small steps in `STEPS` over one `Pass`
(docs/design.md section 5.2). Each step reads the observation, adds to the pass (status fields,
creates, deletes, events), and returns True to end the pass early, as jobset's reconciler does.
Each step lives in the module of its policy: lifecycle, mode, roles, failure, success, restart,
recreate.

The restart protocol (docs/design.md section 3) in these steps: failures are attributed to the
epoch the worker was at, and only a worker at `status.epoch` can cause a restart (a worker below
it is restarting because of the protocol); all failures of a pass make at most one epoch bump;
the barrier of an epoch opens once every worker has arrived at it. Everything is read back from
the API objects on every pass, so a restarted controller carries on where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from controller.policy import (
    deadline,
    elastic,
    failure,
    hang,
    lifecycle,
    manual,
    mode,
    progress,
    recreate,
    restart,
    roles,
    scheduling,
    straggler,
    stuck,
    success,
)
from controller.policy.gang import arrived_by_barrier, sort_pods
from controller.policy.passstate import (
    STOP_DEADLINE_SECONDS,
    EventSpec,
    FinalizerRelease,
    Observed,
    Pass,
    Plan,
    PlanConfig,
    PodDelete,
    PodPlacement,
    PodStop,
    RoleProgress,
)

__all__ = [
    "STEPS",
    "STOP_DEADLINE_SECONDS",
    "EventSpec",
    "FinalizerRelease",
    "Observed",
    "Plan",
    "PlanConfig",
    "PlanStep",
    "PodDelete",
    "PodPlacement",
    "PodStop",
    "plan",
]

PlanStep = Callable[[Pass], bool]
"""A step of the pass: adds to it, and returns True to end the pass."""

STEPS: Final[tuple[PlanStep, ...]] = (
    lifecycle.stop_if_job_deleted,
    lifecycle.delete_strays,
    recreate.force_delete_lost,
    recreate.release_kueue_finalizer,
    lifecycle.finished,
    lifecycle.suspend,
    mode.choose_mode,
    roles.advance,
    straggler.find,
    success.complete,
    deadline.enforce,
    recreate.delete_recreated,
    failure.classify_failures,
    hang.settle,
    failure.fail_by_policy,
    restart.restart,
    manual.manual_restart,
    elastic.resize,
    recreate.recreate_laggards,
    lifecycle.create,
    lifecycle.place,
    scheduling.gang_scheduling,
    restart.barrier,
    stuck.diagnose,
    lifecycle.running,
)


_DEFAULT_CONFIG: Final = PlanConfig()


def plan(observed: Observed, config: PlanConfig = _DEFAULT_CONFIG) -> Plan:
    """Decide what one reconcile of `observed.job` does.

    Raises ValueError if pods are to be created for a job without `metadata.uid` (the apiserver
    always sets one): a pod must be owned by its job.
    """
    status = observed.job.status.model_copy(deep=True)
    p = Pass(
        observed=observed,
        config=config,
        gang=sort_pods(observed.job, arrived_by_barrier(observed.pods, observed.job.status)),
        status=status,
        roles={r.name: RoleProgress(r.state, r.started_late_at) for r in status.roles or ()},
    )
    for step in STEPS:
        if step(p):
            # The last step ends every pass it reaches: that pass ran them all.
            p.every_step = step is STEPS[-1]
            break
    progress.account(p)
    p.finish_status(roles.statuses(p))
    return p.plan()
