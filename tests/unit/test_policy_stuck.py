"""Unit tests of `controller.policy.stuck` through `plan`: a gang whose workers cannot do their
part says why in the `Stuck` condition (the cause, who, the fix) with one Warning Event, and
`ArrivalDegraded` when agents arrive by annotation although the endpoint is served. Each cause
is replanned over its own outcome: nothing is written or announced twice."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from api.constants import ConditionType
from api.v1alpha1 import GangJobStatus, Phase
from controller.policy.plan import Observed, PlanConfig, plan
from controller.policy.views import PodView
from tests.unit.builders import T0
from tests.unit.gangs import (
    GANG_NOW,
    carry_out,
    condition,
    gang,
    restarting_status,
    worker,
)

QUOTA = (
    '403 Forbidden: pods "llama-0" is forbidden: exceeded quota: q, requested: pods=1, '
    "used: pods=2, limited: pods=2"
)


def starting_status() -> GangJobStatus:
    """Workers created at T0, none arrived: the barrier of epoch 0 is shut."""
    return GangJobStatus(phase=Phase.PENDING, start_time=T0)


def waiting_in(pod: dict[str, Any], name: str, reason: str, message: str = "", **last: Any) -> None:
    """The pod's container (or the agent's init container) waits for `reason`."""
    status: dict[str, Any] = {"name": name, "restartCount": 4, "ready": False}
    status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    if last:
        status["lastState"] = {"terminated": last}
    key = "initContainerStatuses" if name.startswith("gangjob-agent") else "containerStatuses"
    entries = [c for c in pod["status"].get(key, []) if c["name"] != name]
    pod["status"][key] = [*entries, status]


DEFAULT = PlanConfig()


def no_repeat(observed: Observed, config: PlanConfig = DEFAULT) -> None:
    """Planned again over its own outcome: the same status, no Event."""
    first = plan(observed, config)
    again = plan(carry_out(observed, first), config)
    assert again.status.conditions == first.status.conditions
    assert [e for e in again.events if e.type == "Warning"] == []


def warnings(observed: Observed, config: PlanConfig = DEFAULT) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in plan(observed, config).events if e.type == "Warning"]


# --- a healthy gang says nothing ----------------------------------------------------------------


def test_a_running_gang_is_not_stuck_and_not_looked_at_again() -> None:
    result = plan(gang())
    assert condition(result, ConditionType.STUCK) is None
    assert condition(result, ConditionType.ARRIVAL_DEGRADED) is None
    assert result.requeue_after is None


def test_a_gang_at_a_shut_barrier_is_looked_at_again_for_what_comes_with_no_event() -> None:
    observed = gang(status=starting_status(), pods=[worker(r, None) for r in range(3)])
    observed = dataclasses.replace(observed, now=T0 + timedelta(seconds=10))
    result = plan(observed, PlanConfig(recheck_seconds=30))
    assert condition(result, ConditionType.STUCK) is None
    assert result.requeue_after is not None
    assert result.requeue_after <= 30


# --- worker RBAC ------------------------------------------------------------------------------


def test_missing_worker_rbac_makes_the_gang_stuck_with_the_fix() -> None:
    observed = gang(status=starting_status(), pods=[worker(r, None) for r in range(3)])
    observed = dataclasses.replace(
        observed,
        denied={"gangjob-worker": ("get pods", "patch pods")},
        now=T0 + timedelta(seconds=10),
    )
    result = plan(observed)
    status, reason, message = condition(result, ConditionType.STUCK) or ("", "", "")
    assert (status, reason) == ("True", "WorkerRBACMissing")
    assert "ServiceAccount ml/gangjob-worker, which may not get pods, patch pods" in message
    assert "manifests/rbac/worker_role.yaml" in message
    assert "make install" in message
    assert warnings(observed) == [("WorkerRBACMissing", message)]
    no_repeat(observed)
    # The ClusterRole installed: no longer stuck, said without an Event.
    cured = dataclasses.replace(carry_out(observed, result), denied={})
    after = plan(cured)
    assert condition(after, ConditionType.STUCK) == (
        "False",
        "Progressing",
        "No longer stuck (WorkerRBACMissing cleared)",
    )
    assert warnings(cured) == []


def test_a_template_service_account_without_the_role_is_told_to_bind_it() -> None:
    template = {
        "spec": {"serviceAccountName": "trainer-sa", "containers": [{"name": "t", "image": "i"}]}
    }
    observed = gang(status=starting_status(), pods=[], template=template)
    observed = dataclasses.replace(observed, denied={"trainer-sa": ("watch gangjobs",)})
    message = (condition(plan(observed), ConditionType.STUCK) or ("", "", ""))[2]
    assert "ServiceAccount ml/trainer-sa, which may not watch gangjobs" in message
    assert "bind the ClusterRole gangjob-worker" in message


# --- pod creation refused -----------------------------------------------------------------------


def test_a_refused_pod_creation_says_the_apiservers_message() -> None:
    observed = gang(status=GangJobStatus(), pods=[])
    observed = dataclasses.replace(observed, creation_refused=QUOTA)
    result = plan(observed)
    assert len(result.create_pods) == 3  # tried again
    status, reason, message = condition(result, ConditionType.STUCK) or ("", "", "")
    assert (status, reason) == ("True", "PodCreationRefused")
    assert "exceeded quota: q" in message
    assert "raise the namespace's ResourceQuota" in message
    assert warnings(observed) == [("PodCreationRefused", message)]
    # It comes first: nothing else matters while there are no pods.
    both = dataclasses.replace(observed, denied={"gangjob-worker": ("get pods",)})
    assert (condition(plan(both), ConditionType.STUCK) or ("", ""))[1] == "PodCreationRefused"


def test_a_refusal_no_longer_counts_once_no_pod_is_to_be_created() -> None:
    observed = dataclasses.replace(gang(), creation_refused=QUOTA)
    assert condition(plan(observed), ConditionType.STUCK) is None


def test_a_webhook_denial_is_named_as_such() -> None:
    denial = (
        '400 BadRequest: admission webhook "deny.example.com" denied the request: no GPUs '
        "on Sundays"
    )
    observed = dataclasses.replace(gang(status=GangJobStatus(), pods=[]), creation_refused=denial)
    message = (condition(plan(observed), ConditionType.STUCK) or ("", "", ""))[2]
    assert "no GPUs on Sundays" in message
    assert "admission webhook or policy" in message


# --- images and the agent's container -------------------------------------------------------------


def test_an_agent_image_that_cannot_be_pulled_is_named_with_the_kubelets_message() -> None:
    pods = [worker(r, None) for r in range(3)]
    for pod in pods[1:]:
        waiting_in(
            pod,
            "gangjob-agent",
            "ImagePullBackOff",
            'Back-off pulling image "registry.example/gangjob-agent:v9"',
        )
    observed = gang(status=starting_status(), pods=pods)
    result = plan(observed)
    status, reason, message = condition(result, ConditionType.STUCK) or ("", "", "")
    assert (status, reason) == ("True", "AgentImagePullFailed")
    assert "container gangjob-agent of worker 1 (pod llama-1) (and 1 more worker(s))" in message
    assert 'Back-off pulling image "registry.example/gangjob-agent:v9"' in message
    assert "--agent-image" in message
    no_repeat(observed)


def test_the_trainers_image_is_told_apart_from_the_agents() -> None:
    pods = [worker(r, None) for r in range(2)]
    waiting_in(pods[0], "trainer", "ErrImagePull", "not found")
    observed = gang(replicas=2, status=starting_status(), pods=pods)
    _, reason, message = condition(plan(observed), ConditionType.STUCK) or ("", "", "")
    assert reason == "ImagePullFailed"
    assert "container trainer of worker 0 (pod llama-0)" in message
    assert "imagePullSecrets" in message


def test_a_crash_looping_agent_points_at_its_log() -> None:
    pods = [worker(r, None) for r in range(2)]
    waiting_in(pods[1], "gangjob-agent", "CrashLoopBackOff", "back-off 40s", exitCode=1)
    observed = gang(replicas=2, status=starting_status(), pods=pods)
    status, reason, message = condition(plan(observed), ConditionType.STUCK) or ("", "", "")
    assert (status, reason) == ("True", "AgentCrashLooping")
    assert "worker 1 (pod llama-1) is in CrashLoopBackOff, last exit code 1" in message
    assert "kubectl logs llama-1 -c gangjob-agent --previous" in message
    no_repeat(observed)


def test_an_agent_running_between_two_back_offs_keeps_the_gang_stuck() -> None:
    pods = [worker(r, None) for r in range(2)]
    waiting_in(pods[1], "gangjob-agent", "CrashLoopBackOff", exitCode=1)
    observed = gang(replicas=2, status=starting_status(), pods=pods)
    observed = dataclasses.replace(observed, now=T0 + timedelta(seconds=10))
    first = plan(observed)
    crashing = carry_out(observed, first)
    # The kubelet starts it again: running, not through its probe, its last exit a crash.
    running = [worker(r, None) for r in range(2)]
    running[1]["status"]["initContainerStatuses"] = [
        {
            "name": "gangjob-agent",
            "restartCount": 5,
            "started": False,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        }
    ]
    again = dataclasses.replace(
        crashing, pods=[PodView.from_pod(p) for p in running], now=observed.now
    )
    result = plan(again)
    assert condition(result, ConditionType.STUCK) == condition(first, ConditionType.STUCK)
    assert warnings(again) == []
    # Never said before: a running agent after a crash is no cause of its own.
    fresh = dataclasses.replace(again, job=observed.job)
    assert condition(plan(fresh), ConditionType.STUCK) is None
    # Through its probe (the barrier opened for it): recovered.
    running[1]["status"]["initContainerStatuses"][0]["started"] = True
    recovered = dataclasses.replace(again, pods=[PodView.from_pod(p) for p in running])
    assert (condition(plan(recovered), ConditionType.STUCK) or ("",))[0] == "False"


def test_the_cause_changing_is_announced_again() -> None:
    pods = [worker(r, None) for r in range(2)]
    waiting_in(pods[1], "gangjob-agent", "CrashLoopBackOff", exitCode=1)
    observed = gang(replicas=2, status=starting_status(), pods=pods)
    crashing = carry_out(observed, plan(observed))
    denied = dataclasses.replace(crashing, denied={"gangjob-worker": ("get pods",)})
    assert [reason for reason, _ in warnings(denied)] == ["WorkerRBACMissing"]


# --- the barrier ------------------------------------------------------------------------------


def test_a_restart_whose_arrivals_stopped_names_who_is_missing() -> None:
    status = restarting_status(epoch=1, detected=GANG_NOW - timedelta(seconds=200))
    pods = [worker(0, 1), worker(1, 1), worker(2, 0)]
    observed = gang(status=status, pods=pods)
    result = plan(observed)
    assert result.delete_pods == []  # before the barrier timeout (600 s): nobody recreated
    status_, reason, message = condition(result, ConditionType.STUCK) or ("", "", "")
    assert (status_, reason) == ("True", "BarrierStalled")
    assert message.startswith(
        "1 of 3 workers have not arrived at epoch 1 for more than 120s: "
        "worker 2 (pod llama-2): Running."
    )
    assert warnings(observed) == [("BarrierStalled", message)]
    no_repeat(observed)


def test_a_barrier_within_the_bound_is_not_stalled_and_is_looked_at_when_it_would_be() -> None:
    status = restarting_status(epoch=1, detected=GANG_NOW - timedelta(seconds=100))
    observed = gang(status=status, pods=[worker(0, 1), worker(1, 1), worker(2, 0)])
    result = plan(observed)
    assert condition(result, ConditionType.STUCK) is None
    assert result.requeue_after == 20


def test_a_start_that_never_arrives_names_a_few_and_counts_the_rest() -> None:
    pods = [worker(r, None, phase="Pending") for r in range(6)]
    observed = gang(replicas=6, status=starting_status(), pods=pods)
    observed = dataclasses.replace(observed, now=T0 + timedelta(seconds=31))
    result = plan(observed, PlanConfig(barrier_stall_seconds=30))
    message = (condition(result, ConditionType.STUCK) or ("", "", ""))[2]
    assert message.startswith("6 of 6 workers have not arrived at epoch 0 for more than 30s: ")
    assert (
        "worker 2 (pod llama-2): Pending, waiting: trainer ContainerCreating; and 3 more" in message
    )
    assert "worker 3" not in message


def test_the_bound_is_never_longer_than_the_barrier_timeout() -> None:
    observed = gang(
        status=starting_status(),
        pods=[worker(r, None) for r in range(3)],
        restart={"barrierTimeoutSeconds": 40},
    )
    observed = dataclasses.replace(observed, now=T0 + timedelta(seconds=41))
    assert (condition(plan(observed), ConditionType.STUCK) or ("", ""))[1] == "BarrierStalled"


def test_the_barrier_opening_clears_it() -> None:
    status = restarting_status(epoch=1, detected=GANG_NOW - timedelta(seconds=200))
    observed = gang(status=status, pods=[worker(0, 1), worker(1, 1), worker(2, 0)])
    stalled = carry_out(observed, plan(observed))
    arrived = gang(status=stalled.job.status, pods=[worker(r, 1) for r in range(3)])
    result = plan(arrived)
    assert result.status.barrier_epoch == 1
    assert (condition(result, ConditionType.STUCK) or ("",))[0] == "False"


def test_finishing_or_suspending_clears_it() -> None:
    pods = [worker(r, None) for r in range(2)]
    observed = gang(replicas=2, status=starting_status(), pods=pods)
    observed = dataclasses.replace(observed, denied={"gangjob-worker": ("get pods",)})
    stuck = carry_out(observed, plan(observed))
    suspended = stuck.job.model_copy(
        update={"spec": stuck.job.spec.model_copy(update={"suspend": True})}
    )
    result = plan(dataclasses.replace(stuck, job=suspended))
    assert condition(result, ConditionType.STUCK) == ("False", "Suspended", "Job suspended")


# --- the arrival channel ------------------------------------------------------------------------

ENDPOINT = PlanConfig(arrival_url="http://10.81.0.1:8082")


def test_arrivals_by_annotation_while_the_endpoint_is_served_are_said() -> None:
    status = restarting_status(epoch=1)
    observed = gang(status=status, pods=[worker(0, 1), worker(1, 1), worker(2, 0)])
    result = plan(observed, ENDPOINT)
    status_, reason, message = condition(result, ConditionType.ARRIVAL_DEGRADED) or ("", "", "")
    assert (status_, reason) == ("True", "ArrivalEndpointUnreachable")
    assert message.startswith("2 of 3 workers arrived at epoch 1 by pod annotation")
    assert "http://10.81.0.1:8082" in message
    assert ("ArrivalEndpointUnreachable", message) in warnings(observed, ENDPOINT)
    no_repeat(observed, ENDPOINT)
    # Without the endpoint, annotations are the channel: nothing to say.
    assert condition(plan(observed), ConditionType.ARRIVAL_DEGRADED) is None


def test_a_degraded_channel_says_hangs_go_unseen_when_they_are_watched() -> None:
    status = restarting_status(epoch=1)
    pods = [worker(0, 1), worker(1, 1), worker(2, 0)]
    watched = gang(status=status, pods=pods, progress={"hangSeconds": 60})
    message = (condition(plan(watched, ENDPOINT), ConditionType.ARRIVAL_DEGRADED) or ("",) * 3)[2]
    assert "their hangs go unseen" in message
    unwatched = gang(status=status, pods=pods)
    message = (condition(plan(unwatched, ENDPOINT), ConditionType.ARRIVAL_DEGRADED) or ("",) * 3)[2]
    assert "hangs" not in message


def test_arrivals_through_the_endpoint_again_clear_it() -> None:
    status = restarting_status(epoch=1)
    observed = gang(status=status, pods=[worker(r, 1) for r in range(3)])
    degraded = carry_out(observed, plan(observed, ENDPOINT))
    assert degraded.job.status.barrier_epoch == 1
    # The next restart: every agent reports directly (its view says so, no annotation at 2).
    again = restarting_status(epoch=2).model_copy(
        update={"conditions": degraded.job.status.conditions}
    )
    reported = [worker(r, 1) for r in range(3)]
    observed = gang(status=again, pods=reported)
    direct = dataclasses.replace(
        observed, pods=[dataclasses.replace(p, arrived_epoch=2) for p in observed.pods]
    )
    result = plan(direct, ENDPOINT)
    assert (condition(result, ConditionType.ARRIVAL_DEGRADED) or ("",))[0] == "False"
