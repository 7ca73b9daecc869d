"""A simulated kubelet for GangJob workers on KWOK nodes: runs the REAL agent for each pod, in
this process, and plays the kubelet's part of the restart protocol.

KWOK brings pods to Running; it knows nothing of restart rules. This class adds what the real
kubelet 1.36 does (LOCALCLUSTER.md, measured on a real node):
- a terminating pod labelled `SIMULATED_KUBELET_LABEL` is removed by a delete for its UID once
  its agent is stopped (KWOK, which deletes by name, is told to leave such pods alone: its late
  deletes removed recreated pods of the same name);
- a Pod-mode agent that exits with the restart code, or a trainer that exits with a code of
  its `RestartAllContainers` rule, restarts the whole pod in place: condition
  `AllContainersRestarting` and Ready False at once, every container's restartCount +1 with
  the synthetic lastState `{exitCode: 137, reason: RestartingAllContainers}`, and after
  `restart_delay` (about 2 s on the real node) the containers run again and a new agent starts;
- a new pod's agent starts `start_delay` after KWOK reports it Running (the real node takes
  1.1-1.5 s from bind to a running container: sandbox, network, container start), so that
  recreating a pod is charged the kubelet's part as restarting one is;
- a trainer exit code outside the rule leaves the trainer terminated with that code and the
  pod Failed;
- `Process` mode runs the agent with a stand-in trainer process that exits when told to;
- with `arrival_url` (the controller's arrival endpoint), each pod gets a token bound to it for
  the audience `gangjob.io/arrival` by a TokenRequest, as the kubelet mounts a projected token,
  and its agent reports there.
Many agents share one HTTP client, so a benchmark can run thousands in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.agent import Agent, AgentState, Mode
from agent.apiclient import ApiError, ClientError, HttpClient
from agent.config import Config
from api.constants import ARRIVAL_AUDIENCE, RESTART_EXIT_CODE
from localcluster.cluster import SIMULATED_KUBELET_LABEL

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
AGENT_CONTAINER = "gangjob-agent"
SYNTHETIC_EXIT = {"exitCode": 137, "reason": "RestartingAllContainers"}
LIST_PAGE = 500
"""Pods per page of the pod list (see `SimKubelet._list`)."""
# The stand-in trainer of Process mode: runs until `crash` appears in its dir, then exits with
# the code written there (the file is removed so the next run starts clean).
SIM_TRAINER = [
    "/bin/sh",
    "-c",
    'while [ ! -f "$GANGJOB_DIR/crash" ]; do sleep 0.05; done; '
    'c=$(cat "$GANGJOB_DIR/crash"); rm -f "$GANGJOB_DIR/crash"; exit "$c"',
]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pod_mode(pod: JsonDict) -> Mode:
    """Which agent the controller built this pod for: a sidecar agent (Pod or Recreate mode)
    or the agent wrapping the trainer (Process mode)."""
    for c in pod.get("spec", {}).get("initContainers", []):
        if c.get("name") == AGENT_CONTAINER and c.get("restartPolicy") == "Always":
            return Mode.POD
    return Mode.PROCESS


def trainer_rule_codes(pod: JsonDict, trainer: str) -> Callable[[int], bool]:
    """Whether the trainer's `RestartAllContainers` rule matches an exit code."""
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") != trainer:
            continue
        for rule in c.get("restartPolicyRules") or []:
            if rule.get("action") != "RestartAllContainers":
                continue
            codes = rule.get("exitCodes", {})
            values = set(codes.get("values", []))
            if codes.get("operator") == "In":
                return lambda code: code in values
            return lambda code: code not in values
    return lambda code: False


@dataclass
class Worker:
    """One pod the simulated kubelet runs."""

    name: str
    mode: Mode
    dir: Path
    uid: str
    """The pod's UID: the kubelet's writes are for this pod, never a later one of its name."""
    agent: Agent | None = None
    task: asyncio.Task[int] | None = None
    restarts: int = 0
    failed: bool = False
    lost: bool = False
    events: list[str] = field(default_factory=list)
    written: dict[str, float] = field(default_factory=dict)
    """`time.monotonic()` when the kubelet's last status write of each kind returned
    (`restarting`, `running`, `failed`): when a failure became visible in the API."""


class SimKubelet:
    """Runs agents for the GangJob pods of one namespace; `run()` as a task, `close()` after."""

    def __init__(
        self,
        api: HttpClient,
        namespace: str,
        *,
        restart_delay: float = 2.0,
        trainer_container: str = "trainer",
        kill_grace_seconds: float = 1.0,
        kubelet_concurrency: int = 64,
        arrival_url: str | None = None,
        start_delay: float = 0.0,
    ) -> None:
        self.api = api
        self.start_delay = start_delay
        self._starting: set[str] = set()  # UIDs of new pods whose agent is about to start
        self._finishing: set[str] = set()  # UIDs of terminating pods whose deletion we finish
        self.arrival_url = arrival_url
        # One client to the controller for every agent: each report's stream holds a connection.
        self.arrival_client = (
            HttpClient(arrival_url, max_idle=64, request_timeout=30.0) if arrival_url else None
        )
        self._tokens: dict[str, Path] = {}  # pod UID -> its token file
        self.namespace = namespace
        self.restart_delay = restart_delay
        self.trainer = trainer_container
        self.kill_grace_seconds = kill_grace_seconds
        self.workers: dict[str, Worker] = {}
        self.pods: dict[str, JsonDict] = {}
        self._root = Path(tempfile.mkdtemp(prefix=f"simkubelet-{namespace}-"))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._agent_tasks: set[asyncio.Task[int]] = set()
        self._changed = asyncio.Event()
        # Thousands of pods restart at once in a gang restart: the kubelets' status writes share
        # this process's connections, so they queue here rather than time out connecting.
        self._kubelet_slots = asyncio.Semaphore(kubelet_concurrency)

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    # -- the pod watch -------------------------------------------------------------------
    async def run(self) -> None:
        """List and watch the namespace's gang pods; start and stop agents as they come/go."""
        params = {"labelSelector": "gangjob.io/name"}
        while True:
            try:
                items, rv = await self._list(params)
                self._relisted(items)
                query = {**params, "resourceVersion": rv, "allowWatchBookmarks": "true"}
                stream = self.api.watch(self.pods_path, query, inactivity_timeout=90.0)
                async with contextlib.aclosing(stream):
                    async for ev in stream:
                        if ev["type"] in ("ADDED", "MODIFIED"):
                            self._seen(ev["object"])
                        elif ev["type"] == "DELETED":
                            self._gone(ev["object"])
            except (ClientError, OSError) as e:
                log.warning("simkubelet watch broke (%s); listing again", e)
                await asyncio.sleep(0.5)

    async def _list(self, params: dict[str, str]) -> tuple[list[JsonDict], str]:
        """Every gang pod, in pages as a kubelet's informer lists them: one LIST of 5000 pods
        on a saturated apiserver outlasts its 60 s request timeout; a page of 500 does not."""
        items: list[JsonDict] = []
        cont = ""
        while True:
            query = {**params, "limit": str(LIST_PAGE), **({"continue": cont} if cont else {})}
            page = await self.api.get(self.pods_path, query)
            items += page.get("items", [])
            meta = page.get("metadata", {})
            cont = meta.get("continue", "")
            if not cont:
                return items, meta.get("resourceVersion", "")

    def _relisted(self, items: list[JsonDict]) -> None:
        """A fresh list replaces what the watch had: a pod cached but not listed was deleted
        while no watch was open (its DELETED event is lost with the old watch), so it goes now,
        and its agent with it."""
        listed = {p["metadata"]["uid"] for p in items}
        for pod in list(self.pods.values()):
            if pod["metadata"]["uid"] not in listed:
                self._gone(pod)
        for pod in items:
            self._seen(pod)

    def _seen(self, pod: JsonDict) -> None:
        name = pod["metadata"]["name"]
        old = self.pods.get(name)
        if old is not None and old["metadata"]["uid"] != pod["metadata"]["uid"]:
            self._stop_worker(name)  # a new pod of the same name: a recreated worker
        self.pods[name] = pod
        self._poke()
        if pod["metadata"].get("deletionTimestamp"):
            self._stop_worker(name)
            self._finish_deletion(pod)
            return
        w = self.workers.get(name)
        running = pod.get("status", {}).get("phase") == "Running"
        if w is None and running:
            if self.start_delay <= 0:
                self._start_worker(pod)
            elif pod["metadata"]["uid"] not in self._starting:
                self._starting.add(pod["metadata"]["uid"])
                self._spawn(self._start_later(pod))

    def _finish_deletion(self, pod: JsonDict) -> None:
        """A terminating pod labelled `SIMULATED_KUBELET_LABEL` is removed once its agent is
        stopped, by a delete for its UID, as the kubelet does: a pod of the same name created
        since (a recreated worker) is never hit. KWOK does it for other pods."""
        meta = pod["metadata"]
        uid = meta["uid"]
        if SIMULATED_KUBELET_LABEL not in (meta.get("labels") or {}) or uid in self._finishing:
            return
        self._finishing.add(uid)

        async def finish() -> None:
            options = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            for attempt in range(1, 11):
                try:
                    async with self._kubelet_slots:
                        await self.api.delete(f"{self.pods_path}/{meta['name']}", options)
                    return
                except ApiError as e:
                    if e.status in (404, 409):  # gone already, or another pod of that name
                        return
                    error: Exception = e
                except (ClientError, OSError) as e:
                    error = e
                await asyncio.sleep(0.2 * attempt)  # an overloaded apiserver: ask again
            log.warning("pod %s (uid %s) not deleted: %s", meta["name"], uid, error)
            self._finishing.discard(uid)  # its next event asks again

        self._spawn(finish())

    def _poke(self) -> None:
        """Wakes `wait`: something it may be waiting for changed."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _gone(self, pod: JsonDict) -> None:
        name = pod["metadata"]["name"]
        self._finishing.discard(pod["metadata"]["uid"])
        if self.pods.get(name, {}).get("metadata", {}).get("uid") == pod["metadata"]["uid"]:
            self.pods.pop(name, None)
            self._stop_worker(name)

    # -- agents --------------------------------------------------------------------------
    def _start_worker(self, pod: JsonDict) -> None:
        name = pod["metadata"]["name"]
        uid = pod["metadata"]["uid"]
        job = pod["metadata"]["labels"]["gangjob.io/name"]
        wdir = self._root / name
        wdir.mkdir(parents=True, exist_ok=True)
        w = self.workers.get(name) or Worker(name, pod_mode(pod), wdir, uid)
        self.workers[name] = w
        config = Config(
            job_name=job,
            pod_name=name,
            namespace=self.namespace,
            dir=wdir,
            probe_port=None,
            kill_grace_seconds=self.kill_grace_seconds,
            pod_uid=uid,
            arrival_url=self.arrival_url,
            arrival_token_file=wdir / f"arrival-token-{uid}",
        )
        cmd = SIM_TRAINER if w.mode is Mode.PROCESS else ()
        w.agent = Agent(
            config,
            self.api,
            mode=w.mode,
            command=cmd,
            env={"PATH": "/usr/bin:/bin"},
            arrival_client=self.arrival_client,
        )
        w.task = asyncio.create_task(self._run_agent(w.agent, pod))
        self._agent_tasks.add(w.task)
        w.task.add_done_callback(self._agent_tasks.discard)
        w.task.add_done_callback(functools.partial(self._agent_done, w))
        self._poke()

    async def _run_agent(self, agent: Agent, pod: JsonDict) -> int:
        if self.arrival_url is not None:
            await self._ensure_token(pod, agent.config.arrival_token_file)
        return await agent.run()

    async def _ensure_token(self, pod: JsonDict, path: Path) -> None:
        """What the kubelet does for a projected token: a TokenRequest bound to the pod, once
        per pod (the real kubelet renews it at 80% of its life; benchmarks are shorter)."""
        uid = pod["metadata"]["uid"]
        if uid in self._tokens:
            return
        sa = pod.get("spec", {}).get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [ARRIVAL_AUDIENCE],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": uid,
                },
            },
        }
        path_sa = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token"
        delay, error = 0.1, None
        for _ in range(30):
            try:
                # A slot per attempt, not across the waits between them: one pod's retries
                # must not hold up every other pod's kubelet.
                async with self._kubelet_slots:
                    answer = await self.api.post(path_sa, body)
                break
            except ClientError as e:  # the SA may not exist yet; overload
                error = e
                log.debug("token for %s not issued (%s); retrying", pod["metadata"]["name"], e)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
        else:
            log.error("no token for %s (%s): its agent will arrive by annotation", uid, error)
            return
        _write(path, answer.get("status", {}).get("token", ""))
        self._tokens[uid] = path

    async def _start_later(self, pod: JsonDict) -> None:
        """The kubelet's pod start (sandbox, network, containers), then the agent."""
        uid = pod["metadata"]["uid"]
        try:
            await asyncio.sleep(self.start_delay)
            now = self.pods.get(pod["metadata"]["name"])
            if (
                now is None
                or now["metadata"]["uid"] != uid
                or now["metadata"].get("deletionTimestamp")
            ):
                return
            if pod["metadata"]["name"] not in self.workers:
                self._start_worker(now)
        finally:
            self._starting.discard(uid)

    def _stop_worker(self, name: str) -> None:
        w = self.workers.pop(name, None)
        if w is not None and w.agent is not None:
            w.agent.stop()

    def _agent_done(self, w: Worker, task: asyncio.Task[int]) -> None:
        self._poke()
        if task.cancelled() or self.workers.get(w.name) is not w or w.lost:
            return
        if task.exception() is not None:
            log.error("agent of %s failed: %r", w.name, task.exception())
            return
        if task.result() == RESTART_EXIT_CODE and w.mode is Mode.POD:
            # The agent's own RestartAllContainers rule: the whole pod restarts in place.
            self._spawn(self._restart_all(w, "agent exited with the restart code"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what the real kubelet would do --------------------------------------------------
    async def _patch_status(self, name: str, uid: str, mutate: Callable[[JsonDict], None]) -> None:
        """A status write as the kubelet makes it: for the pod of this UID only, conditional on
        the pod version it started from (the watch's copy first, a fresh read after a
        conflict), retried on overload. A pod of the name but another UID is a recreated
        worker: this pod is gone, and nothing is written."""
        pod: JsonDict | None = self.pods.get(name)
        if pod is not None and pod["metadata"]["uid"] != uid:
            pod = None  # the watch's copy is of another pod: only the apiserver can say which
        delay = 0.05
        for _ in range(40):
            try:
                # A slot per attempt (see _ensure_token).
                async with self._kubelet_slots:
                    if pod is None:
                        pod = await self.api.get(f"{self.pods_path}/{name}")
                    if pod["metadata"]["uid"] != uid:
                        return
                    status = copy.deepcopy(pod.get("status", {}))
                    mutate(status)
                    patch = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
                             "status": status}  # fmt: skip
                    await self.api.merge_patch(f"{self.pods_path}/{name}/status", patch)
                return
            except ApiError as e:
                if e.status == 404:
                    return
                if e.status == 409:
                    pod = None  # read it again
                    continue
                if e.status not in (429, 500, 503, 504):
                    raise
            except ClientError as e:  # a transport error under load
                log.debug("status of %s not written (%s); retrying", name, e)
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _restart_all(self, w: Worker, why: str) -> None:
        """KEP-5532: every container of the pod restarts; same pod, UID, IP and volumes."""
        w.events.append(f"restart-all: {why}")
        if w.agent is not None:
            w.agent.stop()
        if w.task is not None:
            with contextlib.suppress(Exception):
                await w.task
        stamp = _now()

        def restarting(status: JsonDict) -> None:
            conds = [
                c for c in status.get("conditions", []) if c["type"] != "AllContainersRestarting"
            ]
            for c in conds:
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"], c["lastTransitionTime"] = "False", stamp
            conds.append({"type": "AllContainersRestarting", "status": "True",
                          "lastTransitionTime": stamp})  # fmt: skip
            status["conditions"] = conds
            for key in ("containerStatuses", "initContainerStatuses"):
                for c in status.get(key, []):
                    c["restartCount"] = c.get("restartCount", 0) + 1
                    c["lastState"] = {"terminated": {**SYNTHETIC_EXIT, "finishedAt": stamp,
                                                     "startedAt": stamp}}  # fmt: skip
                    c["state"] = {"waiting": {"reason": "PodInitializing"}}
                    c["ready"] = False

        await self._patch_status(w.name, w.uid, restarting)
        w.written["restarting"] = time.monotonic()
        await asyncio.sleep(self.restart_delay)  # the kubelet's restart, as measured
        if self.workers.get(w.name) is not w or w.lost:
            return
        again = _now()

        def running(status: JsonDict) -> None:
            conds = [
                c for c in status.get("conditions", []) if c["type"] != "AllContainersRestarting"
            ]
            for c in conds:
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"], c["lastTransitionTime"] = "True", again
            status["conditions"] = conds
            status["phase"] = "Running"
            for key in ("containerStatuses", "initContainerStatuses"):
                for c in status.get(key, []):
                    c["state"] = {"running": {"startedAt": again}}
                    c["ready"] = True
                    c["started"] = True

        await self._patch_status(w.name, w.uid, running)
        w.written["running"] = time.monotonic()
        w.restarts += 1
        pod = self.pods.get(w.name)
        if pod is not None and self.workers.get(w.name) is w:
            self._start_worker(pod)

    # -- failure injection (what a test does to a worker) --------------------------------
    async def crash(self, name: str, code: int) -> None:
        """The worker's trainer exits with `code`, as a real one would."""
        w = self.workers[name]
        pod = self.pods[name]
        if w.mode is Mode.PROCESS:
            (w.dir / "crash").write_text(f"{code}\n")  # the stand-in trainer exits with it
            return
        if trainer_rule_codes(pod, self.trainer)(code):
            await self._restart_all(w, f"trainer exited {code}")
            return
        # Not in the rule: the trainer stays terminated with its real code; the pod fails.
        w.failed = True
        if w.agent is not None:
            w.agent.stop()
        stamp = _now()
        trainer = self.trainer

        def failed(status: JsonDict) -> None:
            status["phase"] = "Failed"
            for c in status.get("conditions", []):
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"], c["lastTransitionTime"] = "False", stamp
            for key in ("containerStatuses", "initContainerStatuses"):
                for c in status.get(key, []):
                    exit_code = code if c["name"] == trainer else 0
                    reason = "Error" if exit_code else "Completed"
                    term = {"exitCode": exit_code, "reason": reason}
                    c["state"] = {"terminated": {**term, "startedAt": stamp, "finishedAt": stamp}}
                    c["ready"] = False

        await self._patch_status(name, w.uid, failed)
        w.written["failed"] = time.monotonic()

    def lose(self, name: str) -> None:
        """The worker's node died: its agent stops without a word (no status, no exit)."""
        w = self.workers.get(name)
        if w is not None:
            w.lost = True
            if w.agent is not None:
                w.agent.stop()

    # -- observing -----------------------------------------------------------------------
    async def wait(self, predicate: Callable[[SimKubelet], bool], timeout: float = 30.0) -> None:
        """Until `predicate(self)` holds, re-checked on every pod event and agent step."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._changed.wait())]
                for w in self.workers.values():
                    if w.agent is not None:
                        # The state as the predicate saw it, taken now: a change between this
                        # check and the waiter's first run must still wake it.
                        waits.append(asyncio.ensure_future(_next_state(w.agent, w.agent.state)))
                _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for p in pending:
                    p.cancel()

    async def close(self) -> None:
        """Stops every agent and waits for them."""
        for name in list(self.workers):
            self._stop_worker(name)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._agent_tasks, return_exceptions=True)
        if self.arrival_client is not None:
            await self.arrival_client.close()
        shutil.rmtree(self._root, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    path.write_text(text)  # a few hundred bytes to a local dir, as the kubelet's volume would


async def _next_state(agent: Agent, seen: AgentState) -> None:
    """Returns when the agent's state is no longer `seen`."""
    await agent.wait_for(lambda s: s is not seen)
