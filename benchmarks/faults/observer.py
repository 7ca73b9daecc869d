"""The campaign's independent observer: its own watches of GangJobs and pods (its own client),
the simulated kubelet's view of which trainer runs where, and the invariants checked on them.

It shares no code with the controller's decisions (no `controller.policy`, `reconcile`,
`manager` or `arrivals`; import-linter holds it to that): what a GangJob's status means is read
here from the fields as docs/api.md defines them. `Checker` is pure (observations in,
violations out) so that a unit test can feed it a violating history; `Observer` feeds it from
the cluster and the simulation.

The invariants (`INVARIANTS`, each a violation's `invariant`):
- `duplicate-rank`: never two live trainers of the same rank of a gang past a barrier;
- `stale-epoch`: never a live trainer past the barrier at an epoch older than the job's
  `status.barrierEpoch`;
- `end-state`: after each fault, every gang it touched is Running at an open barrier (every
  worker past it), or Failed with the reason the failure policy gives, within `recovery_bound`;
- `budget`: infrastructure faults (node, device, controller, apiserver, etcd, endpoint) leave
  `status.restarts.counted` alone, a restart with an infrastructure trigger is never counted,
  and crashes count at most once each;
- `lost-record`: no GangJob disappears unless the campaign deleted it, no status field of the
  protocol goes backwards (`epoch`, `barrierEpoch`, `restarts.*`), and at the end every rank
  of every live gang has its pod;
- `terminating`: no pod stays Terminating longer than `terminating_bound`;
- `restart-once`: every epoch bump is recorded once in `status.restarts.total`, a single
  failure bumps once, the history never holds an epoch twice, and no restart has two
  `GangRestarting` Events;
- `hang`: a trainer that stopped reporting its steps while it runs restarts its gang as class
  `Hang` naming that worker (`trigger.worker`), the epoch raised within `hang_bound` of its
  last step (seen by this observer's watch);
- `straggler`: a worker whose device the campaign slowed is named in `status.progress.stragglers`
  within `straggler_bound`; a gang whose rule moves stragglers restarts once as class
  `Straggler` naming it, its pod then on another node; a gang without that rule does not
  restart for it; and no worker whose device was not slowed is ever named.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.agent import Step
from api.constants import LABEL_NAME, LABEL_RANK, AgentPlacement
from api.failures import UNCOUNTED, FailureClass
from benchmarks.scale.observer import follow
from controller.k8s import CORE_EVENTS, GANGJOBS, PODS, JsonDict, Kube
from localcluster.simkubelet import SimKubelet, SimTrainer, Worker

INVARIANTS = (
    "duplicate-rank",
    "stale-epoch",
    "end-state",
    "budget",
    "lost-record",
    "terminating",
    "restart-once",
    "hang",
    "straggler",
)
FAIL_REASON_EXIT_CODE = "NonRetriableExitCode"
"""The Failed condition's reason when a `FailJob` rule matched an exit code (docs/api.md)."""
RESTARTING_EVENT = "GangRestarting"


@dataclass(frozen=True)
class Violation:
    invariant: str
    job: str
    detail: str
    at: float
    """`time.monotonic()` when it was seen."""


@dataclass(frozen=True)
class LiveTrainer:
    """A trainer the simulation runs past a barrier: `Pod` mode, an agent whose probe is open;
    `Process` mode, a stand-in trainer run not ended."""

    job: str
    rank: int
    pod_uid: str
    epoch: int


@dataclass(frozen=True)
class JobFacts:
    """What the invariants read of one GangJob's status."""

    phase: str = ""
    epoch: int = 0
    barrier: int | None = None
    total: int = 0
    counted: int = 0
    failed_reason: str = ""

    @staticmethod
    def of(job: Mapping[str, Any]) -> JobFacts:
        st = job.get("status") or {}
        restarts = st.get("restarts") or {}
        failed = [
            c for c in st.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"
        ]
        return JobFacts(
            phase=str(st.get("phase") or ""),
            epoch=int(st.get("epoch") or 0),
            barrier=st.get("barrierEpoch"),
            total=int(restarts.get("total") or 0),
            counted=int(restarts.get("counted") or 0),
            failed_reason=str(failed[0].get("reason", "")) if failed else "",
        )

    @property
    def open(self) -> bool:
        """Running with the barrier of its epoch open."""
        return self.phase == "Running" and self.barrier == self.epoch


@dataclass(frozen=True)
class FaultOutcome:
    """One injected fault as the campaign saw it, for the checks that follow a fault."""

    kind: str
    jobs: tuple[str, ...]
    """The gangs it touched."""
    before: Mapping[str, JobFacts]
    after: Mapping[str, JobFacts]
    recovered: bool
    """Every touched gang reached its end state within the bound."""
    crashes: Mapping[str, int] = field(default_factory=dict)
    """Worker crashes injected per gang (each may count against the budget once)."""
    failing: frozenset[str] = frozenset()
    """Gangs given a non-retriable exit: they must end Failed."""
    single: frozenset[str] = frozenset()
    """Gangs that had exactly one failure: exactly one epoch bump."""
    infra: bool = False
    """No crash at all: the budget must not move."""
    hung: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    """Gangs whose worker's trainer hung: (its worker number, `time.monotonic()` of its last
    step)."""
    slowed: Mapping[str, tuple[int, str, bool, float]] = field(default_factory=dict)
    """Gangs whose worker's device the campaign slowed: (its worker number, its node, whether
    the gang's rule moves stragglers, `time.monotonic()` when)."""


_MONOTONE = ("epoch", "barrierEpoch", "restarts.total", "restarts.counted")


def _path(job: Mapping[str, Any], dotted: str) -> int | None:
    value: Any = job.get("status") or {}
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value if isinstance(value, int) else None


class Checker:
    """The invariants over observations; `violations` collects what broke them."""

    def __init__(
        self,
        terminating_bound: float,
        recovery_bound: float,
        hang_bound: float = 15.0,
        straggler_bound: float = 60.0,
    ) -> None:
        self.terminating_bound = terminating_bound
        self.recovery_bound = recovery_bound
        self.hang_bound = hang_bound
        """A hung trainer's last step to the epoch raised for it, at most."""
        self.hang_detections: list[tuple[str, int, float]] = []
        """(job, epoch, seconds): each hang's last step to the epoch raised, as seen."""
        self.straggler_bound = straggler_bound
        """A slowed device to its worker named a straggler, at most."""
        self.straggler_detections: list[tuple[str, int, float]] = []
        """(job, worker, seconds): each slowed device to its worker named, as seen."""
        self._listed: dict[str, tuple[str, frozenset[int]]] = {}  # job -> (uid, ranks listed)
        self._named: dict[tuple[str, int], float] = {}  # (job, worker) -> when it was listed
        self._slowing: set[tuple[str, int]] = set()
        self.violations: list[Violation] = []
        self._jobs: dict[str, JsonDict] = {}
        self._deleting: set[str] = set()
        self._terminating: dict[str, tuple[float, str, str]] = {}  # uid -> (since, job, name)
        self._flagged: set[tuple[str, str]] = set()
        self._counted_infra: set[tuple[str, int]] = set()
        self._triggers: dict[str, dict[int, str]] = {}  # job -> epoch -> what bumped to it
        # job -> epoch -> (class, worker) of the trigger that raised it, and when it was seen
        self._trigger_of: dict[str, dict[int, tuple[Any, Any]]] = {}
        self._epoch_seen: dict[str, dict[int, float]] = {}
        self._pod_nodes: dict[tuple[str, int], str] = {}  # (job, rank) -> its pod's node
        # job -> epoch -> the node of a NodeLost trigger's worker, as its pod was last seen
        self._lost_on: dict[str, dict[int, str]] = {}
        self.lost_nodes: set[str] = set()
        """Nodes the campaign lost on purpose."""
        self.collateral: list[tuple[str, int, str]] = []
        """(job, epoch, node): bumps for a node the campaign did not lose, that the control
        plane's own faults made NotReady (the node lifecycle controller, when heartbeats
        could not reach a restarting apiserver for its grace period): a real node loss as
        far as any controller can tell, and a failure of its own."""

    def _flag(self, invariant: str, job: str, detail: str, now: float, key: str = "") -> None:
        """Records a violation; one `key` is flagged once (a condition seen on every sample)."""
        if key:
            if (invariant, key) in self._flagged:
                return
            self._flagged.add((invariant, key))
        self.violations.append(Violation(invariant, job, detail, now))

    # -- continuous ----------------------------------------------------------------------
    def trainers(self, now: float, live: Iterable[LiveTrainer]) -> None:
        """A sample of the live trainers: at most one per rank, none behind the barrier."""
        by_rank: dict[tuple[str, int], list[LiveTrainer]] = {}
        for t in live:
            by_rank.setdefault((t.job, t.rank), []).append(t)
            barrier = _path(self._jobs.get(t.job, {}), "barrierEpoch")
            if barrier is not None and t.epoch < barrier:
                self._flag(
                    "stale-epoch",
                    t.job,
                    f"rank {t.rank} (pod {t.pod_uid}) runs at epoch {t.epoch}, barrier {barrier}",
                    now,
                    f"{t.pod_uid}/{t.epoch}/{barrier}",
                )
        for (job, rank), ts in by_rank.items():
            if len(ts) > 1:
                runs = ", ".join(f"pod {t.pod_uid} at epoch {t.epoch}" for t in ts)
                key = "|".join(sorted(f"{t.pod_uid}/{t.epoch}" for t in ts))
                self._flag("duplicate-rank", job, f"rank {rank}: {runs}", now, key)

    def expect_deleted(self, name: str) -> None:
        """The campaign deletes this GangJob: its disappearance is no loss."""
        self._deleting.add(name)

    def job(self, now: float, name: str, job: JsonDict | None) -> None:
        """A GangJob as the watch shows it (None: deleted)."""
        old = self._jobs.get(name)
        if job is None:
            self._jobs.pop(name, None)
            if name not in self._deleting and old is not None:
                self._flag("lost-record", name, "the GangJob disappeared", now)
            return
        if old is not None and old["metadata"].get("uid") == job["metadata"].get("uid"):
            if old.get("status") and not job.get("status"):
                self._flag("lost-record", name, "its status disappeared", now)
            for dotted in _MONOTONE:
                a, b = _path(old, dotted), _path(job, dotted)
                if a is not None and (b is None or b < a):
                    self._flag("lost-record", name, f"status.{dotted} went {a} -> {b}", now)
        if old is not None and old["metadata"].get("uid") != job["metadata"].get("uid"):
            self._triggers.pop(name, None)
            self._lost_on.pop(name, None)
            self._trigger_of.pop(name, None)
            self._epoch_seen.pop(name, None)
        self._jobs[name] = job
        epoch = _path(job, "epoch")
        if epoch is not None:
            self._epoch_seen.setdefault(name, {}).setdefault(epoch, now)
        last = (job.get("status") or {}).get("lastRestart") or {}
        trigger = last.get("trigger") or {}
        if isinstance(last.get("epoch"), int):
            self._triggers.setdefault(name, {})[last["epoch"]] = (
                f"{trigger.get('class')} of worker {trigger.get('worker')}"
                f" ({str(trigger.get('detail') or '')[:100]})"
            )
            self._trigger_of.setdefault(name, {})[last["epoch"]] = (
                trigger.get("class"),
                trigger.get("worker"),
            )
            node = self._pod_nodes.get((name, trigger.get("worker", -1)))
            if trigger.get("class") == "NodeLost" and node:
                self._lost_on.setdefault(name, {}).setdefault(last["epoch"], node)
        self._stragglers(now, name, job)
        # The campaign's gangs have no rule that changes counting: a restart of a class that
        # counts nothing by default must not have counted.
        if trigger.get("class") in UNCOUNTED and last.get("counted"):
            self._flag(
                "budget",
                name,
                f"restart to epoch {last.get('epoch')} ({trigger['class']}) was counted",
                now,
                f"{name}/{last.get('epoch')}",
            )

    def expect_straggler(self, job: str, worker: int) -> None:
        """The campaign slows this worker's device: its naming is expected, until its fault
        is done."""
        self._slowing.add((job, worker))

    def named(self, job: str, worker: int) -> bool:
        """The worker was named a straggler since the campaign slowed its device."""
        return (job, worker) in self._named

    def listed(self, job: str, worker: int) -> bool:
        """The worker is in the job's `status.progress.stragglers` now."""
        return worker in self._listed.get(job, ("", frozenset()))[1]

    def _stragglers(self, now: float, name: str, job: JsonDict) -> None:
        """The workers newly in `status.progress.stragglers`: named, if the campaign slowed
        their device; else a healthy worker named, a violation."""
        uid = str(job["metadata"].get("uid"))
        progress = (job.get("status") or {}).get("progress") or {}
        ranks = frozenset(r for r in progress.get("stragglers") or () if isinstance(r, int))
        held_uid, held = self._listed.get(name, (uid, frozenset()))
        if held_uid != uid:
            held = frozenset()
        self._listed[name] = (uid, ranks)
        for rank in sorted(ranks - held):
            if (name, rank) in self._slowing:
                self._named.setdefault((name, rank), now)
            else:
                self._flag(
                    "straggler", name, f"worker {rank} named a straggler; its device was not "
                    "slowed", now, f"{uid}/{rank}/{now:.0f}",
                )  # fmt: skip

    def pod(self, now: float, pod: JsonDict, gone: bool = False) -> None:
        """A pod event: how long it has been Terminating is tracked by its UID."""
        meta = pod["metadata"]
        uid = meta["uid"]
        labels = meta.get("labels") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        rank = str(labels.get(LABEL_RANK, ""))
        if not gone and node and rank.isdigit():
            self._pod_nodes[(labels.get(LABEL_NAME, ""), int(rank))] = node
        if gone:
            self._terminating.pop(uid, None)
        elif meta.get("deletionTimestamp") and uid not in self._terminating:
            job = (meta.get("labels") or {}).get(LABEL_NAME, "")
            self._terminating[uid] = (now, job, meta["name"])

    def pods_listed(self, now: float, pods: Iterable[JsonDict]) -> None:
        """A fresh list: pods no longer there are gone."""
        listed = {p["metadata"]["uid"] for p in pods}
        for uid in list(self._terminating):
            if uid not in listed:
                del self._terminating[uid]

    def tick(self, now: float) -> None:
        """Time passes: pods Terminating past the bound."""
        for uid, (since, job, name) in self._terminating.items():
            if now - since > self.terminating_bound:
                self._flag(
                    "terminating",
                    job,
                    f"pod {name} ({uid}) Terminating over {self.terminating_bound:.0f}s",
                    now,
                    uid,
                )

    # -- after each fault ----------------------------------------------------------------
    def fault_done(self, now: float, f: FaultOutcome) -> None:
        for job in f.jobs:
            before, after = f.before.get(job, JobFacts()), f.after.get(job, JobFacts())
            where = f"after {f.kind}"
            if job in f.failing:
                if after.phase != "Failed" or after.failed_reason != FAIL_REASON_EXIT_CODE:
                    self._flag(
                        "end-state",
                        job,
                        f"{where}: phase {after.phase!r}, reason {after.failed_reason!r}; "
                        f"want Failed, {FAIL_REASON_EXIT_CODE}",
                        now,
                    )
                continue
            if not f.recovered or not after.open:
                self._flag(
                    "end-state",
                    job,
                    f"{where}: not Running at an open barrier within "
                    f"{self.recovery_bound:.0f}s (phase {after.phase!r}, epoch {after.epoch}, "
                    f"barrier {after.barrier})",
                    now,
                )
            bumps = after.epoch - before.epoch
            if after.total - before.total != bumps:
                self._flag(
                    "restart-once",
                    job,
                    f"{where}: epoch {before.epoch} -> {after.epoch} but restarts.total "
                    f"{before.total} -> {after.total}",
                    now,
                )
            collateral = self._collateral(job, before.epoch, after.epoch)
            # A collateral node loss is a failure of its own: one bump more, or none if the
            # same restart took it in.
            if job in f.single and not 1 <= bumps <= 1 + len(collateral):
                self._flag(
                    "restart-once",
                    job,
                    f"{where}: one failure, {bumps} epoch bumps"
                    + self._bumps_text(job, before.epoch, after.epoch),
                    now,
                )
            self.collateral += [(job, epoch, node) for epoch, node in collateral]
            if job in f.hung:
                self._hang(now, job, before.epoch + 1, *f.hung[job])
            if job in f.slowed:
                self._slowed(now, job, before, after, *f.slowed[job])
            counted = after.counted - before.counted
            allowed = 0 if f.infra else f.crashes.get(job, 0)
            if counted > allowed:
                self._flag(
                    "budget",
                    job,
                    f"{where}: restarts.counted +{counted}, at most +{allowed} allowed",
                    now,
                )

    def _hang(self, now: float, job: str, epoch: int, worker: int, last_step: float) -> None:
        """The gang's first restart after its worker's trainer hung: as class `Hang`, naming
        that worker, within `hang_bound` of the trainer's last step."""
        cls, named = self._trigger_of.get(job, {}).get(epoch, (None, None))
        seen = self._epoch_seen.get(job, {}).get(epoch)
        want = f"{FailureClass.HANG} of worker {worker}"
        if seen is None or cls is None:
            self._flag("hang", job, f"worker {worker} hung; no restart to epoch {epoch} seen", now)
            return
        self.hang_detections.append((job, epoch, seen - last_step))
        if cls != FailureClass.HANG or named != worker:
            self._flag(
                "hang", job, f"restart to epoch {epoch} was {cls} of worker {named}; want {want}",
                now,
            )  # fmt: skip
        if seen - last_step > self.hang_bound:
            self._flag(
                "hang",
                job,
                f"epoch {epoch} raised {seen - last_step:.1f}s after worker {worker}'s last "
                f"step; bound {self.hang_bound:g}s",
                now,
            )

    def _slowed(
        self, now: float, job: str, before: JobFacts, after: JobFacts, worker: int, node: str,
        moves: bool, at: float,
    ) -> None:  # fmt: skip
        """A slowed worker was named within the bound; moved off its node by a restart naming
        it where the gang's rule says so, else no restart for it. Its expectation ends."""
        self._slowing.discard((job, worker))
        named = self._named.pop((job, worker), None)
        if named is None:
            self._flag("straggler", job, f"worker {worker}'s device slowed; never named", now)
            return
        self.straggler_detections.append((job, worker, named - at))
        if named - at > self.straggler_bound:
            self._flag(
                "straggler", job, f"worker {worker} named {named - at:.1f}s after its device "
                f"slowed; bound {self.straggler_bound:g}s", now,
            )  # fmt: skip
        if not moves:
            if after.epoch != before.epoch:
                self._flag(
                    "straggler", job, f"reported only, yet epoch {before.epoch} -> {after.epoch}"
                    + self._bumps_text(job, before.epoch, after.epoch), now,
                )  # fmt: skip
            return
        cls, named_worker = self._trigger_of.get(job, {}).get(before.epoch + 1, (None, None))
        if cls != FailureClass.STRAGGLER or named_worker != worker:
            self._flag(
                "straggler", job, f"restart to epoch {before.epoch + 1} was {cls} of worker "
                f"{named_worker}; want {FailureClass.STRAGGLER} of worker {worker}", now,
            )  # fmt: skip
        moved_to = self._pod_nodes.get((job, worker))
        if moved_to == node:
            self._flag("straggler", job, f"worker {worker} still on {node} after its move", now)

    def _collateral(self, job: str, since: int, to: int) -> list[tuple[int, str]]:
        """The bumps from `since` to `to` for the loss of a node the campaign did not lose."""
        lost = self._lost_on.get(job, {})
        return [
            (e, lost[e]) for e in range(since + 1, to + 1)
            if e in lost and lost[e] not in self.lost_nodes
        ]  # fmt: skip

    def _bumps_text(self, job: str, since: int, to: int) -> str:
        """What raised the epoch from `since` to `to`, as the job's `lastRestart` triggers
        showed it: the first question about an unexpected bump."""
        seen = self._triggers.get(job, {})
        bumps = [f"{e}: {seen.get(e, 'trigger not seen')}" for e in range(since + 1, to + 1)]
        return f" ({'; '.join(bumps)})" if bumps else ""

    # -- at the end ----------------------------------------------------------------------
    def end(
        self,
        now: float,
        jobs: Mapping[str, JsonDict],
        pods: Mapping[str, Iterable[JsonDict]],
        events: Iterable[JsonDict],
    ) -> None:
        """The final state: every live gang has its pods, each restart recorded once."""
        restarting: dict[str, int] = {}
        for e in events:
            if e.get("reason") == RESTARTING_EVENT:
                name = e.get("involvedObject", {}).get("name", "")
                restarting[name] = restarting.get(name, 0) + int(e.get("count") or 1)
        for name, job in jobs.items():
            facts = JobFacts.of(job)
            if facts.phase != "Failed":
                replicas = int(job["spec"].get("replicas") or 0)
                live = [p for p in pods.get(name, []) if not p["metadata"].get("deletionTimestamp")]
                ranks = {(p["metadata"].get("labels") or {}).get(LABEL_RANK) for p in live}
                missing = sorted(set(map(str, range(replicas))) - ranks)
                if missing:
                    self._flag("lost-record", name, f"ranks {missing} have no pod", now)
            if restarting.get(name, 0) > facts.total:
                self._flag(
                    "restart-once",
                    name,
                    f"{restarting[name]} {RESTARTING_EVENT} Events for {facts.total} restarts",
                    now,
                )
            history = [h.get("epoch") for h in (job.get("status") or {}).get("history") or []]
            if len(history) != len(set(history)):
                self._flag("restart-once", name, f"history repeats an epoch: {history}", now)


# -- the live observer ----------------------------------------------------------------------


@dataclass
class _Seen:
    job: str
    rank: int
    worker: Worker
    agents: list[Any] = field(default_factory=list)


class Observer:
    """Feeds a `Checker` from its own watches (GangJobs, pods) and from the simulation's
    agents and trainers, sampled every `period` seconds."""

    def __init__(
        self, kube: Kube, ns: str, sim: SimKubelet, checker: Checker, period: float = 0.1
    ) -> None:
        self.kube, self.ns, self.sim, self.checker, self.period = kube, ns, sim, checker, period
        self.jobs: dict[str, JsonDict] = {}
        self._seen: dict[int, _Seen] = {}  # id(Worker) -> what it runs
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                follow(
                    self.kube,
                    GANGJOBS,
                    self.ns,
                    on_list=self._jobs_listed,
                    on_event=self._job_event,
                )
            ),
            asyncio.create_task(
                follow(
                    self.kube,
                    PODS,
                    self.ns,
                    on_list=self._pods_listed,
                    on_event=self._pod_event,
                    label_selector=LABEL_NAME,
                )
            ),
            asyncio.create_task(self._sample()),
        ]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def facts(self, name: str) -> JobFacts:
        return JobFacts.of(self.jobs.get(name, {}))

    def _jobs_listed(self, items: list[JsonDict]) -> None:
        now = time.monotonic()
        names = {j["metadata"]["name"] for j in items}
        for name in list(self.jobs):
            if name not in names:
                self._job_event("DELETED", self.jobs[name])
        for j in items:
            self._job_event("MODIFIED", j)
        self.checker.tick(now)

    def _job_event(self, kind: str, job: JsonDict) -> None:
        name = job["metadata"]["name"]
        if kind == "DELETED":
            self.jobs.pop(name, None)
            self.checker.job(time.monotonic(), name, None)
        else:
            self.jobs[name] = job
            self.checker.job(time.monotonic(), name, job)

    def _pods_listed(self, items: list[JsonDict]) -> None:
        now = time.monotonic()
        self.checker.pods_listed(now, items)
        for p in items:
            self.checker.pod(now, p)

    def _pod_event(self, kind: str, pod: JsonDict) -> None:
        self.checker.pod(time.monotonic(), pod, gone=kind == "DELETED")

    async def _sample(self) -> None:
        while True:
            now = time.monotonic()
            self.checker.trainers(now, self.live_trainers())
            self.checker.tick(now)
            await asyncio.sleep(self.period)  # a sampling period: the simulation has no events

    def live_trainers(self) -> list[LiveTrainer]:
        """Every trainer running past a barrier, from every agent and trainer run this
        simulation has had (a stopped worker's included, until it has really ended)."""
        for w in self.sim.workers.values():
            seen = self._seen.get(id(w))
            if seen is None:
                pod = self.sim.pods.get(w.name)
                if pod is None or pod["metadata"]["uid"] != w.uid:
                    continue
                labels = pod["metadata"].get("labels") or {}
                seen = _Seen(labels.get(LABEL_NAME, ""), int(labels.get(LABEL_RANK, -1)), w)
                self._seen[id(w)] = seen
            if w.agent is not None and (not seen.agents or seen.agents[-1] is not w.agent):
                seen.agents.append(w.agent)
        out: list[LiveTrainer] = []
        for key, seen in list(self._seen.items()):
            w = seen.worker
            if w.mode is AgentPlacement.WRAPPER:
                runs: list[SimTrainer] = [r for r in w.trainer_runs if r.running]
                out += [LiveTrainer(seen.job, seen.rank, w.uid, r.epoch) for r in runs]
                alive = bool(runs) or any(a.state.step is not Step.DONE for a in seen.agents)
            else:
                alive = False
                for a in seen.agents:
                    st = a.state
                    if st.step is Step.RUNNING and st.barrier_open and st.epoch is not None:
                        out.append(LiveTrainer(seen.job, seen.rank, w.uid, st.epoch))
                    alive |= st.step is not Step.DONE
                seen.agents = [a for a in seen.agents if a.state.step is not Step.DONE]
            if not alive and self.sim.workers.get(w.name) is not w:
                del self._seen[key]
        return out

    async def final(self) -> None:
        """The end-of-campaign checks, on fresh lists."""
        jobs = {j["metadata"]["name"]: j for j in (await self.kube.list(GANGJOBS, self.ns)).items}
        pods: dict[str, list[JsonDict]] = {}
        for p in (await self.kube.list(PODS, self.ns, label_selector=LABEL_NAME)).items:
            pods.setdefault(p["metadata"]["labels"][LABEL_NAME], []).append(p)
        events = (await self.kube.list(CORE_EVENTS, self.ns)).items
        self.checker.end(time.monotonic(), jobs, pods, events)
