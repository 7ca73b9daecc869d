"""One reconcile of one GangJob: observe (from the caches) -> plan (pure) -> act (through kube).

All decisions are `controller.policy.plan`'s; this module only gathers what plan needs (the
caches, what the workers' ServiceAccounts may not do, the last refusal of a worker pod) and
carries out what it returns, in a fixed order: **one** status write (conditional on the
resourceVersion read, so a stale cache can never write an older epoch over a newer one), then the
Service, pod deletions, the gang's Workload and PodGroup, pod creations, and the Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import pydantic
from opentelemetry.trace import Tracer

from api.constants import API_VERSION, KIND, REASON_WORKERS_CREATED, ConditionType
from api.v1alpha1 import GangJob, GangJobSpec, GangJobStatus, dump_status, parse_gangjob
from controller.arrivals.book import ArrivalBook
from controller.k8s import (
    CORE_EVENTS,
    GANGJOBS,
    PODGROUPS,
    PODS,
    SERVICES,
    WORKLOADS,
    AlreadyExists,
    ApiError,
    Conflict,
    Invalid,
    JsonDict,
    Kube,
    NotFound,
    ResourceKind,
)
from controller.k8s.store import BY_GANGJOB, Store
from controller.policy.plan import (
    STOP_DEADLINE_SECONDS,
    EventSpec,
    FinalizerRelease,
    Observed,
    Plan,
    PlanConfig,
    PodDelete,
    PodPlacement,
    PodStop,
    plan,
)
from controller.policy.stuck import service_accounts
from controller.policy.views import NodeView, PodView
from controller.quarantine import Quarantine
from controller.runtime import metrics, tracing
from controller.runtime.clock import utcnow
from controller.workeraccess import (
    AccessReview,
    ensure_worker_access,
    forget_worker_access,
    missing_service_account,
)

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "gangjob-controller"
REFUSED_RETRY_SECONDS = 10.0
"""A worker pod the apiserver refused (quota, admission) is tried again this often: the fix
(a quota raised, a webhook changed) comes with no event the controller watches."""
V = TypeVar("V")


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``old`` into ``new`` (null removes a field)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch


_PROGRESS_MESSAGES = frozenset({ConditionType.READY.value, ConditionType.STUCK.value})
"""Conditions whose message counts workers ("k/N workers ready", "k of N workers have not
arrived"): it moves with every arrival, as `workers` does."""


_ROLE_COUNTS: Final = frozenset({"ready", "arrived", "succeeded", "failed"})
"""Each role's counts of its workers (`status.roles[]`), as `workers` counts the gang's. A pass
reads a role's name, state, replicas and `startedLateAt` back from the status, never these."""


def progress_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two statuses differ only in progress counts: `workers`, each role's counts and
    `rolesReady` (the `Roles` column that says them), and the messages of the Ready and Stuck
    conditions (same status and reason)."""
    return _without_progress(old) == _without_progress(new)


_REFRESHED: Final = frozenset({"progress", "goodput"})
"""What a progress refresh writes (controller.policy.progress): the training progress and the
goodput figures, which no decision of the next pass reads."""


def refresh_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two statuses differ only in `status.progress` and `status.goodput`."""
    return _without_refresh(old) == _without_refresh(new)


def quiet_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two statuses differ only in what no decision of a pass reads and no arrival
    stream sends: progress counts (`progress_only`) and a progress refresh (`refresh_only`)."""
    return progress_only(_without_refresh(old), _without_refresh(new))


def _without_refresh(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k not in _REFRESHED}


def _without_progress(status: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in status.items() if k not in ("workers", "rolesReady")}
    roles = out.get("roles")
    if isinstance(roles, list):
        out["roles"] = [
            {k: v for k, v in r.items() if k not in _ROLE_COUNTS} if isinstance(r, Mapping) else r
            for r in roles
        ]
    conditions = out.get("conditions")
    if isinstance(conditions, list):
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "message"}
            if isinstance(c, Mapping) and c.get("type") in _PROGRESS_MESSAGES
            else c
            for c in conditions
        ]
    return out


class Views(Generic[V]):
    """Parsed views of one kind of object, one per object version.

    A gang of N pods sees ~N pod events while it starts, and each pass looks at all N pods:
    parsing each object version once, not once per pass, keeps that O(N) instead of O(N^2).
    """

    def __init__(self, parse: Callable[[JsonDict], V], store: Store, *, slack: int) -> None:
        self._parse = parse
        self._store = store
        self._slack = slack
        self._views: dict[str, tuple[str, V]] = {}  # uid -> (resourceVersion, view)

    def of(self, obj: JsonDict) -> V:
        meta = obj.get("metadata", {})
        uid, rv = meta.get("uid", ""), meta.get("resourceVersion", "")
        hit = self._views.get(uid)
        if hit is None or hit[0] != rv:
            hit = (rv, self._parse(obj))
            self._views[uid] = hit
            if len(self._views) > 2 * len(self._store) + self._slack:
                self._prune()
        return hit[1]

    def _prune(self) -> None:
        """Forgets the views of objects gone from the cache."""
        keep = {o.get("metadata", {}).get("uid", "") for o in self._store.list()}
        for uid in [u for u in self._views if u not in keep]:
            del self._views[uid]


class Specs:
    """Each GangJob parsed with the spec it was last parsed with, while that spec is unchanged.

    A pass parses its job anew (the status changes with every write), and a new spec builds its
    workers again (`GangJobSpec.workers`, a slot per worker: ~8 ms a pass at N=5000). The models
    are frozen, so the same spec serves every pass until the spec itself changes.
    """

    def __init__(self, store: Store, *, slack: int) -> None:
        self._store = store
        self._slack = slack
        self._specs: dict[str, tuple[Mapping[str, Any], GangJobSpec]] = {}  # uid -> (dict, model)

    def parse(self, obj: JsonDict) -> GangJob:
        spec = obj.get("spec")
        uid = (obj.get("metadata") or {}).get("uid") or ""
        hit = self._specs.get(uid)
        if hit is not None and isinstance(spec, Mapping) and (hit[0] is spec or hit[0] == spec):
            return GangJob.model_validate({**obj, "spec": hit[1]})  # the instance, not revalidated
        job = parse_gangjob(obj)
        if uid and isinstance(spec, Mapping):
            self._specs[uid] = (spec, job.spec)
            if len(self._specs) > 2 * len(self._store) + self._slack:
                keep = {(o.get("metadata") or {}).get("uid") for o in self._store.list()}
                for gone in [u for u in self._specs if u not in keep]:
                    del self._specs[gone]
        return job


@dataclass
class Caches:
    """The informer caches reconcile reads from."""

    jobs: Store
    pods: Store
    nodes: Store
    services: Store


@dataclass
class Outcome:
    """What one pass did; `requeue_after` is when plan wants to look again."""

    requeue_after: float | None = None
    created: int = 0
    deleted: int = 0
    status_written: bool = False
    status_written_at: float | None = None
    """When the status write returned (monotonic): the end of the controller's share of a
    restart step. The pass goes on after it (deletes, creates, events)."""
    status_write_seconds: float | None = None
    """How long the status write took, request to answer: the apiserver's part of that
    share."""
    epoch_bumped: bool = False
    """This pass wrote a new `status.epoch` (a restart started)."""
    barrier_opened: bool = False
    """This pass wrote `status.barrierEpoch` for a restart (its last worker arrived)."""
    events: list[EventSpec] = field(default_factory=list)
    planning_seconds: float = 0.0
    """Observe + plan: the pass's own CPU work, which grows with the gang (no awaits in it)."""


def _report_progress(job: GangJob, decided: Plan) -> None:
    """The job's progress and goodput gauges, and the lost time this pass's write added."""
    ns, name = job.metadata.namespace, job.metadata.name
    status = decided.status
    if status.progress is not None and status.progress.step is not None:
        metrics.PROGRESS_STEP.labels(ns, name).set(status.progress.step)
        if status.progress.steps_per_second is not None:
            metrics.STEPS_PER_SECOND.labels(ns, name).set(status.progress.steps_per_second)
    if job.spec.progress.straggler is not None and status.progress is not None:
        now = set(status.progress.stragglers or ())
        metrics.STRAGGLERS.labels(ns, name).set(len(now))
        was = job.status.progress.stragglers if job.status.progress is not None else None
        found = len(now - set(was or ()))
        if found:
            metrics.STRAGGLERS_FOUND.inc(found)
    if status.goodput is None:
        return
    if status.goodput.ratio is not None:
        metrics.GOODPUT_RATIO.labels(ns, name).set(status.goodput.ratio)
    before = job.status.goodput.lost_seconds if job.status.goodput is not None else None
    for cause in metrics.BADPUT_CAUSES:
        added = getattr(status.goodput.lost_seconds, cause) - (
            getattr(before, cause) if before is not None else 0.0
        )
        if added > 0:
            metrics.BADPUT_SECONDS.labels(cause).inc(added)


def joined(what: str, errors: Sequence[BaseException]) -> BaseException:
    """One exception that carries every error of a set of parallel writes, as Go's
    `errors.Join`: the error itself if there is one, else an ExceptionGroup of them all (a
    cancellation among them wins: the task is being cancelled)."""
    for e in errors:
        if not isinstance(e, Exception):
            return e
    if len(errors) == 1:
        return errors[0]
    return ExceptionGroup(
        f"{what}: {len(errors)} errors", [e for e in errors if isinstance(e, Exception)]
    )


def refused(error: BaseException) -> bool:
    """The apiserver answered a create with a refusal that retrying will not cure by itself
    (quota, admission webhook or policy, invalid spec), not a transient failure."""
    return (
        isinstance(error, ApiError)
        and not error.retriable
        and 400 <= error.status < 500
        and not isinstance(error, (NotFound, Conflict, AlreadyExists))
    )


COUNT_WRITE_BUDGET: Final = 0.2
"""The share of a gang's time that status writes of only progress counts may hold its key."""
COUNT_WRITE_MAX: Final = 5.0
"""The longest a write of only progress counts waits after the job's previous write (s)."""


class Reconciler:
    """Reconciles GangJobs by key (``namespace/name``)."""

    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        *,
        config: PlanConfig | None = None,
        tracer: Tracer | None = None,
        now: Callable[[], dt.datetime] = utcnow,
        pod_write_concurrency: int = 32,
        identity: str = "gangjob-controller",
        progress_interval: float = 1.0,
        arrivals: ArrivalBook | None = None,
        access: AccessReview | None = None,
        quarantine: Quarantine | None = None,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.config = config or PlanConfig()
        self.tracer = tracer or tracing.get_tracer()
        self.now = now
        # Creating or deleting 1000 pods one by one takes ~30 s; the apiserver takes ~16-32 in
        # flight well. Creates and deletes of one pass share these slots.
        self._pod_write_slots = asyncio.Semaphore(pod_write_concurrency)
        self.identity = identity
        # Every GangJob write reaches every agent's watch (N of them, ~50-60 us of apiserver CPU
        # each): a status write that only moves the progress counts waits this long after the
        # job's previous write. Protocol changes (epoch, barrier, phase, conditions) never wait.
        self.progress_interval = progress_interval
        # Job key -> (when its last status write returned, how long that write took).
        self._written_at: dict[str, tuple[float, float]] = {}
        # Job key -> (resourceVersion, quiet) of this controller's last write whose watch event
        # needs no pass: one that changed nothing a pass reads (`quiet_only`, quiet: no stream
        # wakes either; `echo_of_quiet_write`), or one by a settled pass
        # (`echo_of_settled_write`).
        self._own: dict[str, tuple[str, bool]] = {}
        self._pod_views = Views(PodView.from_pod, caches.pods, slack=1000)
        self._specs = Specs(caches.jobs, slack=100)
        # Arrivals the agents reported to this controller directly, joined to the pods' views.
        self.arrivals = arrivals if arrivals is not None else ArrivalBook()
        self._node_views = Views(NodeView.from_node, caches.nodes, slack=100)
        # What the workers' agents may do, by SubjectAccessReview; None: not checked.
        self.access = access
        # `--quarantine-nodes`: the nodes each stored restart struck; None: off.
        self.quarantine = quarantine
        # Job key -> the apiserver's answer to its last refused worker pod creation, until one
        # is created: plan says it on the GangJob (controller.policy.stuck).
        self._refused: dict[str, str] = {}

    # -- observe ---------------------------------------------------------------------------
    def observe(self, obj: JsonDict) -> Observed:
        job = self._specs.parse(obj)
        ns, name = job.metadata.namespace, job.metadata.name
        pods = [
            self.arrivals.apply(self._pod_views.of(p))
            for p in self.caches.pods.by_index(BY_GANGJOB, f"{ns}/{name}")
        ]
        nodes = {v.name: v for v in map(self._node_views.of, self.caches.nodes.list())}
        service = self.caches.services.get(f"{ns}/{name}") is not None
        return Observed(
            job=job,
            pods=pods,
            nodes=nodes,
            service_exists=service,
            now=self.now(),
            creation_refused=self._refused.get(f"{ns}/{name}"),
        )

    async def denied(self, job: GangJob) -> dict[str, tuple[str, ...]]:
        """What the agents' ServiceAccounts may not do (cached; see `AccessReview`)."""
        ns = job.metadata.namespace
        out: dict[str, tuple[str, ...]] = {}
        if self.access is None:
            return out
        for sa in service_accounts(job):
            denied = await self.access.denied(ns, sa)
            if denied:
                out[sa] = denied
        return out

    # -- the pass --------------------------------------------------------------------------
    async def reconcile(self, key: str) -> Outcome:
        obj = self.caches.jobs.get(key)
        if obj is None:
            self._written_at.pop(key, None)
            self._refused.pop(key, None)
            self._own.pop(key, None)
            return Outcome()  # deleted: its pods go with it (owner references, GC)
        if obj.get("metadata", {}).get("deletionTimestamp"):
            return Outcome()
        ns, name = key.split("/", 1)
        with tracing.reconcile_span(self.tracer, ns, name):
            started = time.perf_counter()
            try:
                observed = self.observe(obj)
            except pydantic.ValidationError as e:
                # The CRD's schema and CEL rules mirror the models, so this means an object
                # written before the CRD was updated: say so instead of retrying forever.
                log.error("GangJob %s does not parse; not reconciling it: %s", key, e)
                return Outcome()
            observing = time.perf_counter() - started
            denied = await self.denied(observed.job)
            if denied:
                observed = dataclasses.replace(observed, denied=denied)
            started = time.perf_counter()
            decided = plan(observed, self.config)
            planning = observing + time.perf_counter() - started
            outcome = await self.act(observed.job, obj, decided)
            outcome.planning_seconds = planning
            return outcome

    async def act(self, job: GangJob, obj: JsonDict, decided: Plan) -> Outcome:
        ns, name = job.metadata.namespace, job.metadata.name
        out = Outcome(requeue_after=decided.requeue_after)
        # The status first: it is the pass's commit point. If the write conflicts (our cache is
        # behind), nothing else happens and the key is planned again. The other way round, a
        # job finishing would delete its pods, lose the race for its status, and the next pass
        # would take those deletions for failures. Every action below is idempotent and planned
        # again from the stored status if this pass dies half-way.
        out.status_written, deferred = await self._write_status(
            job, obj, decided.status, settled=decided.settled()
        )
        if out.status_written:
            out.status_written_at = time.monotonic()
            out.status_write_seconds = self._written_at[f"{ns}/{name}"][1]
        if deferred is not None:
            after = decided.requeue_after
            out.requeue_after = deferred if after is None else min(after, deferred)
        if decided.create_service is not None:
            with contextlib.suppress(AlreadyExists):
                await self.kube.create(SERVICES, decided.create_service, ns)
        if decided.delete_pods:
            # In flight together, like creates: a Recreate of 5000 workers deleted one by one
            # spent ~170 s on deletes alone. Each delete is for its pod's UID, so the order
            # between pods does not matter.
            deleted = await asyncio.gather(
                *(self._delete_pod(ns, d) for d in decided.delete_pods), return_exceptions=True
            )
            out.deleted = sum(r is True for r in deleted)
            failed = [r for r in deleted if isinstance(r, BaseException)]
            if failed:
                # Nothing after the deletes is done on a failed one (a recreated worker's name
                # may still be taken); every failure is raised, none dropped.
                raise joined(f"deleting pods of {ns}/{name}", failed)
        for release in decided.release_finalizers:
            await self._release_finalizer(ns, release)
        if decided.stop_pods:
            await asyncio.gather(*(self._stop_pod(ns, s) for s in decided.stop_pods))
        if decided.create_workload is not None:
            await self._ensure_owned(WORKLOADS, decided.create_workload, job)
        if decided.create_pod_group is not None:
            # After the Workload: the apiserver refuses a PodGroup whose Workload is missing.
            await self._ensure_owned(PODGROUPS, decided.create_pod_group, job)
        events = decided.events
        for placement in decided.place_pods:
            await self._place_pod(ns, placement)
        if decided.create_pods:
            # The workers' agents run as `gangjob-worker`: make it exist in this namespace first.
            await ensure_worker_access(self.kube, ns)
            results = await asyncio.gather(
                *(self._create_pod(ns, pod) for pod in decided.create_pods),
                return_exceptions=True,
            )
            out.created = sum(r is True for r in results)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                events = [e for e in events if e.reason != REASON_WORKERS_CREATED]
                self._creation_failed(f"{ns}/{name}", errors, out)
            else:
                self._refused.pop(f"{ns}/{name}", None)
        out.epoch_bumped = out.status_written and decided.restart_started is not None
        finished = decided.restart_finished
        out.barrier_opened = bool(
            out.status_written and finished is not None and finished.barrier_open_at is not None
        )
        # Events, metrics and spans only once the status they describe is stored: a failed
        # write raises, and the next pass plans (and reports) the same restart again.
        self._report(job, decided)
        if out.status_written:
            # The lost time counted is what the stored status adds: a deferred or failed write
            # is planned again, and must not be counted twice.
            _report_progress(job, decided)
        for ev in events:
            await self._event(job, ev)
        out.events = list(events)
        if decided.delete_job:
            with contextlib.suppress(NotFound):
                await self.kube.delete(
                    GANGJOBS, name, ns, uid=job.metadata.uid, propagation_policy="Background"
                )
        return out

    def _creation_failed(self, key: str, errors: list[BaseException], out: Outcome) -> None:
        """Remembers a refusal for plan to say on the GangJob, and retries it in
        `REFUSED_RETRY_SECONDS`; raises any other error (the key is retried with backoff)."""
        # A missing ServiceAccount is made again by the next pass (forget_worker_access): no
        # refusal to report, and no reason to wait.
        other = [
            e
            for e in errors
            if not refused(e) or (isinstance(e, ApiError) and missing_service_account(e))
        ]
        if other:
            raise joined(f"creating worker pods of {key}", other)
        message = str(errors[0])
        if self._refused.get(key) != message:
            log.warning("creating worker pods of %s refused: %s", key, message)
        self._refused[key] = message
        after = out.requeue_after
        out.requeue_after = (
            REFUSED_RETRY_SECONDS if after is None else min(after, REFUSED_RETRY_SECONDS)
        )

    def _report(self, job: GangJob, decided: Plan) -> None:
        ns, name = job.metadata.namespace, job.metadata.name
        for d in decided.failures:
            metrics.RESTARTS.labels(str(d.failure_class), str(d.action)).inc()
        if self.quarantine is not None and decided.failures:
            self.quarantine.record(f"{ns}/{name}", decided)
        metrics.EPOCH.labels(ns, name).set(decided.status.epoch)
        if decided.status.barrier_epoch is not None:
            metrics.BARRIER_EPOCH.labels(ns, name).set(decided.status.barrier_epoch)
        for cond in decided.status.conditions:
            metrics.CONDITION.labels(ns, name, cond.type).set(1 if cond.status == "True" else 0)
        done = decided.restart_finished
        if done is not None and done.barrier_open_at is not None:
            mode = str(decided.status.mode or job.spec.restart.mode)
            if done.duration_seconds is not None:
                metrics.RESTART_DURATION.labels(mode).observe(done.duration_seconds)
            tracing.record_restart_span(
                self.tracer,
                ns,
                name,
                epoch=done.epoch,
                trigger_class=done.trigger.failure_class,
                mode=mode,
                detected_at=done.detected_at,
                barrier_open_at=done.barrier_open_at,
                recreated=done.recreated_ranks(len(job.spec.workers)),
                trigger_worker=done.trigger.worker,
            )
            log.info(
                "gang %s/%s restarted to epoch %d in %.2fs (%s)",
                ns, name, done.epoch, done.duration_seconds or 0, done.trigger.failure_class,
            )  # fmt: skip
        if decided.restart_started is not None:
            r = decided.restart_started
            log.info(
                "gang %s/%s: %s of worker %s -> epoch %d (%s)",
                ns, name, r.trigger.failure_class, r.trigger.worker, r.epoch, r.trigger.action,
            )  # fmt: skip

    async def _ensure_owned(self, kind: ResourceKind, obj: JsonDict, job: GangJob) -> None:
        """Creates `obj`, or finds it there already, owned by this job and not being deleted:
        anything else (a namesake's leftover that garbage collection has yet to remove) raises,
        so that no pod is linked to it and the pass is retried with backoff."""
        ns, name = job.metadata.namespace, obj["metadata"]["name"]
        try:
            await self.kube.create(kind, obj, ns)
            return
        except AlreadyExists:
            found = await self.kube.get(kind, name, ns)
        meta = found.get("metadata") or {}
        owners = [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")]
        if owners != [job.metadata.uid] or meta.get("deletionTimestamp"):
            raise RuntimeError(
                f"{kind.kind} {ns}/{name} exists but is not this GangJob's (or is being "
                "deleted): waiting for it to go before creating workers"
            )

    async def _create_pod(self, ns: str, pod: JsonDict) -> bool:
        async with self._pod_write_slots:
            try:
                await self.kube.create(PODS, pod, ns)
                return True
            except AlreadyExists:
                # Names are `<job>-<rank>`: the pod exists already (our cache lagged behind).
                return False
            except ApiError as e:
                if missing_service_account(e):
                    # Someone deleted it after we made it: make it again on the retry.
                    forget_worker_access(ns)
                raise

    async def _delete_pod(self, ns: str, d: PodDelete) -> bool:
        async with self._pod_write_slots:
            return await self._delete_pod_now(ns, d)

    async def _delete_pod_now(self, ns: str, d: PodDelete) -> bool:
        log.info(
            "deleting pod %s/%s (%s%s)", ns, d.name, d.reason or "no reason",
            ", force" if d.grace_seconds == 0 else "",
        )  # fmt: skip
        try:
            if d.mark_failed:
                # A pod on a dead node never gets its status from the kubelet again: mark it
                # Failed so that nothing (quota, PodGC, other controllers) counts it as running.
                await self.kube.patch_status(
                    PODS,
                    d.name,
                    {
                        "metadata": {"uid": d.uid},
                        "status": {"phase": "Failed", "reason": d.reason or "GangJobForceDelete"},
                    },
                    ns,
                )
            await self.kube.delete(
                PODS, d.name, ns, grace_period_seconds=d.grace_seconds, uid=d.uid
            )
            return True
        except (NotFound, Conflict):
            return False  # gone already, or a newer pod of that name: nothing of ours to delete

    async def _stop_pod(self, ns: str, s: PodStop) -> None:
        """Ends the pod by its active deadline: the kubelet kills its containers and keeps
        them, with their logs, until the pod is deleted. The UID in the patch is a
        precondition: a same-named successor is never hit."""
        log.info("stopping pod %s/%s (%s)", ns, s.name, s.reason or "no reason")
        deadline = {"activeDeadlineSeconds": STOP_DEADLINE_SECONDS}
        body = {"metadata": {"uid": s.uid}, "spec": deadline}
        async with self._pod_write_slots:
            try:
                await self.kube.patch(PODS, s.name, body, ns)
            except (NotFound, Conflict, Invalid):
                return  # gone, replaced, or already given a deadline: the next pass looks again

    async def _place_pod(self, ns: str, placement: PodPlacement) -> None:
        """Conditional on the resourceVersion observed: a pod that moved on (Kueue lifted its
        gate) triggers the next pass, which decides again."""
        spec: JsonDict = {"schedulingGates": [{"name": g} for g in placement.gates]}
        if placement.affinity is not None:
            spec["affinity"] = placement.affinity
        body = {"metadata": {"resourceVersion": placement.resource_version}, "spec": spec}
        try:
            await self.kube.patch(PODS, placement.name, body, ns)
            log.info("placed pod %s/%s (gates now %s)", ns, placement.name, placement.gates)
        except (NotFound, Conflict):
            return

    async def _release_finalizer(self, ns: str, r: FinalizerRelease) -> None:
        """Conditional on the resourceVersion observed: if the pod moved on, the change
        triggers the next pass, which decides again."""
        body = {"metadata": {"resourceVersion": r.resource_version, "finalizers": list(r.kept)}}
        try:
            await self.kube.patch(PODS, r.name, body, ns)
            log.info("released pod %s/%s to deletion (finalizers now %s)", ns, r.name, r.kept)
        except (NotFound, Conflict):
            return

    async def _write_status(
        self, job: GangJob, obj: JsonDict, status: GangJobStatus, *, settled: bool = False
    ) -> tuple[bool, float | None]:
        """(written, seconds until a deferred progress-only write is due). `settled`: the
        status is all that the plan asks for (`Plan.settled`)."""
        if status == job.status:
            return False, None
        old = obj.get("status") or {}
        new = dump_status(status)
        patch = merge_patch(old, new)
        if not patch:
            return False, None
        key = f"{job.metadata.namespace}/{job.metadata.name}"
        now = time.monotonic()
        due = self._count_write_due(key)
        if due > now and progress_only(old, new):
            return False, due - now
        # Conditional on what we read: if the object moved on (our own previous write not yet in
        # the cache, or a spec change) this raises Conflict and the key is requeued.
        body = {"metadata": {"resourceVersion": job.metadata.resource_version}, "status": patch}
        stored = await self.kube.patch_status(
            GANGJOBS, job.metadata.name, body, job.metadata.namespace
        )
        returned = time.monotonic()
        self._written_at[key] = (returned, returned - now)
        version = (stored.get("metadata") or {}).get("resourceVersion")
        quiet = quiet_only(old, new)
        if isinstance(version, str) and (quiet or settled):
            self._own[key] = (version, quiet)
        else:
            self._own.pop(key, None)
        return True, None

    def _count_write_due(self, key: str) -> float:
        """When a write of only progress counts may go (monotonic): `progress_interval` after
        the job's last write returned, or longer where that write waited long, so that such
        writes hold the gang's key at most `COUNT_WRITE_BUDGET` of the time. The key is the
        gang's for a whole pass, its write included: during an in-place restart the apiserver
        is busy with every kubelet's status writes and each write waited 0.3-1.2 s at N=1000
        on the sim, while the last arrival's pass, the one that opens the barrier, waited
        behind it."""
        last = self._written_at.get(key)
        if last is None:
            return -math.inf
        returned, took = last
        return returned + min(
            max(self.progress_interval, took / COUNT_WRITE_BUDGET), COUNT_WRITE_MAX
        )

    def echo_of_quiet_write(self, key: str, obj: JsonDict) -> bool:
        """Whether `obj` is the GangJob exactly as this controller's last write left it, and that
        write changed only what no decision reads: progress and goodput (a periodic refresh), or
        the workers' counts and the messages that say them (each second of a restart). Planning
        it again would decide nothing the writing pass did not (plan over a carried-out plan
        repeats nothing), yet cost a pass over every worker: at N=5000 the echo of each periodic
        refresh was half of what progress cost the controller, and during a restart every count
        written brought one more pass over the gang."""
        return self._own_echo(key, obj) is True

    def echo_of_settled_write(self, key: str, obj: JsonDict) -> bool:
        """Whether `obj` is the GangJob exactly as this controller's last write left it, and the
        pass that wrote it was settled (`Plan.settled`): it ran every step and asked for nothing
        but that status. Planning it again would decide nothing new, so the echo needs no pass
        (a restart's epoch and its barrier each cost one more pass over every worker: at
        N=5000 ~0.15 s each). Unlike a quiet write, its news is for the arrival streams."""
        return self._own_echo(key, obj) is False

    def _own_echo(self, key: str, obj: JsonDict) -> bool | None:
        """Whether `obj` is our last recorded write (`_own`) coming back: quiet (True), by a
        settled pass (False), or not (None)."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        held = self._own.get(key)
        return held[1] if held is not None and version == held[0] else None

    async def _event(self, job: GangJob, ev: EventSpec) -> None:
        now = self.now()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "generateName": f"{job.metadata.name}.",
                "namespace": job.metadata.namespace,
            },
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": job.metadata.name,
                "namespace": job.metadata.namespace,
                "uid": job.metadata.uid,
            },
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message,
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.kube.create(CORE_EVENTS, body, job.metadata.namespace)
        except Exception as e:  # an Event is best effort: never fail a reconcile for one
            log.warning("event %s for %s not recorded: %s", ev.reason, job.metadata.name, e)
