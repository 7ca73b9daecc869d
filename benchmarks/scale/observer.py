"""What the benchmark watches, and when it saw it (this process's monotonic clock): the
GangJob's `status.epoch` and `barrierEpoch` through a watch of its own, the simulated kubelet's
status writes and its agents' protocol state, and the controller's own metrics. A measurement
is a set of milestones, each a `Check` that says when it was reached."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.agent import Step
from benchmarks.common import Progress, cpu_seconds
from benchmarks.scale.settings import POLL
from controller.k8s import GANGJOBS, JsonDict, Kube, ResourceKind
from localcluster.handle import ClusterHandle
from localcluster.simkubelet import SimKubelet
from localcluster.tools import ControllerProcess

log = logging.getLogger("bench")


class JobTracker:
    """Watches one GangJob; remembers when each value of `status.epoch` and
    `status.barrierEpoch` was first seen (this process's monotonic clock)."""

    def __init__(self, kube: Kube, ns: str, name: str) -> None:
        self.kube, self.ns, self.name = kube, ns, name
        self.job: JsonDict = {}
        self.epoch_at: dict[int, float] = {}
        self.barrier_at: dict[int, float] = {}
        self.writes = 0
        """Changes of the GangJob seen since the watch began (each a write of it)."""

    @property
    def status(self) -> JsonDict:
        st = self.job.get("status")
        return st if isinstance(st, dict) else {}

    def _seen(self, job: JsonDict) -> None:
        now = time.monotonic()
        self.job = job
        st = self.status
        if isinstance(st.get("epoch"), int):
            self.epoch_at.setdefault(st["epoch"], now)
        if isinstance(st.get("barrierEpoch"), int):
            self.barrier_at.setdefault(st["barrierEpoch"], now)

    def _listed(self, items: list[JsonDict]) -> None:
        for item in items:
            self._seen(item)

    def _event(self, kind: str, job: JsonDict) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self.writes += 1
            self._seen(job)

    async def run(self) -> None:
        await follow(
            self.kube, GANGJOBS, self.ns, on_list=self._listed, on_event=self._event,
            field_selector=f"metadata.name={self.name}",
        )  # fmt: skip


async def follow(
    kube: Kube,
    kind: ResourceKind,
    ns: str,
    *,
    on_list: Callable[[list[JsonDict]], object],
    on_event: Callable[[str, JsonDict], object],
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> None:
    """Lists, then watches from the list's version, until cancelled; lists again (`on_list`
    gets every object anew) whenever the watch breaks. Bookmarks are not passed on."""
    rv: str | None = None
    while True:
        try:
            if rv is None:
                listed = await kube.list(
                    kind, ns, label_selector=label_selector, field_selector=field_selector
                )
                on_list(listed.items)
                rv = listed.resource_version
            stream = kube.watch(
                kind, ns, label_selector=label_selector, field_selector=field_selector,
                resource_version=rv,
            )  # fmt: skip
            async with contextlib.aclosing(stream):
                async for ev in stream:
                    if ev.type != "BOOKMARK":
                        on_event(ev.type, ev.object)
                    rv = ev.object.get("metadata", {}).get("resourceVersion") or rv
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a dropped watch under load: list again
            log.warning("%s watch broke (%s); listing again", kind.resource, e)
            rv = None
            await asyncio.sleep(0.2)


Check = Callable[[], float | None]
"""A milestone: the monotonic time it was reached, or None while it is not."""


def written_after(worker: Any, kind: str, t0: float) -> Check:
    """The simulated kubelet's `kind` status write for this worker, if it came after `t0` (a
    worker keeps the marks of its earlier restarts)."""

    def check() -> float | None:
        t = worker.written.get(kind)
        return t if t is not None and t > t0 else None

    return check


def polled(cond: Callable[[], bool]) -> Check:
    """A milestone known only by polling: reached at the first poll that finds `cond`."""
    return lambda: time.monotonic() if cond() else None


class NotReached(TimeoutError):
    """Milestones still missing when their time limit ran out; `reached` has the others."""

    def __init__(self, timeout: float, reached: dict[str, float], missing: list[str], state: str):
        super().__init__(f"not reached in {timeout:.0f}s: {missing}; {state}")
        self.timeout, self.reached, self.missing, self.state = timeout, reached, missing, state


async def milestones(
    checks: dict[str, Check], timeout: float, progress: Progress, state: Callable[[], str]
) -> dict[str, float]:
    """Polls until every check is reached; returns each one's time."""
    reached: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while True:
        for name, check in checks.items():
            if name not in reached:
                t = check()
                if t is not None:
                    reached[name] = t
        if len(reached) == len(checks):
            return reached
        if time.monotonic() > deadline:
            raise NotReached(timeout, reached, [n for n in checks if n not in reached], state())
        progress.tick(state)
        await asyncio.sleep(POLL)


_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ApiSample:
    """The apiserver's own counters, every client's traffic (the kubelets', the scheduler's,
    the controller-manager's and ours): requests by `VERB resource[/subresource]`, and the
    bytes of the watch events it sent, by resource (`apiserver_watch_events_sizes`, one
    observation per event per watcher). What docs/scale.md's model is built from."""

    requests: dict[str, float]
    watch_bytes: dict[str, float]

    @classmethod
    async def take(cls, cluster: ClusterHandle) -> ApiSample:
        text = await asyncio.to_thread(cluster.api, "GET", "/metrics", None, 30.0)
        return cls.parse(str(text))

    @classmethod
    def parse(cls, text: str) -> ApiSample:
        requests: dict[str, float] = {}
        watch: dict[str, float] = {}
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m is None or m[1] not in (
                "apiserver_request_total",
                "apiserver_watch_events_sizes_sum",
            ):
                continue
            labels = dict(_LABEL.findall(m[2]))
            if m[1] == "apiserver_request_total":
                resource = labels.get("resource", "")
                if labels.get("subresource"):
                    resource += f"/{labels['subresource']}"
                key = f"{labels.get('verb', '')} {resource}"
                requests[key] = requests.get(key, 0.0) + float(m[3])
            else:
                key = labels.get("resource") or labels.get("kind") or "?"
                watch[key] = watch.get(key, 0.0) + float(m[3])
        return cls(requests, watch)

    def since(self, before: ApiSample) -> dict[str, dict[str, int]]:
        """What changed since `before`: nonzero counts only."""

        def delta(now: dict[str, float], then: dict[str, float]) -> dict[str, int]:
            out = {k: int(v - then.get(k, 0.0)) for k, v in now.items()}
            return {k: v for k, v in sorted(out.items()) if v > 0}

        return {
            "requests": delta(self.requests, before.requests),
            "watch_bytes": delta(self.watch_bytes, before.watch_bytes),
        }


SHARE_METRICS = (
    ("", "gangjob_restart_controller_seconds"),
    ("-write", "gangjob_restart_controller_write_seconds"),
)
"""The controller's share of each restart step, and of it its status write's latency."""


@dataclass
class CtlSample:
    cpu: float
    requests: dict[str, float]
    share_sum: dict[str, float]
    share_count: dict[str, float]
    passes: float = 0.0
    pass_seconds: float = 0.0
    collections: tuple[float, ...] = ()

    @classmethod
    def take(cls, ctl: ControllerProcess) -> CtlSample:
        assert ctl.proc is not None
        methods = ("GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE")
        req = {m: ctl.metric("rest_client_requests_total", {"method": m}) for m in methods}
        req["all"] = ctl.metric("rest_client_requests_total")
        steps = ("bump", "barrier")
        return cls(
            cpu=cpu_seconds(ctl.proc.pid),
            requests=req,
            # Each step's share, and of it the status write's own latency (`<step>-write`).
            share_sum={
                s + suffix: ctl.metric(f"{metric}_sum", {"step": s})
                for s in steps
                for suffix, metric in SHARE_METRICS
            },
            share_count={
                s + suffix: ctl.metric(f"{metric}_count", {"step": s})
                for s in steps
                for suffix, metric in SHARE_METRICS
            },
            passes=ctl.metric("controller_runtime_reconcile_total"),
            pass_seconds=ctl.metric("controller_runtime_reconcile_time_seconds_sum"),
            collections=tuple(
                ctl.metric("python_gc_collections_total", {"generation": str(g)}) for g in range(3)
            ),
        )

    def since(self, before: CtlSample) -> dict[str, Any]:
        share: dict[str, float | None] = {}
        for s, total in self.share_sum.items():
            n = self.share_count[s] - before.share_count[s]
            share[s] = round((total - before.share_sum[s]) / n, 3) if n else None
        return {
            "cpu_s": round(self.cpu - before.cpu, 2),
            "requests": {
                m: int(v - before.requests[m])
                for m, v in self.requests.items()
                if v != before.requests[m]
            },
            "share_s": share,
            # Where the controller's CPU went: its passes over the gang (their count and
            # seconds) and the garbage collector's runs by generation (young, middle, full).
            "passes": int(self.passes - before.passes),
            "pass_s": round(self.pass_seconds - before.pass_seconds, 2),
            "gc": [int(a - b) for a, b in zip(self.collections, before.collections, strict=False)],
        }


def agents_at(sim: SimKubelet, epoch: int, *, opened: bool) -> int:
    """Workers whose agent arrived at `epoch` (and, with `opened`, saw its barrier open)."""
    count = 0
    for wk in sim.workers.values():
        a = wk.agent
        if a is None:
            continue
        st = a.state
        if st.epoch != epoch:
            continue
        if opened:
            count += st.barrier_open
        else:
            count += st.step in (Step.AT_BARRIER, Step.RUNNING)
    return count


class AgentTally:
    """`agents_at` for one epoch, both counts (arrived, opened) from one pass over the agents,
    shared by every check of one poll: the checks of a poll run with no await between them, so
    no agent's state changes under them, and a poll's checks and its progress line cost one
    pass over N agents instead of up to four (at N=5000, a pass is ~2 ms of this process's
    CPU, 20 polls a second)."""

    FRESH = POLL / 5
    """A pass this recent is the current poll's (polls are `POLL` apart)."""

    def __init__(self, sim: SimKubelet, epoch: int) -> None:
        self.sim, self.epoch = sim, epoch
        self._at = -1.0
        self._arrived = self._opened = 0

    def _pass(self) -> None:
        now = time.monotonic()
        if now - self._at < self.FRESH:
            return
        arrived = opened = 0
        epoch = self.epoch
        for wk in self.sim.workers.values():
            a = wk.agent
            if a is None:
                continue
            st = a.state
            if st.epoch != epoch:
                continue
            opened += st.barrier_open
            arrived += st.step in (Step.AT_BARRIER, Step.RUNNING)
        self._at, self._arrived, self._opened = now, arrived, opened

    def arrived(self) -> int:
        """`agents_at(sim, epoch, opened=False)` as of this poll."""
        self._pass()
        return self._arrived

    def opened(self) -> int:
        """`agents_at(sim, epoch, opened=True)` as of this poll."""
        self._pass()
        return self._opened


def pods_where(sim: SimKubelet, pred: Callable[[JsonDict], bool]) -> int:
    return sum(1 for p in sim.pods.values() if pred(p))


def uid(p: JsonDict) -> str:
    """The pod's UID: which pod it is, whatever its name."""
    return str(p["metadata"]["uid"])


def running(p: JsonDict) -> bool:
    """Running and not terminating."""
    return bool(p.get("status", {}).get("phase") == "Running") and not p["metadata"].get(
        "deletionTimestamp"
    )
