"""`Reconciler.act`, the one place a plan turns into API calls: how it spends the apiserver."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from controller.k8s import GANGJOBS, NODES, PODS, SERVICES, NotFound
from controller.k8s.store import Store
from controller.manager import Manager
from controller.policy.plan import Plan, PodDelete
from controller.reconcile import Caches, Outcome, Reconciler
from controller.runtime import metrics
from tests.unit.builders import job_dict, make_job


class DeleteRecorder:
    """Takes pod deletes slowly enough to overlap, and counts how many were in flight at once."""

    def __init__(self, missing: set[str]) -> None:
        self.missing = missing
        self.in_flight = 0
        self.most_in_flight = 0
        self.deleted: list[tuple[str, str | None]] = []

    async def delete(self, kind: Any, name: str, namespace: str | None = None, **kw: Any) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if name in self.missing:
                raise NotFound(404, "NotFound", f"pods {name!r} not found")
            self.deleted.append((name, kw.get("uid")))
        finally:
            self.in_flight -= 1


async def test_a_pass_deletes_its_pods_side_by_side_within_the_write_slots() -> None:
    api = DeleteRecorder(missing={"j-3"})
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    reconciler = Reconciler(cast(Any, api), caches, pod_write_concurrency=4)
    job = make_job(replicas=10)
    deletes = [PodDelete(f"j-{i}", f"uid-{i}") for i in range(10)]
    decided = Plan(
        status=job.status, create_service=None, create_pods=[], delete_pods=deletes, events=[]
    )

    out = await reconciler.act(job, job_dict(10), decided)

    # One by one, a Recreate of 5000 workers spent ~170 s deleting; unbounded, a pass would put
    # 5000 requests in flight at once.
    assert api.most_in_flight == 4
    assert sorted(api.deleted) == sorted((d.name, d.uid) for d in deletes if d.name != "j-3")
    assert out.deleted == 9  # the pod already gone is not counted


def _share_sum(step: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "gangjob_restart_controller_seconds_sum", {"step": step}
    )
    return value or 0.0


def test_the_controller_share_ends_when_the_status_write_returns_not_with_the_pass() -> None:
    # A Recreate pass writes the new epoch, then deletes the gang: the deletes are not the
    # controller's reaction time to the failure.
    before = _share_sum("bump")
    since = time.monotonic() - 30.0
    outcome = Outcome(status_written=True, epoch_bumped=True, status_written_at=since + 0.25)
    Manager._report_share("ml/llama", since, outcome)
    assert _share_sum("bump") - before == pytest.approx(0.25)
