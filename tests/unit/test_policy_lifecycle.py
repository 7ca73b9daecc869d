"""Unit tests of `controller.policy.lifecycle` through `plan` (docs/design.md sections 3b and
5.2): creating the Service and the workers, stray pods, a job being deleted, the phase and the
`Ready` condition, a finished job and its TTL, suspend and resume, a template that cannot make
workers, and what `finish_pod` adds to a worker (restart mode, avoided nodes)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api.constants import ConditionType
from api.v1alpha1 import (
    GangJobStatus,
    Phase,
    RestartMode,
)
from controller.policy.conditions import get_condition
from controller.policy.lifecycle import finish_pod
from controller.policy.plan import EventSpec, Plan, PlanConfig, PodDelete, PodStop, plan
from tests.unit.builders import JOB_NAME, T0, make_job, make_node, make_pod, with_status
from tests.unit.gangs import (
    NOW,
    STAMP,
    carry_out,
    condition,
    crashed,
    gang,
    names,
    new_gang,
    observe,
    running_status,
    worker,
)

# --- creation -------------------------------------------------------------------------------


def test_a_new_job_creates_its_service_and_every_worker() -> None:
    result = plan(observe(make_job(replicas=3), service=False))
    assert result.create_service is not None
    assert result.create_service["metadata"]["name"] == JOB_NAME
    assert names(result) == ["llama-0", "llama-1", "llama-2"]
    assert result.delete_pods == []
    assert result.events == [EventSpec("Normal", "WorkersCreated", "Created 3 worker pod(s)")]
    status = result.status
    assert status.phase is Phase.PENDING
    assert status.epoch == 0
    assert status.start_time == STAMP
    assert status.observed_generation == 1
    assert (status.workers.total, status.workers.ready, status.workers.arrived) == (3, 0, 0)
    assert condition(result, ConditionType.READY) == (
        "False",
        "WorkersNotReady",
        "0/3 workers ready",
    )
    assert not result.delete_job
    # Looked at again while the barrier waits: what makes a gang stuck may come with no event.
    assert result.requeue_after == PlanConfig().recheck_seconds


def test_only_missing_ranks_are_created() -> None:
    result = plan(observe(make_job(replicas=4), [make_pod(0), make_pod(2)]))
    assert result.create_service is None
    assert names(result) == ["llama-1", "llama-3"]
    assert result.events == [EventSpec("Normal", "WorkersCreated", "Created 2 worker pod(s)")]


def test_a_terminating_pod_still_holds_its_name() -> None:
    result = plan(observe(make_job(replicas=2), [make_pod(0), make_pod(1, terminating=True)]))
    assert names(result) == []
    assert result.delete_pods == []
    # It is no working worker, though.
    assert result.status.workers.total == 1


def test_a_foreign_pod_holds_its_name_but_is_not_ours() -> None:
    """Leftovers of a deleted namesake GangJob are neither counted, nor deleted, nor doubled."""
    foreign = make_pod(1, owner_uid="other-uid", phase="Succeeded")
    result = plan(observe(make_job(replicas=2), [make_pod(0), foreign]))
    assert names(result) == []
    assert result.delete_pods == []
    assert result.status.workers.total == 1
    assert result.status.phase is Phase.PENDING  # and not Succeeded


def test_created_pods_carry_the_epoch_they_were_created_at() -> None:
    job = with_status(make_job(replicas=1), GangJobStatus(epoch=5))
    (pod,) = plan(observe(job)).create_pods
    assert pod["metadata"]["annotations"]["gangjob.io/created-epoch"] == "5"


def test_agent_image_from_config_reaches_podspec() -> None:
    # The restart modes are not built yet; the config must at least be accepted and passed on.
    result = plan(observe(make_job(replicas=1)), PlanConfig(agent_image="example/agent:1"))
    assert names(result) == ["llama-0"]


def test_stray_pods_are_deleted() -> None:
    pods = [
        make_pod(0),
        make_pod(1),
        make_pod(5),  # scaled away
        make_pod(None, name="llama-x"),  # no rank
        make_pod(1, name="llama-copy"),  # a second pod claiming rank 1
        make_pod(7, terminating=True),  # already going
    ]
    result = plan(observe(make_job(replicas=2), pods))
    assert result.delete_pods == [
        PodDelete(name="llama-5", uid="uid-5", reason="StrayPod"),
        PodDelete(name="llama-x", uid="uid-llama-x", reason="StrayPod"),
        PodDelete(name="llama-copy", uid="uid-llama-copy", reason="StrayPod"),
    ]
    assert names(result) == []
    assert result.status.workers.total == 2


def test_a_job_being_deleted_gets_nothing_new() -> None:
    job = make_job(replicas=2)
    job = job.model_copy(
        update={"metadata": job.metadata.model_copy(update={"deletion_timestamp": T0})}
    )
    result = plan(observe(job, [make_pod(0)], service=False))
    assert (result.create_service, result.create_pods, result.events) == (None, [], [])


def test_an_invalid_template_is_reported_once_and_creates_nothing() -> None:
    observed = new_gang([make_node()], restart={"mode": "Process"})
    del observed.job.spec.effective_roles[0].template["spec"]["containers"][0]["command"]
    result = plan(observed)
    assert result.create_pods == []
    ready = condition(result, ConditionType.READY)
    assert ready is not None
    assert ready[:2] == ("False", "TrainerCommandRequired")
    assert [e.reason for e in result.events] == ["TrainerCommandRequired"]
    assert plan(carry_out(observed, result)).events == []


def test_the_avoided_nodes_join_every_node_selector_term_of_the_template() -> None:
    pod = {
        "metadata": {},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["n"]}
                                ]
                            },
                        ]
                    }
                }
            }
        },
    }
    finished = finish_pod(pod, RestartMode.PROCESS, ["bad"])
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad"]}
    terms = finished["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchExpressions"][-1] for t in terms] == [avoid, avoid]
    assert "matchFields" in terms[1]
    assert finished["metadata"]["annotations"]["gangjob.io/restart-mode"] == "Process"


# --- phase and counts -----------------------------------------------------------------------


def test_running_once_every_worker_is_running_and_ready() -> None:
    job = with_status(make_job(replicas=3), GangJobStatus(epoch=2))
    pods = [make_pod(0, epoch=2), make_pod(1, epoch=2), make_pod(2, epoch=1)]
    result = plan(observe(job, pods))
    assert result.status.phase is Phase.RUNNING
    assert result.status.epoch == 2
    assert (result.status.workers.total, result.status.workers.ready) == (3, 3)
    assert result.status.workers.arrived == 2
    assert condition(result, ConditionType.READY) == (
        "True",
        "AllWorkersReady",
        "3/3 workers ready",
    )
    assert result.events == []


def test_pending_while_a_worker_is_not_ready() -> None:
    pods = [make_pod(0), make_pod(1, ready=False), make_pod(2, phase="Pending")]
    result = plan(observe(make_job(replicas=3), pods))
    assert result.status.phase is Phase.PENDING
    assert result.status.workers.ready == 1
    assert condition(result, ConditionType.READY) == (
        "False",
        "WorkersNotReady",
        "1/3 workers ready",
    )


def test_ready_keeps_its_transition_time_while_the_count_changes() -> None:
    job = make_job(replicas=3)
    first = plan(observe(job, [make_pod(0), make_pod(1, ready=False), make_pod(2, ready=False)]))
    later = NOW + timedelta(minutes=5)
    job = with_status(job, first.status)
    second = plan(observe(job, [make_pod(0), make_pod(1), make_pod(2, ready=False)], now=later))
    ready = get_condition(second.status.conditions, ConditionType.READY)
    assert ready is not None
    assert ready.message == "2/3 workers ready"
    assert ready.last_transition_time == STAMP


# --- finished -------------------------------------------------------------------------------


def test_a_finished_job_stays_finished_and_creates_nothing() -> None:
    job = make_job(replicas=3, successPolicy="Rank0")
    first = plan(observe(job, [make_pod(0, phase="Succeeded"), make_pod(1)]))
    later = NOW + timedelta(hours=1)
    # Rank 1, still running, was stopped: its pod is kept, Failed.
    stopped = {**make_pod(1, phase="Failed"), "spec": {"activeDeadlineSeconds": 1}}
    second = plan(
        observe(
            with_status(job, first.status),
            [make_pod(0, phase="Succeeded"), stopped],
            now=later,
        )
    )
    kept = ("phase", "epoch", "conditions", "completion_time", "restarts")
    assert [getattr(second.status, k) for k in kept] == [getattr(first.status, k) for k in kept]
    assert (second.create_pods, second.create_service, second.events) == ([], None, [])
    assert (second.delete_pods, second.stop_pods) == ([], [])
    assert second.requeue_after is None


# --- cleanPodPolicy -------------------------------------------------------------------------


def _rank0_done(policy: str | None, mode: str = "Pod") -> Plan:
    """Rank 0 succeeded (Rank0 policy); rank 1 trains on; rank 2's trainer has ended (exit 0,
    its sidecar still stopping); rank 3 already stopped."""
    spec: dict[str, Any] = {"successPolicy": "Rank0", "restart": {"mode": mode}}
    if policy is not None:
        spec["cleanPodPolicy"] = policy
    stopped = worker(3, 0)
    stopped["spec"]["activeDeadlineSeconds"] = 1
    pods = [worker(0, 0, phase="Succeeded"), worker(1, 0), crashed(worker(2, 0), 0), stopped]
    status = running_status().model_copy(update={"mode": RestartMode(mode)})
    return plan(gang(4, status, pods, **spec))


def test_a_finished_job_stops_its_running_workers_and_keeps_every_pod_by_default() -> None:
    result = _rank0_done(None)
    assert result.status.phase is Phase.SUCCEEDED
    assert result.delete_pods == []
    # Only the worker that still trains: the one whose trainer ended ends on its own, as it
    # would have (stopped, its pod would say DeadlineExceeded), and rank 3 was stopped before.
    assert result.stop_pods == [PodStop(name="llama-1", uid="uid-1", reason="JobFinished")]


def test_clean_pod_policy_running_deletes_the_pods_still_running() -> None:
    result = _rank0_done("Running")
    assert [d.name for d in result.delete_pods] == ["llama-1", "llama-2", "llama-3"]
    assert result.stop_pods == []


def test_clean_pod_policy_all_deletes_every_pod() -> None:
    result = _rank0_done("All")
    assert [d.name for d in result.delete_pods] == ["llama-0", "llama-1", "llama-2", "llama-3"]
    assert result.stop_pods == []


def test_a_process_mode_worker_that_reported_its_exit_is_left_to_end_on_its_own() -> None:
    # In Process mode the trainer's container is the agent's: it runs on after the trainer's
    # exit, until it sees the job finished.
    spec: dict[str, Any] = {"successPolicy": "Rank0", "restart": {"mode": "Process"}}
    reported = worker(1, 0)
    reported["metadata"]["annotations"]["gangjob.io/exit"] = "0:0"
    pods = [worker(0, 0, phase="Succeeded"), reported, worker(2, 0)]
    status = running_status().model_copy(update={"mode": RestartMode.PROCESS})
    result = plan(gang(3, status, pods, **spec))
    assert result.status.phase is Phase.SUCCEEDED
    assert [s.name for s in result.stop_pods] == ["llama-2"]


# --- TTL ------------------------------------------------------------------------------------


def test_ttl_requeues_until_it_elapses_then_deletes_the_job() -> None:
    job = make_job(replicas=1, ttlSecondsAfterFinished=100)
    finished = plan(observe(job, [make_pod(0, phase="Succeeded")]))
    assert not finished.delete_job
    # From the completion time as stored (whole seconds), not from the precise now.
    assert finished.requeue_after == (STAMP + timedelta(seconds=100) - NOW).total_seconds()
    job = with_status(job, finished.status)
    waiting = plan(
        observe(job, [make_pod(0, phase="Succeeded")], now=STAMP + timedelta(seconds=40))
    )
    assert (waiting.delete_job, waiting.requeue_after) == (False, 60)
    due = plan(observe(job, [make_pod(0, phase="Succeeded")], now=STAMP + timedelta(seconds=100)))
    assert due.delete_job


def test_ttl_zero_deletes_at_once() -> None:
    result = plan(
        observe(make_job(replicas=1, ttlSecondsAfterFinished=0), [make_pod(0, phase="Succeeded")])
    )
    assert result.status.phase is Phase.SUCCEEDED
    assert result.delete_job


# --- suspend --------------------------------------------------------------------------------


def test_suspend_deletes_every_worker_and_resume_recreates_them() -> None:
    job = make_job(replicas=2, suspend=True)
    pods = [make_pod(0), make_pod(1, phase="Succeeded")]
    suspended = plan(observe(job, pods))
    assert suspended.status.phase is Phase.SUSPENDED
    assert condition(suspended, ConditionType.SUSPENDED) == ("True", "Suspended", "Job suspended")
    assert condition(suspended, ConditionType.READY) == ("False", "Suspended", "Job suspended")
    assert [d.name for d in suspended.delete_pods] == ["llama-0", "llama-1"]
    assert suspended.events == [EventSpec("Normal", "Suspended", "Job suspended: deleting workers")]
    assert suspended.create_pods == []
    assert suspended.status.workers.total == 0

    # Suspended still: no second Suspended event.
    job = with_status(job, suspended.status)
    again = plan(observe(job, [], now=NOW + timedelta(seconds=30)))
    assert again.events == []
    assert again.status == suspended.status

    resumed_job = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": False})})
    resumed = plan(observe(resumed_job, [], now=NOW + timedelta(seconds=60)))
    assert resumed.status.phase is Phase.PENDING
    assert condition(resumed, ConditionType.SUSPENDED) == ("False", "Resumed", "Job resumed")
    assert names(resumed) == ["llama-0", "llama-1"]
    assert resumed.events == [
        EventSpec("Normal", "Resumed", "Job resumed"),
        EventSpec("Normal", "WorkersCreated", "Created 2 worker pod(s)"),
    ]


def test_a_job_created_suspended_creates_nothing() -> None:
    result = plan(observe(make_job(replicas=2, suspend=True), service=False))
    assert (result.create_service, result.create_pods) == (None, [])
    assert result.status.phase is Phase.SUSPENDED
    assert result.status.start_time is None
