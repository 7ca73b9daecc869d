"""`spec.activeDeadlineSeconds`: a job running longer than this fails with reason
`DeadlineExceeded`, as a Kubernetes Job does (docs/design.md section 4.4). The clock starts at
`status.startTime` and never stops: restarts, recreated workers and scheduling all count, since
the point of a deadline is to bound what the job holds."""

from __future__ import annotations

from datetime import timedelta

from api.constants import REASON_DEADLINE_EXCEEDED
from controller.policy import failure
from controller.policy.passstate import Pass


def enforce(p: Pass) -> bool:
    """Fails the job at its deadline; before it, has the job reconciled again when it falls."""
    limit = p.job.spec.active_deadline_seconds
    started = p.status.start_time
    if limit is None or started is None:
        return False
    remaining = (started + timedelta(seconds=limit) - p.now).total_seconds()
    if remaining > 0:
        p.requeue(remaining)
        return False
    message = (
        f"The job ran for longer than spec.activeDeadlineSeconds ({limit}s) since "
        f"{started.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    )
    return failure.fail_job(p, REASON_DEADLINE_EXCEEDED, message)
