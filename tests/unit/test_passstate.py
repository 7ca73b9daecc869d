"""A pass keeps `active()` and `staying()` between calls (a pass asks ~45 times, each an O(N)
walk), and they follow what the pass changes: a pod it deletes, a role it starts or completes."""

from __future__ import annotations

from api.v1alpha1 import RoleState
from controller.policy.gang import arrived_by_barrier, sort_pods
from controller.policy.passstate import Pass, RoleProgress
from controller.policy.plan import PlanConfig
from controller.policy.views import PodView
from tests.unit.gangs import gang


def a_pass(replicas: int = 3) -> Pass:
    observed = gang(replicas=replicas)
    status = observed.job.status.model_copy(deep=True)
    return Pass(
        observed=observed,
        config=PlanConfig(),
        gang=sort_pods(observed.job, arrived_by_barrier(observed.pods, observed.job.status)),
        status=status,
    )


def test_staying_follows_the_pods_the_pass_deletes() -> None:
    p = a_pass()
    assert sorted(p.staying()) == [0, 1, 2]
    assert p.staying() is p.staying()  # kept between calls
    pod: PodView = p.staying()[1]
    p.delete(pod, "test")
    assert sorted(p.staying()) == [0, 2]


def test_active_follows_the_roles_the_pass_starts_and_completes() -> None:
    p = a_pass()
    assert list(p.active()) == []  # the role is not running yet in this pass
    p.roles["worker"] = RoleProgress(RoleState.RUNNING)
    assert list(p.active()) == [0, 1, 2]
    assert p.active() is p.active()
    p.roles["worker"] = RoleProgress(RoleState.COMPLETE)
    assert list(p.active()) == []
