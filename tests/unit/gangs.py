"""Gangs in given states, and plans carried out, for the table tests of `controller.policy`
(tests/unit/test_plan.py and test_policy_*.py): an observation of a job and its pods, the world
after reconcile carried out a plan, a worker arrived at an epoch, a crashed trainer, a running
or restarting status."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from api.constants import ConditionType
from api.v1alpha1 import (
    FailureAction,
    GangJob,
    GangJobStatus,
    Phase,
    RestartCounts,
    RestartMode,
    RestartRecord,
    RestartTrigger,
)
from controller.policy.conditions import get_condition
from controller.policy.plan import Observed, Plan, plan
from controller.policy.views import NodeView, PodView
from tests.unit.builders import T0, make_job, make_node, make_pod, with_status

NOW = T0 + timedelta(minutes=1, microseconds=250)
"""`observe`'s time: not whole seconds, as a pass's time is not."""
STAMP = NOW.replace(microsecond=0)
"""`NOW` as the status stores it."""
GANG_NOW = T0 + timedelta(minutes=10)
"""`gang`'s time: ten minutes after its start and its barrier's opening."""


def observe(
    job: GangJob,
    pods: Sequence[dict[str, Any]] = (),
    *,
    service: bool = True,
    now: datetime = NOW,
    nodes: Sequence[dict[str, Any]] = (make_node(),),
) -> Observed:
    return Observed(
        job=job,
        pods=[PodView.from_pod(p) for p in pods],
        nodes={n.name: n for n in map(NodeView.from_node, nodes)},
        service_exists=service,
        now=now,
    )


def carry_out(observed: Observed, result: Plan, *, deletions: bool = True) -> Observed:
    """The world after reconcile carried out the plan: status written, Service and pods created
    (the apiserver gives them a uid), deleted pods terminating (if `deletions`)."""
    deleted = {d.name for d in result.delete_pods} if deletions else set()
    pods = [
        dataclasses.replace(pod, deletion_timestamp=observed.now) if pod.name in deleted else pod
        for pod in observed.pods
    ]
    for manifest in result.create_pods:
        manifest["metadata"]["uid"] = "new-" + manifest["metadata"]["name"]
        pods.append(PodView.from_pod(manifest))
    return dataclasses.replace(
        observed,
        job=with_status(observed.job, result.status),
        pods=pods,
        service_exists=observed.service_exists or result.create_service is not None,
    )


def names(result: Plan) -> list[str]:
    return [p["metadata"]["name"] for p in result.create_pods]


def condition(result: Plan, type_: ConditionType) -> tuple[str, str, str] | None:
    found = get_condition(result.status.conditions, type_)
    return None if found is None else (found.status, found.reason, found.message)


def worker(rank: int, epoch: int | None, *, created: int = 0, **kw: Any) -> dict[str, Any]:
    """A worker pod arrived at `epoch` (None: not yet), created at `created`."""
    pod = make_pod(rank, epoch=epoch, **kw)
    pod["metadata"]["annotations"]["gangjob.io/created-epoch"] = str(created)
    return pod


def crashed(pod: dict[str, Any], code: int = 1) -> dict[str, Any]:
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": code, "reason": "Error"}
    }
    return pod


def running_status(epoch: int = 0, **update: Any) -> GangJobStatus:
    """A gang running at `epoch`, its barrier open since T0."""
    return GangJobStatus(
        phase=Phase.RUNNING,
        epoch=epoch,
        barrier_epoch=epoch,
        barrier_opened_at=T0,
        start_time=T0,
        mode=RestartMode.POD,
        **update,
    )


def gang(
    replicas: int = 3,
    status: GangJobStatus | None = None,
    pods: Sequence[dict[str, Any]] | None = None,
    *,
    now: datetime = GANG_NOW,
    nodes: Sequence[dict[str, Any]] = (make_node(),),
    **spec: Any,
) -> Observed:
    status = status or running_status()
    job = with_status(make_job(replicas=replicas, **spec), status)
    if pods is None:
        pods = [worker(r, status.epoch) for r in range(replicas)]
    return observe(job, pods, now=now, nodes=nodes)


def new_gang(nodes: Sequence[dict[str, Any]], **spec: Any) -> Observed:
    return gang(replicas=2, status=GangJobStatus(), pods=[], nodes=nodes, **spec)


def replan(observed: Observed, result: Plan) -> Plan:
    """Plan again over the outcome: it must repeat nothing."""
    again = plan(carry_out(observed, result))
    assert again.status == result.status
    assert again.events == []
    assert again.create_pods == []
    assert again.restart_started is None
    assert again.restart_finished is None
    assert again.failures == []
    return again


def record(result: Plan) -> RestartRecord:
    assert result.status.last_restart is not None
    return result.status.last_restart


def restarting_status(
    epoch: int = 1, detected: datetime = GANG_NOW - timedelta(seconds=3)
) -> GangJobStatus:
    trigger = RestartTrigger(
        worker=1, failure_class="ProcessExit", detail="x", action=FailureAction.RESTART_GANG
    )
    last = RestartRecord(epoch=epoch, trigger=trigger, detected_at=detected, counted=True)
    return running_status(epoch).model_copy(
        update={
            "phase": Phase.RESTARTING,
            "barrier_epoch": epoch - 1,
            "last_restart": last,
            "restarts": RestartCounts(total=epoch, counted=epoch, in_place=epoch),
        }
    )
