"""The failure policy over the pass's workers: every failure at `status.epoch` classified, and
the job failed when a `FailJob` rule or `spec.restart.maxRestarts` says so (`NonRetriableExitCode`,
`FailurePolicy`, `MaxRestartsExceeded`) (docs/design.md sections 4.1-4.4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from api.constants import (
    REASON_FAILED,
    REASON_FAILURE_POLICY,
    REASON_MAX_RESTARTS,
    REASON_NON_RETRIABLE_EXIT,
    ConditionType,
)
from api.v1alpha1 import FailureAction, Phase
from controller.policy import classify, lifecycle, straggler
from controller.policy.classify import Decision
from controller.policy.gang import at_epoch, epoch_workers
from controller.policy.passstate import EventSpec, Pass, worker_text


def classify_failures(p: Pass) -> bool:
    """Every running role's workers' failures at `status.epoch`, classified. A worker below the
    epoch is restarting because of the protocol: its exits and restarts are no failure, so that
    one failure makes one bump however many workers then report it. A completed role's workers
    are done, and a waiting role's have no pods yet."""
    p.decisions.extend(_decisions(p))
    return False


def ignored_workers(p: Pass) -> set[int]:
    """The workers whose failure at `status.epoch` the policy ignores (`Ignore`), as
    `classify_failures` will decide: for the success policy, which runs before it."""
    if not any(r.action is FailureAction.IGNORE for r in p.job.spec.failure_policy.rules):
        return set()
    return {d.worker for d in _decisions(p) if d.action is FailureAction.IGNORE}


def _decisions(p: Pass) -> list[Decision]:
    base = classify.Context.of(
        p.job, p.effective_mode, p.status.epoch, p.status.barrier_epoch, p.status.barrier_opened_at
    )
    # Each role's own trainer container is the one whose exit is the worker's.
    stragglers = straggler.details(p)
    contexts = {
        role.name: dataclasses.replace(
            base, trainer=role.trainer_container_name, stragglers=stragglers
        )
        for role in p.job.spec.effective_roles
    }
    decisions: list[Decision] = []
    for rank in p.active():
        ctx = contexts[p.job.spec.workers[rank].role.name]
        pod = p.gang.workers.get(rank)
        if pod is None:
            # A role that joined the running gang creates its pods as it goes: one missing is
            # created again, as before the first barrier.
            # So is a worker an elastic resize adds (numbered past the epoch's world): it has
            # never run, and the resize's own bump creates it.
            spanned = epoch_workers(p.status)
            joining = p.job.spec.elasticity is not None and spanned is not None and rank >= spanned
            failure = None if p.started_late(rank) or joining else classify.missing(ctx, rank)
        elif not at_epoch(pod, p.status.epoch) or p.superseded(rank, pod):
            continue
        else:
            if pod.name in p.delete_pods and not pod.terminating:
                # Deleted by this very pass (its mode changed): judged as the next pass will
                # see it, terminating, so that replanning the outcome finds nothing new.
                pod = pod.evolve(deletion_timestamp=p.now)
            failure = classify.detect(ctx, rank, pod, p.node_of(pod))
        if failure is not None:
            decisions.append(classify.decide(p.job, failure))
    return decisions


def fail_by_policy(p: Pass) -> bool:
    """A `FailJob` rule, or a counted restart past `spec.restart.maxRestarts`, fails the job."""
    fails = [d for d in p.decisions if d.action is FailureAction.FAIL_JOB]
    first = classify.lowest(fails)
    if first is not None:
        reason = REASON_NON_RETRIABLE_EXIT if first.by_exit_code else REASON_FAILURE_POLICY
        message = (
            f"{worker_text(p, first.worker)}: {first.failure.detail}; "
            f"spec.failurePolicy.rules[{first.rule}] fails the job"
        )
        p.acted = fails
        return fail_job(p, reason, message)
    restarting = restarting_decisions(p.decisions)
    first = classify.lowest(restarting)
    limit = p.job.spec.restart.max_restarts
    if (
        first is not None
        and any(d.counted for d in restarting)
        and p.status.restarts.counted >= limit
    ):
        message = (
            f"{p.status.restarts.counted} counted restarts reached spec.restart.maxRestarts "
            f"({limit}); "
            f"last failure: {worker_text(p, first.worker)}: {first.failure.detail}"
        )
        p.acted = restarting
        return fail_job(p, REASON_MAX_RESTARTS, message)
    return False


def fail_job(p: Pass, reason: str, message: str) -> bool:
    """The job fails with `reason`: its condition, phase and Event, and its workers cleaned up
    as `spec.cleanPodPolicy` says."""
    lifecycle.finish(p, Phase.FAILED, ConditionType.FAILED, reason, message)
    p.events.append(EventSpec("Warning", REASON_FAILED, message))
    return lifecycle.finished(p)


def restarting_decisions(decisions: Sequence[Decision]) -> list[Decision]:
    """The decisions that restart the gang (recreating a worker restarts the others too)."""
    return [
        d
        for d in decisions
        if d.action in (FailureAction.RESTART_GANG, FailureAction.RECREATE_WORKER)
    ]
