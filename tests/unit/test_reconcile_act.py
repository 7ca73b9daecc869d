"""`Reconciler.act`, the one place a plan turns into API calls: how it spends the apiserver."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from typing import Any, cast

import pytest

from api.v1alpha1 import (
    GangJob,
    GangJobStatus,
    GoodputStatus,
    ProgressStatus,
    WorkersStatus,
    dump_status,
)
from controller.arrivals.server import state_line
from controller.k8s import GANGJOBS, NODES, PODS, SERVICES, AlreadyExists, Forbidden, NotFound
from controller.k8s.store import BY_GANGJOB, Store, StoreEvent, gangjob_index
from controller.manager import Manager, Settings
from controller.policy.plan import Observed, Plan, PlanConfig, PodDelete, plan
from controller.reconcile import (
    COUNT_WRITE_BUDGET,
    REFUSED_RETRY_SECONDS,
    Caches,
    Outcome,
    Reconciler,
    progress_only,
    quiet_only,
    refresh_only,
)
from controller.runtime import metrics
from tests.unit.builders import T0, job_dict, make_job, with_status
from tests.unit.gangs import running_status


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


def _write_sum(step: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "gangjob_restart_controller_write_seconds_sum", {"step": step}
    )
    return value or 0.0


def test_the_share_counts_the_status_writes_own_latency_apart() -> None:
    before, written_before = _share_sum("bump"), _write_sum("bump")
    since = time.monotonic() - 30.0
    outcome = Outcome(
        status_written=True, epoch_bumped=True, status_written_at=since + 0.5,
        status_write_seconds=0.4,
    )  # fmt: skip
    Manager._report_share("ml/llama", since, outcome)
    assert _share_sum("bump") - before == pytest.approx(0.5)
    assert _write_sum("bump") - written_before == pytest.approx(0.4)


def test_the_barrier_share_runs_from_the_last_arrival_not_from_an_earlier_one() -> None:
    # The gang was dirty since an earlier report, which waited REPORT_COALESCE; the last
    # arrival's pass ran at once. The share is the controller's reaction to the last arrival.
    before = _share_sum("barrier")
    since = time.monotonic() - 30.0
    outcome = Outcome(status_written=True, barrier_opened=True, status_written_at=since + 0.9)
    Manager._report_share("ml/llama", since, outcome, last_arrival=since + 0.7)
    assert _share_sum("barrier") - before == pytest.approx(0.2)
    # By annotation (no report completed it): from the first event, as before.
    Manager._report_share("ml/llama", since, outcome)
    assert _share_sum("barrier") - before == pytest.approx(0.2 + 0.9)


class CreateRecorder:
    """Records creates in order; `existing` objects answer AlreadyExists, then `get`."""

    def __init__(self, existing: dict[str, dict[str, Any]] | None = None) -> None:
        self.existing = existing or {}
        self.created: list[tuple[str, str]] = []

    async def create(self, kind: Any, obj: dict[str, Any], namespace: str | None = None) -> Any:
        name = obj["metadata"].get("name", "")
        if f"{kind.kind}/{name}" in self.existing:
            raise AlreadyExists(409, "AlreadyExists", f"{kind.plural} {name!r} already exists")
        self.created.append((kind.kind, name))
        return obj

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Any:
        return self.existing[f"{kind.kind}/{name}"]

    async def patch_status(self, *args: Any, **kw: Any) -> dict[str, Any]:
        """The pass's status write (the GangScheduling condition)."""
        return {}


def _gang_plan(job: GangJob) -> Plan:
    observed = Observed(job=job, pods=[], nodes={}, service_exists=True, now=T0)
    return plan(observed, PlanConfig(pod_groups_served=True))


async def test_the_workload_then_the_pod_group_are_created_before_the_pods() -> None:
    api = CreateRecorder()
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    job = make_job(replicas=2)
    await Reconciler(cast(Any, api), caches).act(job, job_dict(2), _gang_plan(job))
    order = [kind for kind, _ in api.created if kind in ("Workload", "PodGroup", "Pod")]
    assert order == ["Workload", "PodGroup", "Pod", "Pod"]


async def test_a_pod_group_left_by_a_namesake_holds_the_workers_back() -> None:
    job = make_job(replicas=2)
    theirs = {"metadata": {"ownerReferences": [{"uid": "another-job", "controller": True}]}}
    ours = {"metadata": {"ownerReferences": [{"uid": job.metadata.uid, "controller": True}]}}

    def caches_of(api: CreateRecorder) -> Caches:
        return Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))

    api = CreateRecorder({"Workload/llama-of-2": ours, "PodGroup/llama-of-2": theirs})
    with pytest.raises(
        RuntimeError, match=r"PodGroup .*/llama-of-2 exists but is not this GangJob's"
    ):
        await Reconciler(cast(Any, api), caches_of(api)).act(job, job_dict(2), _gang_plan(job))
    assert [k for k, _ in api.created if k == "Pod"] == []
    # Found there already and ours (a pass that died half-way): the workers are created.
    api = CreateRecorder({"Workload/llama-of-2": ours, "PodGroup/llama-of-2": ours})
    await Reconciler(cast(Any, api), caches_of(api)).act(job, job_dict(2), _gang_plan(job))
    assert [k for k, _ in api.created if k == "Pod"] == ["Pod", "Pod"]


class QuotaRecorder(CreateRecorder):
    """Admits `room` pods, then answers as a ResourceQuota does."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.events: list[str] = []

    async def create(self, kind: Any, obj: dict[str, Any], namespace: str | None = None) -> Any:
        if kind.kind == "Event":
            self.events.append(obj["reason"])
            return obj
        if kind.kind == "Pod":
            if self.room == 0:
                name = obj["metadata"]["name"]
                raise Forbidden(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: q')
            self.room -= 1
        return await super().create(kind, obj, namespace)


async def test_a_refused_worker_pod_is_remembered_for_plan_and_tried_again_soon() -> None:
    api = QuotaRecorder(room=1)
    kube = cast(Any, api)
    pods = Store(kube, PODS, indexers={BY_GANGJOB: gangjob_index})
    caches = Caches(Store(kube, GANGJOBS), pods, Store(kube, NODES), Store(kube, SERVICES))
    reconciler = Reconciler(cast(Any, api), caches)
    job = make_job(replicas=2)
    decided = plan(Observed(job=job, pods=[], nodes={}, service_exists=True, now=T0))
    out = await reconciler.act(job, job_dict(2), decided)
    assert out.created == 1
    assert out.requeue_after == REFUSED_RETRY_SECONDS
    assert "WorkersCreated" not in api.events  # it would say 2
    refusal = reconciler.observe(job_dict(2)).creation_refused
    assert refusal == '403 Forbidden: pods "llama-1" is forbidden: exceeded quota: q'
    # Room again: created, and the refusal forgotten.
    api.room = 1
    decided = plan(Observed(job=job, pods=[], nodes={}, service_exists=True, now=T0))
    await reconciler.act(job, job_dict(2), dataclasses.replace(decided, create_pods=[]))
    assert reconciler.observe(job_dict(2)).creation_refused is not None  # nothing tried
    retry = dataclasses.replace(decided, create_pods=decided.create_pods[1:])
    await reconciler.act(job, job_dict(2), retry)
    assert reconciler.observe(job_dict(2)).creation_refused is None


def test_counts_in_the_ready_and_stuck_messages_are_progress_a_new_cause_is_not() -> None:
    def status(ready: str, stuck_reason: str, stuck: str, arrived: int) -> dict[str, Any]:
        return {
            "epoch": 0,
            "workers": {"total": 5000, "arrived": arrived},
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "WorkersNotReady", "message": ready},
                {"type": "Stuck", "status": "True", "reason": stuck_reason, "message": stuck},
            ],
        }

    before = status("10/5000 workers ready", "BarrierStalled", "4990 of 5000 workers ...", 10)
    later = status("20/5000 workers ready", "BarrierStalled", "4980 of 5000 workers ...", 20)
    assert progress_only(before, later)  # throttled with the counts: every agent reads it
    other = status("20/5000 workers ready", "AgentCrashLooping", "The agent keeps ...", 20)
    assert not progress_only(before, other)


def test_each_roles_counts_are_progress_its_state_and_size_are_not() -> None:
    def status(ready: int, arrived: int, state: str = "Running", replicas: int = 1000) -> Any:
        return {
            "epoch": 3,
            "workers": {"total": 1000, "ready": ready, "arrived": arrived},
            "roles": [
                {"name": "worker", "state": state, "replicas": replicas, "ready": ready,
                 "arrived": arrived, "succeeded": 0, "failed": 0},
                {"name": "ps", "state": "Running", "replicas": 2, "ready": 2, "arrived": 2},
            ],
            "rolesReady": f"worker {ready}/{replicas}, ps 2/2",
        }  # fmt: skip

    # What a pass writes each second of an in-place restart, as the workers come back.
    assert progress_only(status(998, 0), status(791, 1))
    assert quiet_only(status(998, 0), status(791, 1))
    # What a pass reads back (plan, the barrier's count): never throttled, never quiet.
    assert not progress_only(status(1000, 1000), status(1000, 1000, state="Complete"))
    assert not progress_only(status(1000, 1000), status(1000, 1000, replicas=900))


class StatusRecorder:
    """Takes status writes and answers each with the next resourceVersion, as the apiserver."""

    def __init__(self) -> None:
        self.version = 100
        self.written: list[dict[str, Any]] = []

    async def patch_status(self, kind: Any, name: str, body: Any, ns: Any = None) -> Any:
        self.version += 1
        self.written.append(body["status"])
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}


class SlowStatus(StatusRecorder):
    """An apiserver that answers each status write `delay` seconds late."""

    delay = 0.0

    async def patch_status(self, kind: Any, name: str, body: Any, ns: Any = None) -> Any:
        await asyncio.sleep(self.delay)
        return await super().patch_status(kind, name, body, ns)


async def test_counts_wait_longer_after_a_slow_write_and_the_protocol_never_waits() -> None:
    api = SlowStatus()
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    reconciler = Reconciler(cast(Any, api), caches, progress_interval=0.01)
    running = running_status(epoch=3)
    job, obj = with_status(make_job(replicas=2), running), job_dict(2, status=dump_status(running))

    def counts(arrived: int, epoch: int = 3) -> Plan:
        status = running.model_copy(
            update={"epoch": epoch, "workers": WorkersStatus(total=2, arrived=arrived)}
        )
        return Plan(status=status, create_service=None, create_pods=[], delete_pods=[], events=[])

    # A prompt apiserver: counts wait `progress_interval` after the last write, no longer.
    assert (await reconciler.act(job, obj, counts(1))).status_written
    quick = await reconciler.act(job, obj, counts(2))
    assert not quick.status_written
    assert quick.requeue_after is not None
    assert quick.requeue_after <= 0.01
    # A write that waited 0.1 s: the next counts wait 0.1 / COUNT_WRITE_BUDGET = 0.5 s.
    api.delay = 0.1
    await asyncio.sleep(0.02)
    slowly = await reconciler.act(job, obj, counts(2))
    assert slowly.status_written
    # The write's own latency, the apiserver's part of a restart step's share.
    assert slowly.status_write_seconds is not None
    assert 0.1 <= slowly.status_write_seconds < 0.2
    api.delay = 0.0
    slow = await reconciler.act(job, obj, counts(3))
    assert not slow.status_written
    assert slow.requeue_after is not None
    assert 0.1 / COUNT_WRITE_BUDGET - 0.05 < slow.requeue_after < 0.1 / COUNT_WRITE_BUDGET + 0.05
    # What a pass decides (here the epoch) is written at once, however slow the last write was.
    assert (await reconciler.act(job, obj, counts(3, epoch=4))).status_written
    assert len(api.written) == 3


async def test_the_echo_of_a_quiet_write_needs_no_pass_and_no_other_write_does() -> None:
    api = StatusRecorder()
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    reconciler = Reconciler(cast(Any, api), caches)
    running = running_status(epoch=3, progress=ProgressStatus(step=100, updated_at=T0))
    job = with_status(make_job(replicas=2), running)
    obj = job_dict(2, status=dump_status(running))
    key = f"{job.metadata.namespace}/{job.metadata.name}"

    def echo(version: int) -> dict[str, Any]:
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}

    def decided(status: GangJobStatus) -> Plan:
        return Plan(status=status, create_service=None, create_pods=[], delete_pods=[], events=[])

    later = T0 + dt.timedelta(seconds=30)
    refreshed = running.model_copy(
        update={
            "progress": ProgressStatus(step=160, updated_at=later),
            "goodput": GoodputStatus(wall_seconds=30.0, productive_seconds=30.0, ratio=1.0),
        }
    )
    out = await reconciler.act(job, obj, decided(refreshed))
    assert out.status_written
    assert set(api.written[-1]) == {"progress", "goodput"}
    assert reconciler.echo_of_quiet_write(key, echo(101))
    # Another writer's change after ours, or a job of the same name made again: a pass.
    assert not reconciler.echo_of_quiet_write(key, echo(102))
    assert not reconciler.echo_of_quiet_write("ml/other", echo(101))
    # The arrived counts of a restart, written each second while its workers arrive: no pass
    # decides anything from them, so their echo needs none either.
    counted = refreshed.model_copy(update={"workers": WorkersStatus(total=2, arrived=1)})
    reconciler.progress_interval = 0.0
    job, obj = with_status(job, refreshed), job_dict(2, status=dump_status(refreshed))
    await reconciler.act(job, obj, decided(counted))
    assert set(api.written[-1]) == {"workers"}
    assert reconciler.echo_of_quiet_write(key, echo(102))
    # A write that moves anything else (here the epoch) is planned again when it comes back.
    bumped = counted.model_copy(update={"epoch": 4})
    await reconciler.act(job, obj, decided(bumped))
    assert not reconciler.echo_of_quiet_write(key, echo(103))
    assert refresh_only({"epoch": 3, "progress": {"step": 1}}, {"epoch": 3})
    assert not refresh_only({"epoch": 3, "progress": {"step": 1}}, {"epoch": 4})


async def test_the_echo_of_a_settled_pass_needs_no_pass_and_a_pass_with_more_to_do_does() -> None:
    api = StatusRecorder()
    caches = Caches(*(Store(cast(Any, api), k) for k in (GANGJOBS, PODS, NODES, SERVICES)))
    reconciler = Reconciler(cast(Any, api), caches)
    running = running_status(epoch=3)
    job = with_status(make_job(replicas=2), running)
    obj = job_dict(2, status=dump_status(running))
    key = f"{job.metadata.namespace}/{job.metadata.name}"

    def echo(version: int) -> dict[str, Any]:
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}

    def decided(status: GangJobStatus, **more: Any) -> Plan:
        fields: dict[str, Any] = {"create_pods": [], "delete_pods": [], "events": []}
        return Plan(status=status, create_service=None, **(fields | more))

    bumped = running.model_copy(update={"epoch": 4})
    assert decided(bumped).settled()
    await reconciler.act(job, obj, decided(bumped))
    # The epoch is news for the streams (not quiet), but a pass over it decides nothing new.
    assert not reconciler.echo_of_quiet_write(key, echo(101))
    assert reconciler.echo_of_settled_write(key, echo(101))
    assert not reconciler.echo_of_settled_write(key, echo(102))  # another writer's, after ours
    # A pass that ended early leaves the rest to the next one; one that deletes a pod leaves
    # what the deletion changes to the pod's events, and its own echo is planned again too.
    cut = decided(bumped.model_copy(update={"epoch": 5}), every_step=False)
    assert not cut.settled()
    await reconciler.act(job, obj, cut)
    assert not reconciler.echo_of_settled_write(key, echo(102))
    deleting = decided(
        bumped.model_copy(update={"epoch": 6}),
        delete_pods=[PodDelete(name="gone", uid="u", reason="x")],
    )
    assert not deleting.settled()
    api_deletes = DeleteRecorder(missing=set())
    reconciler.kube = cast(Any, _Both(api, api_deletes))
    await reconciler.act(job, obj, deleting)
    assert not reconciler.echo_of_settled_write(key, echo(103))


class _Both:
    """Status writes to one recorder, deletes to the other."""

    def __init__(self, status: StatusRecorder, deletes: DeleteRecorder) -> None:
        self.patch_status = status.patch_status
        self.delete = deletes.delete


async def test_the_echo_of_a_settled_write_wakes_the_streams_but_queues_no_pass() -> None:
    manager = Manager(cast(Any, object()), Settings(metrics_address=None, health_address=None))
    obj = job_dict(2, status=dump_status(running_status(epoch=3)))
    obj["metadata"]["resourceVersion"] = "7"
    woken: list[str] = []
    key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
    settled = {key: "7"}

    def echo_of_settled_write(k: str, o: dict[str, Any]) -> bool:
        return bool(settled.get(k) == o["metadata"]["resourceVersion"])

    setattr(manager.arrivals, "job_changed", woken.append)  # noqa: B010
    setattr(manager.reconciler, "echo_of_settled_write", echo_of_settled_write)  # noqa: B010
    manager._on_job(StoreEvent("MODIFIED", obj, obj))
    assert woken == [key]
    assert (len(manager.queue), manager.queue.waiting) == (0, 0)
    settled = {}
    manager._on_job(StoreEvent("MODIFIED", obj, obj))
    assert woken == [key, key]
    assert len(manager.queue) == 1


def test_a_refresh_changes_nothing_the_arrival_streams_send() -> None:
    # The manager wakes no stream for the echo of a refresh: that holds while the streams'
    # state leaves out everything a refresh writes.
    status = dump_status(running_status(epoch=2))
    refreshed = {**status, "progress": {"step": 9}, "goodput": {"ratio": 0.5}}
    assert refresh_only(status, refreshed)
    job = job_dict(2, status=status)
    assert state_line(job) == state_line({**job, "status": refreshed})
