"""The running controller: informer caches, the work queue, reconcile workers, health and
metrics endpoints, and leader election around the workers.

Caches start at once on every replica (so a standby is warm and /readyz reflects the caches);
reconcile workers run only while this replica holds the Lease. Losing the Lease ends `run`, and
the process exits rather than carry on half-leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.constants import (
    ANNOTATION_EPOCH,
    ANNOTATION_RESTART_MODE,
    LABEL_NAME,
)
from controller.arrivals.auth import TokenAuthenticator
from controller.arrivals.book import ArrivalBook
from controller.arrivals.server import arrivals_app
from controller.k8s import (
    GANGJOBS,
    LEASES,
    NODES,
    PODGROUPS,
    PODS,
    SERVICES,
    TOKENREVIEWS,
    WORKLOADS,
    ApiError,
    Conflict,
    Invalid,
    JsonDict,
    Kube,
)
from controller.k8s.leader import LeaderElectionConfig, LeaderElector
from controller.k8s.store import (
    BY_GANGJOB,
    BY_NODE,
    Store,
    StoreEvent,
    gangjob_index,
    node_index,
)
from controller.k8s.transforms import strip_managed_fields, trim_node, trim_pod
from controller.policy import scheduling
from controller.policy.plan import PlanConfig
from controller.policy.quarantine import QuarantineConfig
from controller.quarantine import Quarantine
from controller.reconcile import Caches, Outcome, Reconciler
from controller.runtime import collector, metrics
from controller.runtime.certs import CA_CERT, TLS_CERT, TLS_KEY, service_names
from controller.runtime.httpserver import HttpServer
from controller.runtime.probes import probes_app
from controller.runtime.queue import WorkQueue
from controller.runtime.servingcert import ServingCert
from controller.servingsecret import ServingSecret
from controller.workeraccess import AccessReview, check_worker_role

log = logging.getLogger(__name__)

CONTROLLER_NAME = "gangjob"
ARRIVAL_COALESCE = 0.05
"""Seconds that pod events carrying only an arrival wait, so that a burst shares one pass."""
REPORT_COALESCE = 1.0
"""Seconds that a direct report which leaves the barrier short waits: the endpoint counts the
reports itself and runs the last one's pass at once (`_on_report`), so the passes before it only
refresh the arrived counts, which status shows at most every second anyway; at N=5000 each is a
pass over every worker (0.2-0.5 s)."""
REPORT_BUDGET = 0.05
"""The share of a core that the passes which only refresh the arrived counts may take: a report
short of the barrier waits REPORT_COALESCE, or the gang's last planning time over this share if
longer (at N=5000, ~0.15 s of planning: 3 s), but at most REPORT_COALESCE_MAX. Each such pass
holds the event loop, and with it every other agent's report, for its whole planning time; a
large gang's restart that takes less than that wait runs none (its last report's pass opens the
barrier, and takes the waiting refresh with it)."""
REPORT_COALESCE_MAX = 5.0
PACE_FROM = 0.02
"""Seconds of planning from which a gang's next pass waits as long after its last one ended."""
PACE_MAX = 1.0
"""The longest such wait."""
RESTART_EVENT_BUDGET = 0.2
"""The share of a core that the passes woken by the kubelet's writes of a `Pod`-mode restart may
take: while the barrier is shut, a change of a pod whose worker restarts in place by the protocol
and has not arrived (`_restarting_in_place`) queues the pass the gang's last planning time over
this share later, at most RESTART_EVENT_MAX. Those changes are no failure (`classify` judges only
workers at the epoch), and at N=5000 there are ~15,000 of them in a restart: paced like any other
event they ran a pass over every worker back to back, half the controller's time, which held
every arrival's report and made the barrier's own pass wait behind one in flight. A gang whose
planning is below PACE_FROM is not held."""
RESTART_EVENT_MAX = PACE_MAX
"""The longest such wait: no longer than the pace's own, so that a pass the barrier still needs
after the last arrival's (a status the kubelet wrote late) comes no later than it did."""
_VOLATILE_META = ("resourceVersion", "managedFields", "annotations")
LEADER_LABEL = "gangjob.io/arrivals"
"""On the controller's own pod while it leads (value `leader`): the arrival Service selects
it, so agents reach the one replica that reconciles (manifests/manager)."""


def arrival_only(old: JsonDict, new: JsonDict) -> bool:
    """Whether a pod changed only in its `gangjob.io/epoch` annotation."""
    if old.get("status") != new.get("status") or old.get("spec") != new.get("spec"):
        return False
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if any(om.get(k) != nm.get(k) for k in (om.keys() | nm.keys()) - set(_VOLATILE_META)):
        return False
    oa, na = om.get("annotations") or {}, nm.get("annotations") or {}
    changed = {k for k in oa.keys() | na.keys() if oa.get(k) != na.get(k)}
    return changed == {ANNOTATION_EPOCH}


@dataclass
class Settings:
    """What the command line configures."""

    namespace: str | None = None  # None: every namespace
    leader_elect: bool = False
    leader_election_namespace: str = "default"
    leader_election_id: str = "gangjob-controller"
    leader_election_timing: tuple[float, float, float] = (15.0, 10.0, 2.0)
    """(lease duration, renew deadline, retry period), seconds (`LeaderElectionConfig`)."""
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    workers: int = 4
    agent_image: str = "localhost/gangjob-agent:dev"
    identity: str = ""
    arrival_address: tuple[str, int] | None = None
    """Where to serve the agents' arrival endpoint (controller.arrivals); None: not at all."""
    arrival_url: str | None = None
    """The endpoint's URL as the pods reach it (a Service), given to every agent."""
    arrival_tls: tuple[str, str] | None = None
    """(certificate, key) files to serve the endpoint with over TLS, followed as they rotate
    (cert-manager's); None: `arrival_tls_secret`, else plain HTTP."""
    arrival_ca_file: str | None = None
    """With `arrival_tls`: the CA (PEM) the agents verify it with (None: their system store)."""
    arrival_tls_secret: tuple[str, str] | None = None
    """(namespace, name) of the Secret holding the endpoint's own CA and certificate, which the
    controller makes and renews (`controller.servingsecret`): TLS with no files given."""
    own_pod: tuple[str, str] | None = None
    """(namespace, name) of the controller's own pod, in a cluster: it carries LEADER_LABEL
    while this replica leads."""
    barrier_stall_seconds: float = 120.0
    """A barrier short of workers this long makes the gang `Stuck` (`PlanConfig`)."""
    recheck_seconds: float = 30.0
    """How often a stuck gang is planned again with no event, and how long a review of the
    workers' RBAC is trusted (`PlanConfig`, `AccessReview`)."""
    quarantine: QuarantineConfig | None = None
    """`--quarantine-nodes` and its settings (controller.quarantine); None: off."""

    def __post_init__(self) -> None:
        if not self.identity:
            self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Manager:
    """Wires the pieces together; `run()` until cancelled or the Lease is lost."""

    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        ns = settings.namespace
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER_NAME)
        # The caches keep only what the controller reads (controller.k8s.transforms): a full
        # worker pod is ~60 KB of Python objects, trimmed ~10 KB.
        self.jobs = Store(
            kube, GANGJOBS, namespace=ns, handlers=[self._on_job], transform=strip_managed_fields
        )
        self.pods = Store(
            kube,
            PODS,
            namespace=ns,
            label_selector=LABEL_NAME,  # only pods of some gang
            indexers={BY_GANGJOB: gangjob_index, BY_NODE: node_index},
            handlers=[self._on_pod],
            transform=trim_pod,
        )
        self.nodes = Store(kube, NODES, handlers=[self._on_node], transform=trim_node)
        self.services = Store(
            kube, SERVICES, namespace=ns, label_selector=LABEL_NAME, transform=strip_managed_fields
        )
        self.arrivals = ArrivalBook()
        self.quarantine = (
            Quarantine(kube, self.nodes, settings.quarantine, identity=settings.identity)
            if settings.quarantine is not None
            else None
        )
        self.reconciler = Reconciler(
            kube,
            Caches(self.jobs, self.pods, self.nodes, self.services),
            config=PlanConfig(
                agent_image=settings.agent_image,
                arrival_url=settings.arrival_url,
                barrier_stall_seconds=settings.barrier_stall_seconds,
                recheck_seconds=settings.recheck_seconds,
            ),
            identity=settings.identity,
            arrivals=self.arrivals,
            access=AccessReview(
                kube, ttl=settings.recheck_seconds, on_change=self._on_access_change
            ),
            quarantine=self.quarantine,
        )
        self.authenticator = TokenAuthenticator(lambda body: kube.create(TOKENREVIEWS, body))
        self.stores = [self.jobs, self.pods, self.nodes, self.services]
        self.is_leader = False
        self.elector: LeaderElector | None = None
        # When each queued key was first made dirty by a watch event since its last pass: the
        # start of the controller's own share of a restart (gangjob_restart_controller_seconds).
        self._dirty_since: dict[str, float] = {}
        # A pass over a gang of thousands costs a good part of a second of CPU, and while the
        # gang restarts its pods change ~100 times a second: back to back, the passes would take
        # the CPU the apiserver needs for those changes. So a gang whose planning took P
        # seconds is not planned again until P after its last pass ended (at most half the
        # controller's time); small gangs (P < PACE_FROM) are not held at all.
        self._next_pass_at: dict[str, float] = {}
        self._planning: dict[str, float] = {}  # each gang's last planning time (s)
        # Keys whose next pass opens a barrier: no pace holds it (see _on_report).
        self._urgent: set[str] = set()
        # Passes running now, and when the last one ended: the garbage collector's full
        # collections wait for a quiet moment (collector.collect_when_quiet).
        self._passing = 0
        self._last_pass_end = time.monotonic()
        # When the report that completed a key's barrier came: the start of the controller's
        # share of that step (the key may have been dirty since an earlier arrival's report,
        # which waited REPORT_COALESCE; that wait is no reaction to the last arrival).
        self._last_arrival: dict[str, float] = {}

    def _enqueue(self, key: str, after: float = 0.0) -> None:
        now = time.monotonic()
        self._dirty_since.setdefault(key, now)
        delay = max(after, self._next_pass_at.get(key, now) - now)
        if delay > 0:
            self.queue.add_after(key, delay)
        else:
            self.queue.add(key)

    def _paced(self, key: str, planning_seconds: float) -> float:
        """Records when `key` may be planned next; returns how long from now."""
        self._planning[key] = planning_seconds
        if planning_seconds < PACE_FROM:
            self._next_pass_at.pop(key, None)
            return 0.0
        pace = min(planning_seconds, PACE_MAX)
        self._next_pass_at[key] = time.monotonic() + pace
        return pace

    # -- event handlers: map a change to the GangJob keys it concerns ---------------------
    def _on_job(self, event: StoreEvent) -> None:
        if event.type == "MODIFIED" and self.reconciler.echo_of_quiet_write(event.key, event.obj):
            # Our own progress refresh, or arrived counts, coming back: no pass, and no arrival
            # stream wakes (the state they send leaves both out; at N=5000, 5000 wake-ups).
            return
        self.arrivals.job_changed(event.key)
        if event.type == "DELETED":
            metrics.forget_job(*event.key.split("/", 1))
            self._planning.pop(event.key, None)
        elif event.type == "MODIFIED" and self.reconciler.echo_of_settled_write(
            event.key, event.obj
        ):
            return  # the streams have the news; a pass would decide nothing new
        self._enqueue(event.key)

    def _pod_job(self, namespace: str, pod: str) -> str | None:
        """The GangJob whose worker the cached pod is (its `gangjob.io/name` label)."""
        obj = self.pods.get(f"{namespace}/{pod}")
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        name = labels.get(LABEL_NAME)
        return name if isinstance(name, str) else None

    def _on_report(self, key: str) -> None:
        """An agent reported to the arrival endpoint. A trainer's exit is a failure: its pass is
        queued at once. The last expected arrival of a restart opens the barrier: its pass runs
        now, neither coalesced with other arrivals nor held by the gang's pace; plan, reading
        the same book, decides as always. The other arrivals wait `REPORT_COALESCE`."""
        if self.arrivals.take_failed(key):
            self._enqueue(key)  # a trainer's exit (Process mode): a failure, looked at now
            return
        if not self._barrier_due(key):
            self._enqueue(key, after=self._report_coalesce(key))
            return
        now = time.monotonic()
        self._next_pass_at.pop(key, None)
        self._urgent.add(key)
        self._dirty_since.setdefault(key, now)
        self._last_arrival[key] = now
        self.queue.add(key)

    def _report_coalesce(self, key: str) -> float:
        """How long a report short of the barrier waits for its pass (`REPORT_BUDGET`)."""
        planning = self._planning.get(key, 0.0)
        return min(max(REPORT_COALESCE, planning / REPORT_BUDGET), REPORT_COALESCE_MAX)

    def _shut_barrier(self, key: str) -> tuple[int, Mapping[str, Any], Mapping[str, Any]] | None:
        """(epoch, spec, status) of the cached GangJob `key` while its barrier is shut at its
        epoch (a restart in progress); None otherwise."""
        obj = self.jobs.get(key)
        if obj is None:
            return None
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        epoch = status.get("epoch")
        if not isinstance(epoch, int) or status.get("barrierEpoch") == epoch:
            return None
        return epoch, spec, status

    def _barrier_due(self, key: str) -> bool:
        shut = self._shut_barrier(key)
        if shut is None:
            return False
        epoch, spec, status = shut
        expected = barrier_waits_for(spec, status)
        return expected is not None and self.arrivals.waiting(key, epoch) >= expected

    def _enqueue_arrival(self, key: str) -> None:
        # An arrival by annotation is one of N during a restart and no failure: arrivals within
        # ARRIVAL_COALESCE share one pass over the gang (which alone can count them).
        self._enqueue(key, after=ARRIVAL_COALESCE)

    def _on_pod(self, event: StoreEvent) -> None:
        # A worker's arrival (its epoch annotation, nothing else) is one of N during a restart
        # and no failure: arrivals within ARRIVAL_COALESCE share one pass over the gang.
        # Everything else (the kubelet's status, deletions, exit reports) is looked at now.
        if event.type == "DELETED":
            meta = event.obj.get("metadata") or {}
            self.arrivals.forget(
                meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
            )
        arrival = event.old is not None and arrival_only(event.old, event.obj)
        for key in gangjob_index(event.obj):
            if arrival:
                self._enqueue_arrival(key)
            elif event.type == "MODIFIED" and self._restarting_in_place(key, event.obj):
                self._enqueue(key, after=self._restart_event_wait(key))
            else:
                self._enqueue(key)

    def _restarting_in_place(self, key: str, pod: JsonDict) -> bool:
        """Whether `pod` is a `Pod`-mode worker of gang `key` that restarts in place by the
        protocol: the gang's barrier is shut at its epoch E, the pod is neither being deleted nor
        finished, and its worker has not arrived at E (no report of its pod at E, no epoch
        annotation at E). Its changes are the kubelet restarting its containers, which no pass
        takes for a failure; once its agent arrives (or for a worker at E), they are looked at
        now."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if annotations.get(ANNOTATION_RESTART_MODE) != "Pod" or meta.get("deletionTimestamp"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            return False
        shut = self._shut_barrier(key)
        if shut is None:
            return False
        epoch = shut[0]
        if str(annotations.get(ANNOTATION_EPOCH, "")).strip() == str(epoch):
            return False
        report = self.arrivals.get(meta.get("namespace", ""), meta.get("name", ""))
        return report is None or report.uid != meta.get("uid") or report.epoch < epoch

    def _restart_event_wait(self, key: str) -> float:
        """How long a restarting worker's change waits for its pass (`RESTART_EVENT_BUDGET`)."""
        planning = self._planning.get(key, 0.0)
        if planning < PACE_FROM:
            return 0.0
        return min(planning / RESTART_EVENT_BUDGET, RESTART_EVENT_MAX)

    def _on_access_change(self, namespace: str) -> None:
        # What the agents of a namespace may do changed (a re-review in the background): its
        # gangs' Stuck condition says so.
        for key in self.jobs.keys():  # noqa: SIM118 (a Store, not a dict)
            if key.partition("/")[0] == namespace:
                self._enqueue(key)

    def _on_node(self, event: StoreEvent) -> None:
        # A node going away or bad concerns every gang with a pod on it.
        name = event.obj.get("metadata", {}).get("name", "")
        for pod in self.pods.by_index(BY_NODE, name):
            for key in gangjob_index(pod):
                self._enqueue(key)

    # -- readiness --------------------------------------------------------------------------
    def synced(self) -> bool:
        return all(s.has_synced for s in self.stores)

    def healthy(self) -> bool:
        return self.elector is None or not self.is_leader or self.elector.healthy()

    # -- workers ----------------------------------------------------------------------------
    def _quiet_for(self) -> float:
        """Seconds since the last pass ended; 0 while one runs."""
        return 0.0 if self._passing else time.monotonic() - self._last_pass_end

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self._passing += 1
            since = self._dirty_since.pop(key, None)
            arrival = self._last_arrival.pop(key, None)
            pace = 0.0
            try:
                with metrics.track_reconcile(CONTROLLER_NAME) as record:
                    try:
                        outcome = await self.reconciler.reconcile(key)
                    except Exception:
                        # Conflicts are routine (our cache behind our own write): retry soon.
                        if since is not None:
                            self._dirty_since[key] = min(since, self._dirty_since.get(key, since))
                        if arrival is not None:
                            self._last_arrival.setdefault(key, arrival)
                        self.queue.add_rate_limited(key)
                        raise
                    self.queue.forget(key)
                    pace = self._paced(key, outcome.planning_seconds)
                    if since is not None:
                        self._report_share(key, since, outcome, arrival)
                    if outcome.requeue_after is not None:
                        record.result = "requeue_after"
                        self.queue.add_after(key, outcome.requeue_after)
            except Exception as e:
                level = logging.DEBUG if isinstance(e, Conflict) else logging.ERROR
                log.log(level, "reconcile %s failed: %s", key, e, exc_info=level >= logging.ERROR)
            finally:
                # Events during the pass queue the key again, once the pace allows.
                if key in self._urgent:
                    self._urgent.discard(key)
                    pace = 0.0
                self.queue.done(key, pace)
                self._passing -= 1
                self._last_pass_end = time.monotonic()

    @staticmethod
    def _report_share(
        key: str, since: float, outcome: Outcome, last_arrival: float | None = None
    ) -> None:
        """The controller's share of a restart step: from `since` (the first event that made
        the key dirty), for the barrier from the last arrival's report where one completed it
        (`last_arrival`), to the status write returning."""
        for step, done in (("bump", outcome.epoch_bumped), ("barrier", outcome.barrier_opened)):
            if done:
                # To the status write, not the pass's end: a Recreate's deletes come after it.
                written = outcome.status_written_at or time.monotonic()
                start = last_arrival if step == "barrier" and last_arrival is not None else since
                took = written - start
                metrics.RESTART_STEP.labels(step).observe(took)
                write = outcome.status_write_seconds
                if write is not None:
                    metrics.RESTART_STEP_WRITE.labels(step).observe(write)
                log.info(
                    "gang %s: %s written %.3fs after the %s (%.3fs after the first event; "
                    "the write itself %s)",
                    key, step, took, "last arrival" if start != since else "watch event",
                    written - since, "-" if write is None else f"{write:.3f}s",
                )  # fmt: skip

    async def _label_own_pod(self, leading: bool) -> None:
        """Best effort: without the label the Service has no endpoint, and agents fall back to
        the annotation, which is slower but correct."""
        if self.settings.own_pod is None or self.settings.arrival_address is None:
            return
        ns, name = self.settings.own_pod
        labels = {LEADER_LABEL: "leader" if leading else None}
        try:
            await self.kube.patch(PODS, name, {"metadata": {"labels": labels}}, ns)
        except Exception as e:
            log.warning("cannot label own pod %s/%s (%s): agents arrive by annotation", ns, name, e)

    async def _discover(self) -> None:
        """What the cluster serves that plan depends on: the KEP-4671 PodGroup API, and whether
        it keeps a PodGroup's topology constraint and disruption mode (alpha gates)."""
        served = await self.kube.served(PODGROUPS)
        topology = served and await self._keeps("topology")
        whole = served and await self._keeps("disruption")
        self.reconciler.config = dataclasses.replace(
            self.reconciler.config,
            pod_groups_served=served,
            pod_group_topology_served=topology,
            pod_group_disruption_served=whole,
        )
        log.info(
            "scheduling.k8s.io/v1alpha2 PodGroups %s%s%s",
            "served" if served else "not served",
            ", with topology constraints" if topology else "",
            ", with whole-group disruption" if whole else "",
        )

    async def _keeps(self, feature: str) -> bool:
        """A dry-run create of a Workload with the field of `feature`: an alpha field whose
        gate is off is dropped or refused, so the answer says whether the gate is on."""
        namespace = self.settings.namespace or "default"
        probe = scheduling.probe_workload(feature)
        try:
            answer = await self.kube.create(WORKLOADS, probe, namespace, dry_run=True)
        except Invalid:
            return False
        except ApiError as e:
            log.warning("cannot learn whether PodGroup %s is kept (%s): taken as not", feature, e)
            return False
        return scheduling.keeps(answer, feature)

    async def _lead(self) -> None:
        self.is_leader = True
        await self._label_own_pod(True)
        log.info("leading: starting %d reconcile workers", self.settings.workers)
        for s in self.stores:
            await s.wait_synced()
        await self._discover()
        await check_worker_role(self.kube)
        collector.settle()  # the caches are filled: from here the collector paces itself
        # Everything the caches hold now, once: events before we led were not acted upon.
        for key in self.jobs.keys():  # noqa: SIM118 (a Store, not a dict)
            self.queue.add(key)
        metrics.MAX_CONCURRENT_RECONCILES.labels(CONTROLLER_NAME).set(self.settings.workers)
        workers = [asyncio.create_task(self._worker()) for _ in range(self.settings.workers)]
        workers.append(asyncio.create_task(collector.collect_when_quiet(self._quiet_for)))
        if self.quarantine is not None:
            workers.append(asyncio.create_task(self.quarantine.run()))
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()

    def _give_ca(self, pem: bytes) -> None:
        """Pods made from here on carry `pem` for their agents to verify the endpoint with."""
        self.reconciler.config = dataclasses.replace(
            self.reconciler.config, arrival_ca=pem.decode()
        )

    async def _arrival_tls(
        self,
    ) -> tuple[ServingCert | None, Coroutine[Any, Any, None] | None]:
        """The arrival endpoint's TLS context, and what keeps its certificate current: the
        files given (cert-manager's), or the controller's own certificate in a Secret; (None,
        None) for plain HTTP. The CA is handed to the reconciler before it makes any pod."""
        s = self.settings
        if s.arrival_tls is not None:
            cert = ServingCert(*s.arrival_tls)
            if s.arrival_ca_file:
                try:
                    self._give_ca(Path(s.arrival_ca_file).read_bytes())  # noqa: ASYNC240 (once)
                except OSError as e:
                    # cert-manager writes ca.crt for a CA issuer only: the others' certificates
                    # chain to a CA the pods' system store knows.
                    log.warning("no CA for the agents (%s): they verify with their system's", e)
            return cert, cert.follow()
        if s.arrival_tls_secret is None:
            return None, None
        serving: list[ServingCert] = []

        def changed(data: Mapping[str, bytes]) -> None:
            self._give_ca(data[CA_CERT])
            if serving:
                try:
                    serving[0].load_pem(data[TLS_CERT], data[TLS_KEY])
                except ssl.SSLError as e:
                    log.error("renewed arrival certificate not loaded (%s): serving the old", e)
                    return
                log.info("arrival certificate renewed: new handshakes get it")

        host = urllib.parse.urlsplit(s.arrival_url or "").hostname or "localhost"
        namespace, name = s.arrival_tls_secret
        keeper = ServingSecret(self.kube, namespace, name, service_names(host), changed)
        data = await keeper.start()
        serving.append(ServingCert.from_pem(data[TLS_CERT], data[TLS_KEY]))
        return serving[0], keeper.follow()

    async def run(self) -> int:
        """Runs until cancelled (returns 0) or until the Lease is lost (returns 1)."""
        servers: list[HttpServer] = []
        reloads: asyncio.Task[None] | None = None  # the arrival endpoint's certificate
        app_ready: Callable[[], bool] = self.synced
        for addr in {self.settings.metrics_address, self.settings.health_address} - {None}:
            assert addr is not None
            server = HttpServer(probes_app(app_ready, healthy=self.healthy), addr[0], addr[1])
            await server.start()
            servers.append(server)
        if self.settings.arrival_address is not None:
            host, port = self.settings.arrival_address
            app = arrivals_app(
                self.arrivals,
                self.authenticator.authenticate,
                self.jobs.get,
                pod_job=self._pod_job,
                accepting=lambda: self.is_leader and self.synced(),
                on_report=self._on_report,
                on_news=self._enqueue,
                lookup=self.authenticator.lookup,
            )
            cert, follow = await self._arrival_tls()
            # A gang of thousands restarts at once: its reports must not overflow the backlog.
            server = HttpServer(
                app, host, port, backlog=4096, ssl_context=cert.context if cert else None
            )
            await server.start()
            servers.append(server)
            if follow is not None:
                reloads = asyncio.create_task(follow)
            log.info("arrival endpoint on %s:%s (%s)", host, server.port, "TLS" if cert else "HTTP")
        store_tasks = [asyncio.create_task(s.run()) for s in self.stores]
        # A replica restarted in the same pod (it lost the Lease) must not keep drawing traffic.
        await self._label_own_pod(False)
        lost = False
        try:
            if self.settings.leader_elect:
                cfg = LeaderElectionConfig(
                    name=self.settings.leader_election_id,
                    namespace=self.settings.leader_election_namespace,
                    identity=self.settings.identity,
                    lease_duration=self.settings.leader_election_timing[0],
                    renew_deadline=self.settings.leader_election_timing[1],
                    retry_period=self.settings.leader_election_timing[2],
                )
                self.elector = LeaderElector(self.kube, cfg)

                def stopped() -> None:
                    nonlocal lost
                    lost = True
                    self.is_leader = False

                log.info("waiting for the lease %s/%s", cfg.namespace, cfg.name)
                await self.elector.run(self._lead, stopped)
            else:
                await self._lead()
        finally:
            for t in store_tasks:
                t.cancel()
            for t in store_tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            if reloads is not None:
                reloads.cancel()
            for server in servers:
                await server.stop()
        if lost:
            log.error("lost the lease; exiting")
            return 1
        return 0


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}_{int(time.time())}"


__all__ = ["CONTROLLER_NAME", "LEASES", "Manager", "Settings", "default_identity"]


def barrier_waits_for(spec: Mapping[str, Any], status: Mapping[str, Any]) -> int | None:
    """How many workers the barrier waits for, read from the raw GangJob the cache holds: the
    running roles' (`status.roles`), or for a status written before roles, `spec.replicas`
    and an elastic gang's spares; less the workers an elastic gang goes on without, its spares
    among them (`status.dropped`). None if the object
    says neither (the pass then decides alone)."""
    dropped = status.get("dropped")
    less = len(dropped) if isinstance(dropped, list) else 0
    roles = [r for r in status.get("roles") or () if isinstance(r, Mapping)]
    if roles:
        counts = [r.get("replicas") for r in roles if r.get("state") == "Running"]
        return sum(n for n in counts if isinstance(n, int)) - less
    replicas = spec.get("replicas")
    elastic = spec.get("elastic")
    spares = elastic.get("spares") if isinstance(elastic, Mapping) else None
    more = spares if isinstance(spares, int) else 0
    return replicas + more - less if isinstance(replicas, int) else None
