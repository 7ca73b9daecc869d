"""Unit tests of controller.policy.plan: the policy of DESIGN.md sections 3b and 5 as table tests,
and its invariants as hypothesis properties (idempotence, epochs never lowered, never two pods per
rank, worker counts bounded)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.constants import HISTORY_LIMIT, ConditionType
from api.v1alpha1 import (
    ConditionStatus,
    FailureAction,
    GangJob,
    GangJobStatus,
    Phase,
    RestartRecord,
    RestartTrigger,
)
from controller.policy.conditions import get_condition
from controller.policy.plan import (
    EventSpec,
    Observed,
    Plan,
    PlanConfig,
    PodDelete,
    plan,
)
from controller.policy.views import NodeView, PodView
from tests.unit.builders import JOB_NAME, T0, make_job, make_node, make_pod, with_status

NOW = T0 + timedelta(minutes=1, microseconds=250)
STAMP = NOW.replace(microsecond=0)


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
    assert result.requeue_after is None


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


def test_history_and_restarts_are_kept() -> None:
    record = RestartRecord(
        epoch=1,
        trigger=RestartTrigger(failure_class="ProcessExit", action=FailureAction.RESTART_GANG),
        detected_at=T0,
    )
    status = GangJobStatus(epoch=1, history=[record] * HISTORY_LIMIT, last_restart=record)
    result = plan(observe(with_status(make_job(replicas=1), status), [make_pod(0)]))
    assert result.status.history == [record] * HISTORY_LIMIT
    assert result.status.last_restart == record


# --- success and failure --------------------------------------------------------------------


def test_all_succeeded() -> None:
    pods = [make_pod(r, phase="Succeeded") for r in range(3)]
    result = plan(observe(make_job(replicas=3), pods))
    assert result.status.phase is Phase.SUCCEEDED
    assert result.status.completion_time == STAMP
    assert condition(result, ConditionType.SUCCEEDED) == (
        "True",
        "AllWorkersSucceeded",
        "All 3 workers succeeded",
    )
    assert condition(result, ConditionType.READY) == (
        "False",
        "JobFinished",
        "All 3 workers succeeded",
    )
    assert result.events == [EventSpec("Normal", "Succeeded", "All 3 workers succeeded")]
    assert result.delete_pods == []


def test_all_policy_waits_for_every_worker() -> None:
    pods = [make_pod(0, phase="Succeeded"), make_pod(1)]
    result = plan(observe(make_job(replicas=2), pods))
    assert result.status.phase is Phase.PENDING
    assert names(result) == []  # a succeeded worker is not recreated


def test_rank0_policy_succeeds_with_rank_0_and_frees_the_rest() -> None:
    pods = [make_pod(0, phase="Succeeded"), make_pod(1), make_pod(2, phase="Succeeded")]
    result = plan(observe(make_job(replicas=4, successPolicy="Rank0"), pods))
    assert result.status.phase is Phase.SUCCEEDED
    assert condition(result, ConditionType.SUCCEEDED) == (
        "True",
        "Rank0Succeeded",
        "Rank 0 succeeded",
    )
    # The running worker is deleted, the finished ones kept for their logs, rank 3 not created.
    assert result.delete_pods == [PodDelete(name="llama-1", uid="uid-1", reason="JobFinished")]
    assert names(result) == []


FAIL_ON_3 = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}


def test_a_non_retriable_exit_fails_the_job() -> None:
    pods = [make_pod(0), make_pod(1, phase="Failed", exit_code=3), make_pod(2, phase="Pending")]
    result = plan(observe(make_job(replicas=3, failurePolicy=FAIL_ON_3), pods))
    message = (
        "worker 1 (pod llama-1): container trainer exited with code 3 (Error); also PodFailed; "
        "spec.failurePolicy.rules[0] fails the job"
    )
    assert result.status.phase is Phase.FAILED
    assert result.status.completion_time == STAMP
    assert result.status.epoch == 0
    assert condition(result, ConditionType.FAILED) == ("True", "NonRetriableExitCode", message)
    assert result.events == [EventSpec("Warning", "Failed", message)]
    assert result.delete_pods == [
        PodDelete(name="llama-0", uid="uid-0", reason="JobFinished"),
        PodDelete(name="llama-2", uid="uid-2", reason="JobFinished"),
    ]
    assert [(d.worker, d.action) for d in result.failures] == [(1, FailureAction.FAIL_JOB)]


def test_a_worker_failing_while_deleted_is_no_failure() -> None:
    """Pods deleted (e.g. by suspend) end Failed; that is not the job failing."""
    result = plan(
        observe(make_job(replicas=2), [make_pod(0), make_pod(1, phase="Failed", terminating=True)])
    )
    assert result.status.phase is Phase.PENDING


def test_a_finished_job_stays_finished_and_creates_nothing() -> None:
    job = make_job(replicas=3, successPolicy="Rank0")
    first = plan(observe(job, [make_pod(0, phase="Succeeded"), make_pod(1)]))
    later = NOW + timedelta(hours=1)
    second = plan(
        observe(with_status(job, first.status), [make_pod(0, phase="Succeeded")], now=later)
    )
    assert second.status == first.status
    assert (second.create_pods, second.create_service, second.events) == ([], None, [])
    assert second.requeue_after is None


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


# --- properties -----------------------------------------------------------------------------

POD_PHASES = st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"])


@st.composite
def worlds(draw: st.DrawFn) -> Observed:
    """A GangJob in any state, and any mix of its pods, strays and a namesake's leftovers."""
    replicas = draw(st.integers(min_value=1, max_value=5))
    spec: dict[str, Any] = {
        "successPolicy": draw(st.sampled_from(["All", "Rank0"])),
        "suspend": draw(st.booleans()),
    }
    ttl = draw(st.none() | st.integers(min_value=0, max_value=300))
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    job = make_job(replicas=replicas, **spec)
    epoch = draw(st.integers(min_value=0, max_value=3))

    pods: list[dict[str, Any]] = []
    for rank in range(replicas + 2):
        kind = draw(st.sampled_from(["absent", "ours", "ours", "foreign"]))
        if kind == "absent":
            continue
        pods.append(
            make_pod(
                rank,
                phase=draw(POD_PHASES),
                ready=draw(st.booleans()),
                epoch=draw(st.none() | st.integers(min_value=0, max_value=epoch + 1)),
                terminating=draw(st.booleans()),
                owner_uid="other-uid" if kind == "foreign" else job.metadata.uid or "",
            )
        )
    if draw(st.booleans()):
        pods.append(make_pod(None, name="llama-norank"))
    if draw(st.booleans()):
        pods.append(make_pod(0, name="llama-copy", terminating=draw(st.booleans())))
    now = T0 + timedelta(seconds=draw(st.integers(min_value=0, max_value=600)), microseconds=7)
    observed = observe(job, pods, service=draw(st.booleans()), now=now)

    # A status from an earlier pass (possibly suspended or finished), at some epoch.
    if draw(st.booleans()):
        earlier_spec = job.spec.model_copy(update={"suspend": draw(st.booleans())})
        earlier = plan(
            dataclasses.replace(observed, job=job.model_copy(update={"spec": earlier_spec}))
        )
        status = earlier.status
    else:
        status = GangJobStatus()
    status = status.model_copy(update={"epoch": epoch})
    return dataclasses.replace(observed, job=with_status(job, status))


@settings(max_examples=400)
@given(worlds())
def test_plan_is_idempotent(observed: Observed) -> None:
    """Planning again, once the plan is carried out, changes nothing and repeats no event."""
    first = plan(observed)
    for deletions in (False, True):
        second = plan(carry_out(observed, first, deletions=deletions))
        assert second.create_pods == []
        assert second.create_service is None
        assert second.events == []
        assert second.status == first.status
        assert second.delete_job == first.delete_job
        if not deletions:
            assert second.delete_pods == first.delete_pods


@settings(max_examples=300)
@given(worlds())
def test_plan_converges(observed: Observed) -> None:
    """Carrying out plans, with deleted pods actually going away, reaches a fixed point."""
    result = plan(observed)
    for _ in range(3):
        observed = carry_out(observed, result)
        gone = {d.name for d in result.delete_pods}
        observed = dataclasses.replace(
            observed, pods=[p for p in observed.pods if p.name not in gone]
        )
        result = plan(observed)
    assert result.create_pods == []
    assert result.delete_pods == []
    assert plan(carry_out(observed, result)).status == result.status


@settings(max_examples=400)
@given(worlds())
def test_plan_invariants(observed: Observed) -> None:
    result = plan(observed)
    job = observed.job
    replicas = job.spec.replicas
    # Epochs never go down.
    assert result.status.epoch >= job.status.epoch
    # Never a second pod of a name, hence of a rank: created names are new and distinct.
    created = names(result)
    assert len(set(created)) == len(created)
    assert not set(created) & {p.name for p in observed.pods}
    assert set(created) <= {f"{JOB_NAME}-{r}" for r in range(replicas)}
    # A pod is deleted at most once, and only our own.
    deleted = [d.name for d in result.delete_pods]
    assert len(set(deleted)) == len(deleted)
    ours = {p.name for p in observed.pods if p.controller_uid == job.metadata.uid}
    assert set(deleted) <= ours
    # Counts are bounded by the gang.
    workers = result.status.workers
    assert 0 <= workers.ready <= workers.total <= replicas
    assert 0 <= workers.arrived <= workers.total
    assert len(result.status.history) <= HISTORY_LIMIT
    # Finished or suspended jobs create nothing.
    if result.status.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
        assert created == []
    # A finished job keeps its completion time; only a finished job may be deleted.
    if result.delete_job:
        assert result.status.completion_time is not None
    for cond in result.status.conditions:
        assert cond.status in set(ConditionStatus)
