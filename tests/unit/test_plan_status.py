"""The pass writes its own copy of the status: the observed job, shared with the informer's
cache, is never changed by planning."""

from __future__ import annotations

from api.v1alpha1 import dump_status
from controller.policy.plan import plan
from tests.unit.gangs import crashed, gang, running_status, worker


def test_planning_a_restart_leaves_the_observed_status_as_it_was() -> None:
    pods = [crashed(worker(0, 2)), worker(1, 2), worker(2, 2)]
    observed = gang(status=running_status(2, avoid_nodes=["n-old"]), pods=pods)
    before = dump_status(observed.job.status)
    result = plan(observed)
    assert result.status.epoch == 3  # the pass did write: a restart
    assert result.status.last_restart is not None
    assert dump_status(observed.job.status) == before
    assert result.status is not observed.job.status
