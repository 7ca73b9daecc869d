"""The simulated kubelet's status manager: pod status writes on their own timeline, as the real
kubelet's (pkg/kubelet/status/status_manager.go) make them.

The kubelet keeps its own latest status per pod UID; a newer status replaces one not yet sent,
so a pod's pending statuses collapse into one write of the latest. Writes go out from a bounded
set of workers, never two at once for one pod; a failed write (conflict, overload, transport)
is tried again, with backoff, always for the same UID. A write merges the kubelet's part (phase,
its own conditions, the container statuses) into the pod as the apiserver has it, keeping what
others wrote (their conditions, unknown fields), conditional on that version and on the UID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.apiclient import ApiError, ClientError, HttpClient, JsonDict

log = logging.getLogger(__name__)

KUBELET_CONDITIONS = frozenset(
    {"Initialized", "Ready", "ContainersReady", "PodReadyToStartContainers",
     "AllContainersRestarting"}
)  # fmt: skip
"""Pod conditions the kubelet owns: a status it writes replaces these, and only these."""
CONTAINER_LISTS = ("containerStatuses", "initContainerStatuses")
RETRIED = frozenset({429, 500, 502, 503, 504})
"""Answers that say "not now": the write is tried again after a backoff."""

Written = Callable[[float], None]
"""Told `time.monotonic()` when a write holding a status returned."""


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars), as `copy.deepcopy` makes it but
    about 5 times faster: every status change of every pod is copied a few times, and a gang
    restart changes thousands."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    return value


def merge_status(current: JsonDict, kubelet: JsonDict) -> JsonDict:
    """The pod status after the kubelet's write of `kubelet` onto `current`: the kubelet's
    fields replace the current ones; of the conditions only those it owns are replaced; a
    container's entry keeps fields only others write (a device plugin's health, say)."""
    merged: JsonDict = json_copy(current)
    for key, value in kubelet.items():
        if key == "conditions":
            others = [
                c for c in current.get("conditions", []) if c.get("type") not in KUBELET_CONDITIONS
            ]
            owned = [json_copy(c) for c in value if c.get("type") in KUBELET_CONDITIONS]
            merged["conditions"] = others + owned
        elif key in CONTAINER_LISTS:
            now = {c.get("name"): c for c in current.get(key, [])}
            merged[key] = [{**json_copy(now.get(c.get("name"), {})), **c} for c in value]
        else:
            merged[key] = json_copy(value)
    return merged


@dataclass
class _PodStatus:
    """The kubelet's latest status of one pod, and how far the apiserver has it."""

    name: str
    uid: str
    status: JsonDict
    version: int = 0
    sent: int = 0
    """The version last written."""
    marks: list[tuple[int, Written]] = field(default_factory=list)
    """Who to tell when the write holding each version returns."""
    written_pod: JsonDict | None = None
    """The pod as the last write returned it (newer than the watch's copy for a while)."""
    read_again: bool = False
    """The last attempt conflicted: the next one reads the pod first."""
    failures: int = 0


class StatusManager:
    """Pod status writes of one simulated kubelet; `set` is immediate, the writes follow."""

    def __init__(
        self,
        api: HttpClient,
        pods_path: str,
        watched: Callable[[str], JsonDict | None],
        *,
        workers: int = 64,
        slots: asyncio.Semaphore | None = None,
        backoff_initial: float = 0.05,
        backoff_max: float = 5.0,
    ) -> None:
        """`watched(name)`: the pod's latest copy from the kubelet's watch, if any. `slots`
        bounds this process's requests to the apiserver, shared with the kubelet's others."""
        self.api = api
        self.pods_path = pods_path
        self._watched = watched
        self._workers = workers
        self._slots = slots or asyncio.Semaphore(workers)
        self._backoff = (backoff_initial, backoff_max)
        self._pods: dict[str, _PodStatus] = {}  # by UID
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._busy: set[str] = set()  # taken by a worker, or waiting out a backoff
        self._unsent: set[str] = set()
        self._open = asyncio.Event()
        self._open.set()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()
        self.writes = 0
        """Writes that landed."""
        self.conflicts = 0
        """Writes the apiserver refused as conflicting (409): done again on a fresh read."""
        self.retries = 0
        """Writes tried again after overload or a transport error."""

    # -- what the kubelet's pod workers call --------------------------------------------
    def latest(self, uid: str) -> JsonDict | None:
        """A copy of the kubelet's latest status of the pod, None before its first."""
        pod = self._pods.get(uid)
        return json_copy(pod.status) if pod is not None else None

    def set(self, name: str, uid: str, status: JsonDict, written: Written | None = None) -> None:
        """Makes `status` the pod's latest (the manager keeps it: the caller hands it over);
        `written` is told when a write holding it returns. Returns at once."""
        pod = self._pods.get(uid)
        if pod is None:
            pod = self._pods[uid] = _PodStatus(name, uid, status)
        pod.status = status
        pod.version += 1
        if written is not None:
            pod.marks.append((pod.version, written))
        self._unsent.add(uid)
        self._start()
        self._enqueue(uid)

    def forget(self, uid: str) -> None:
        """The pod is gone: nothing more is written for it."""
        self._pods.pop(uid, None)
        self._unsent.discard(uid)
        self._poke()

    # -- observing and steering (tests, benchmarks) -------------------------------------
    def pause(self) -> None:
        """Holds every write back (an apiserver out of reach); `set` still takes statuses."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def unsent(self, uid: str) -> bool:
        """The pod has a status the apiserver does not have yet."""
        return uid in self._unsent

    async def drained(self) -> None:
        """Until every pod's latest status is written (or its pod gone)."""
        while self._unsent:
            await self._changed.wait()

    async def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # -- the queue ------------------------------------------------------------------------
    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    def _enqueue(self, uid: str) -> None:
        # One entry per pod: a pod taken by a worker is looked at again when it is done.
        if uid in self._queued or uid in self._busy:
            return
        self._queued.add(uid)
        self._queue.put_nowait(uid)

    def _poke(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _work(self) -> None:
        while True:
            uid = await self._queue.get()
            self._queued.discard(uid)
            self._busy.add(uid)
            delay: float | None = None
            try:
                await self._open.wait()
                delay = await self._sync(uid)
            except Exception:  # a bug: this pod's writes go on after a backoff, the others' too
                log.exception("status of pod uid %s not written", uid)
                pod = self._pods.get(uid)
                delay = self._failed(pod) if pod is not None else None
            finally:
                if delay is None:
                    self._busy.discard(uid)
                    if uid in self._unsent and uid in self._pods:
                        self._enqueue(uid)  # a newer status came while this one was written
                else:
                    self._later(uid, delay)
                self._poke()

    def _later(self, uid: str, delay: float) -> None:
        """Back in the queue after `delay`; busy until then, so that no worker takes it."""

        def again(handle: list[asyncio.TimerHandle]) -> None:
            self._timers.discard(handle[0])
            self._busy.discard(uid)
            if uid in self._pods:
                self._enqueue(uid)

        handle: list[asyncio.TimerHandle] = []
        handle.append(asyncio.get_running_loop().call_later(delay, again, handle))
        self._timers.add(handle[0])

    # -- one write ------------------------------------------------------------------------
    def _base(self, pod: _PodStatus) -> JsonDict | None:
        """The freshest copy of the pod this kubelet holds: its watch's, or its last write's
        answer; None if it has none for this UID or must read the pod again."""
        if pod.read_again:
            return None
        copies = [pod.written_pod, self._watched(pod.name)]
        mine = [c for c in copies if c is not None and c["metadata"]["uid"] == pod.uid]
        return max(mine, key=_version, default=None)

    async def _sync(self, uid: str) -> float | None:
        """Writes the pod's latest status; returns the delay before trying again, or None."""
        pod = self._pods.get(uid)
        if pod is None or pod.sent >= pod.version:
            return None
        version, status = pod.version, pod.status
        path = f"{self.pods_path}/{pod.name}"
        current = self._base(pod)
        try:
            async with self._slots:
                if current is None:
                    current = await self.api.get(path)
                if current["metadata"]["uid"] != uid:
                    # A recreated pod of the same name: this one is gone.
                    log.debug("pod %s is now %s: status of %s dropped", pod.name,
                              current["metadata"]["uid"], uid)  # fmt: skip
                    self.forget(uid)
                    return None
                meta = {"uid": uid, "resourceVersion": current["metadata"]["resourceVersion"]}
                body = {"metadata": meta, "status": merge_status(current.get("status", {}), status)}
                answer = await self.api.merge_patch(f"{path}/status", body)
        except ApiError as e:
            if e.status == 404:
                self.forget(uid)
                return None
            if e.status == 409:
                # Another writer came first (or another pod has the name): read, then again.
                self.conflicts += 1
                pod.read_again = True
                return 0.0
            if e.status not in RETRIED:
                # Invalid: sending it again would not help. A newer status is tried afresh.
                log.error("status of %s (uid %s) refused, dropped: %s", pod.name, uid, e)
                pod.sent = version
                pod.marks = [(v, w) for v, w in pod.marks if v > version]
                if pod.version == version:
                    self._unsent.discard(uid)
                return None
            log.debug("status of %s not written (%s); again later", pod.name, e)
            return self._failed(pod)
        except (ClientError, OSError) as e:
            log.debug("status of %s not written (%s); again later", pod.name, e)
            return self._failed(pod)
        now = time.monotonic()
        self.writes += 1
        pod.sent, pod.written_pod, pod.read_again, pod.failures = version, answer, False, 0
        done = [w for v, w in pod.marks if v <= version]
        pod.marks = [(v, w) for v, w in pod.marks if v > version]
        for written in done:
            written(now)
        if pod.version == version:
            self._unsent.discard(uid)
        return None

    def _failed(self, pod: _PodStatus) -> float:
        self.retries += 1
        pod.failures += 1
        initial, most = self._backoff
        return float(min(most, initial * 2 ** (pod.failures - 1)))


def _version(pod: JsonDict) -> int:
    # resourceVersions are etcd revisions: comparable as integers here.
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return int(pod["metadata"]["resourceVersion"])
    return -1
