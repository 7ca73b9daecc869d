"""Unit tests of `controller.policy.plan` as a whole: its invariants as hypothesis properties
over any mix of a gang's pods, strays and status (idempotence, convergence, epochs never
lowered, never two pods per rank, worker counts bounded). The table tests of each policy are
in tests/unit/test_policy_<name>.py."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.constants import HISTORY_LIMIT
from api.v1alpha1 import (
    ConditionStatus,
    GangJobStatus,
    Phase,
)
from controller.policy.plan import Observed, plan
from tests.unit.builders import JOB_NAME, T0, make_job, make_pod, with_status
from tests.unit.gangs import (
    GANG_NOW,
    carry_out,
    crashed,
    gang,
    names,
    observe,
    restarting_status,
    running_status,
    worker,
)

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


@st.composite
def restarts(draw: st.DrawFn) -> Observed:
    """A whole gang mid-run or mid-restart: each worker arrived at the epoch or the one before,
    some crashed, in either restart mode; most of their plans ask for nothing but the status.

    A trainer's exit carries its time, as kubelets write it, a second or more before the pass:
    one of the barrier's own second is judged new once the barrier is open
    (`classify._of_this_epoch`), which planning the same observation again cannot tell from
    the restart the worker came back from; the pod's next change decides it."""
    replicas = draw(st.integers(min_value=1, max_value=4))
    epoch = draw(st.integers(min_value=1, max_value=3))
    shut = draw(st.booleans())
    status = restarting_status(epoch) if shut else running_status(epoch)
    now = GANG_NOW + timedelta(seconds=draw(st.integers(min_value=0, max_value=900)))
    pods = []
    for rank in range(replicas):
        pod = worker(rank, draw(st.sampled_from([epoch, epoch - 1, None])))
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            pod = crashed(pod, draw(st.sampled_from([1, 137])))
            ended = now - timedelta(seconds=draw(st.integers(min_value=1, max_value=600)))
            terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
            terminated["finishedAt"] = ended.strftime("%Y-%m-%dT%H:%M:%SZ")
        pods.append(pod)
    mode = draw(st.sampled_from(["Pod", "Process"]))
    return gang(replicas, status, pods, now=now, restart={"mode": mode})


@settings(max_examples=400)
@given(worlds() | restarts())
def test_a_settled_plan_planned_again_over_its_status_alone_decides_nothing_new(
    observed: Observed,
) -> None:
    """The echo of a settled pass's write gets no pass (controller.manager): what the status
    changed must be all there was to decide, and no timer may fall sooner."""
    first = plan(observed)
    if not first.settled():
        return
    job = observed.job.model_copy(update={"status": first.status})
    again = plan(dataclasses.replace(observed, job=job))
    assert again.status == first.status
    assert again.events == []
    assert again.settled()
    assert again.restart_started is None
    assert again.restart_finished is None
    if again.requeue_after is not None:
        assert first.requeue_after is not None
        assert again.requeue_after >= first.requeue_after


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
    replicas = len(job.spec.workers)
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
