"""A simulated kubelet for GangJob workers on KWOK nodes: runs the REAL agent for each pod, in
this process, and plays the kubelet's part of the restart protocol.

KWOK brings pods to Running; it knows nothing of restart rules. This class adds what the real
kubelet 1.36 does:
- a whole-pod restart (KEP-5532: a `Pod`-mode agent exits with the restart code, or a trainer
  with a code of its `RestartAllContainers` rule) runs on the node's own timeline, whether or
  not the status writes saying so have landed: the agent ends; `restart_stop_delay` later every
  container has stopped and starts again; `restart_delay` after the exit the new agent runs.
  The statuses: condition `AllContainersRestarting` and Ready False, every container's
  restartCount +1 with the synthetic lastState `{exitCode: 137, reason:
  RestartingAllContainers}`; then the condition gone, the containers waiting; then running;
- the statuses go to the apiserver as the kubelet's status manager sends them
  (`localcluster.simstatus`): asynchronously, only a pod's latest, retried, for its UID;
  `Worker.written` says when each became visible;
- a new pod's agent starts `start_delay` after KWOK reports it Running, so that recreating a
  pod is charged the kubelet's part as restarting one is;
- a trainer exit code outside the rule leaves the trainer terminated with that code and the
  pod Failed;
- `Process` mode runs the real agent with `SimTrainer` runs for its trainer (no process, so
  thousands fit): `crash` ends the running one with a code; the agent's own exit ends the
  trainer container and the pod (Succeeded on 0, else Failed);
- with `progress` (`SimProgress`), each trainer run of its jobs reports its steps (and
  checkpoints) to the agent's progress file, as the contract of docs/progress.md says, and the
  agent follows them with its real monitor (hangSeconds and the summary period from the pod's
  agent environment): in `Process` mode the agent's own runs; in `Pod` mode a stand-in for
  the trainer container the kubelet runs, from its agent's barrier open to the pod's restart;
  `hang` makes one run stop reporting while it keeps running;
- a terminating pod labelled `SIMULATED_KUBELET_LABEL` is removed by a delete for its UID once
  its agent is stopped (KWOK, which deletes by name, is told to leave such pods alone: its late
  deletes removed recreated pods of the same name);
- with `arrival_url` (the controller's arrival endpoint), each pod gets a token bound to it for
  the audience `gangjob.io/arrival` by a TokenRequest, as the kubelet mounts a projected token,
  and its agent reports there; with `arrival_from_pods`, each agent reports where its pod's
  environment says (`GANGJOB_ARRIVAL_URL`, which the controller gives it), as the real agent
  does, so a long-lived kubelet follows whichever controller runs.
Many agents share one HTTP client, so a benchmark can run thousands in one process.

The delays, measured on the real node (`python -m benchmarks.kubelet_timing --restarts 5`:
kubelet 1.36.2 and containerd, the `node` profile, 3 `Pod`-mode workers, on a shared 2-core
machine; an agent runs from its first log line as containerd stamps it). Two runs:
- exit -> next agent: 1.92 s and 1.97 s median after an agent's exit (1.64-2.35 s, 20
  samples), 1.44 s and 1.54 s after a trainer's (1.25-2.10 s, 10): `restart_delay` 2.0;
- exit -> the pod's restart condition gone: 1.11 s and 1.17 s median (0.81-1.47 s, 30), 0.4-1.2
  s before the next agent ran: `STOP_SHARE` 0.55 of `restart_delay`;
- pod bound -> its agent: 1.45 s and 2.64 s median (1.23-2.71 s, 6): `start_delay` 1.3.
Under heavy load (load average near 5) the agent's own start stretches: a restart took 3.7 s
median (up to 7.9 s), a start 3.4 s, and the restart condition went 1.6-6.4 s before the next
agent ran.
The status content is the one the controller was built against. The real kubelet's differs
(a trace of two restarts): its first restart status comes 0.85-1.06 s after the exit (its
relist) and shows, for 0.05-0.33 s, the ended container terminated with its real exit code; the
condition then turns False rather than going; the phase is Pending while the sidecar starts;
Ready returns with the barrier (the agent's startup probe), not with the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.agent import Agent, AgentState
from agent.apiclient import ApiError, ClientError, HttpClient
from agent.config import PROGRESS_POLL_SECONDS, Config
from agent.trainer import TrainerRun
from api.constants import (
    ARRIVAL_AUDIENCE,
    DEFAULT_PROGRESS_SUMMARY_SECONDS,
    ENV_AGENT_RANK,
    ENV_ARRIVAL_URL,
    ENV_EPOCH,
    ENV_GANGJOB_NAME,
    ENV_HANG_SECONDS,
    ENV_PROGRESS,
    ENV_PROGRESS_SUMMARY_SECONDS,
    LABEL_NAME,
    LABEL_RANK,
    PROGRESS_FILE,
    RESTART_EXIT_CODE,
    AgentPlacement,
)
from localcluster.cluster import SIMULATED_KUBELET_LABEL
from localcluster.simstatus import CONTAINER_LISTS, StatusManager, json_copy

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
AGENT_CONTAINER = "gangjob-agent"
SYNTHETIC_EXIT = {"exitCode": 137, "reason": "RestartingAllContainers"}
LIST_PAGE = 500
"""Pods per page of the pod list (see `SimKubelet._list`)."""
RESTART_DELAY = 2.0
"""A whole-pod restart on the real node, exit to next agent (measured: see above)."""
START_DELAY = 1.3
"""A new pod bound to its agent running on the real node (measured: see above)."""
STOP_SHARE = 0.55
"""The share of a whole-pod restart before the kubelet says its containers start again."""
STOPPED_EXIT_CODE = 143
"""A stand-in trainer's exit when the agent stops it: a trainer killed by SIGTERM."""
MEMORY_VOLUMES = Path("/dev/shm")
"""Where the pods' `gangjob` emptyDirs go when this host has it: memory, as `emptyDir.medium:
Memory`. Each restart, every agent replaces its state file twice and its epoch file once; on
this machine's ext4 a file renamed over another costs ~0.3 ms (the filesystem starts writing
the new one out), against ~0.04 ms in memory. A real node pays that on its own disk and CPU;
here one process would pay it for every pod (~1 s of its CPU per restart at N=1000)."""


def _volumes() -> Path | None:
    """`MEMORY_VOLUMES` if it is a writable directory here, else None (the temporary dir)."""
    return MEMORY_VOLUMES if os.access(MEMORY_VOLUMES, os.W_OK | os.X_OK) else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pod_mode(pod: JsonDict) -> AgentPlacement:
    """Which agent the controller built this pod for: a sidecar agent (Pod or Recreate mode)
    or the agent wrapping the trainer (Process mode)."""
    for c in pod.get("spec", {}).get("initContainers", []):
        if c.get("name") == AGENT_CONTAINER and c.get("restartPolicy") == "Always":
            return AgentPlacement.SIDECAR
    return AgentPlacement.WRAPPER


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


def agent_env(pod: JsonDict) -> dict[str, str]:
    """The literal environment the pod builder gave the pod's agent (the container whose
    environment names the GangJob: the sidecar, or the wrapped trainer)."""
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
        if ENV_GANGJOB_NAME in env:
            return env
    return {}


def agent_rank(pod: JsonDict) -> int | None:
    """The rank the kubelet would give the pod's agent: `GANGJOB_RANK` from the pod's
    `gangjob.io/rank` label through the downward API (an elastic gang's agent, sidecar or
    wrapper); None without it."""
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for e in c.get("env") or []:
            if e.get("name") == ENV_AGENT_RANK and "valueFrom" in e:
                label = pod["metadata"].get("labels", {}).get(LABEL_RANK, "")
                return int(label) if label.isdigit() else None
    return None


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    try:
        return float(env[name]) if env.get(name) else None
    except ValueError:
        return None


def trainer_command(pod: JsonDict, trainer: str) -> list[str]:
    """The trainer's own command in a `Process`-mode pod (what follows `wrap --`)."""
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == trainer:
            command = [*(c.get("command") or []), *(c.get("args") or [])]
            return command[command.index("--") + 1 :] if "--" in command else command
    return []


@dataclass(frozen=True)
class SimProgress:
    """How the stand-in trainers report progress: `steps_per_second` from the start of each run
    (step 0 at once), a checkpoint every `checkpoint_every` steps (0: none); only the workers of
    `jobs` (None: of every job), so that gangs with and without progress run side by side.

    With `compute_seconds`, each step's line also says `compute=`: a healthy worker's compute
    per step, times its slowness (`SimKubelet.degrade`, `SimKubelet.slow`), times 1 +/-
    `jitter` (uniform, seeded by `seed`, the pod and its run). The gang then steps as a
    synchronous gang does: at the pace of its slowest running trainer, each step the rest of
    `1 / steps_per_second` (the all-reduce, the input) plus the slowest compute.

    Through the file, as a real trainer reports, so that the agent's real reading of it runs:
    on this machine (/dev/shm, 1000 workers) a step written costs ~14 us and its agent's poll
    reading it ~30 us, an unchanged poll ~16 us: at N=1000 and a step a second, ~5% of a core
    for the simulation."""

    steps_per_second: float = 1.0
    checkpoint_every: int = 0
    jobs: frozenset[str] | None = None
    compute_seconds: float | None = None
    jitter: float = 0.0
    seed: int = 0

    def follows(self, job: str) -> bool:
        """Whether the workers of `job` report progress."""
        return self.jobs is None or job in self.jobs

    def step_seconds(self, slowest: float = 1.0) -> float:
        """A step of the gang whose slowest running worker computes `slowest` times the
        healthy compute."""
        healthy = 1.0 / self.steps_per_second
        if self.compute_seconds is None:
            return healthy
        return healthy + self.compute_seconds * (slowest - 1.0)

    @property
    def period(self) -> float:
        """How often the shared timer writes every trainer's step: once per step, but at most
        10 times a second and at least once (the agent reads the file once a second)."""
        return min(1.0, max(0.1, 1.0 / self.steps_per_second))


class SimTrainer:
    """`Process` mode's stand-in for one trainer run, behind the agent's `TrainerRun`: it runs
    until the agent stops it (exit `STOPPED_EXIT_CODE`, as on SIGTERM) or `exit(code)` ends it,
    as the real process would end. No process: thousands fit in one event loop. With
    `SimProgress`, the kubelet's shared timer has it `report` its step to `$GANGJOB_PROGRESS`
    until it ends or `hang` stops it."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        """The environment the agent started this run with."""
        self.epoch = int(env.get(ENV_EPOCH, "-1"))
        """The epoch the agent started this run at."""
        self.code: int | None = None
        self.ended_at: float | None = None
        """`time.monotonic()` when the run ended."""
        self.progress_path = env.get(ENV_PROGRESS)
        """Where it reports its steps (set by the agent where it follows progress)."""
        self.started_at: float | None = None
        self.step: int | None = None
        """The last step it reported."""
        self.reported_at: float | None = None
        """`time.monotonic()` when it reported `step`."""
        self.hung_at: float | None = None
        """`time.monotonic()` when `hang` stopped its reports."""
        self.position = 0.0
        """Steps done so far, fractional: the gang's step time may change under it."""
        self.advanced_at: float | None = None
        self.rng: random.Random | None = None
        """Its compute's jitter (set by the kubelet's timer, seeded by the pod and run)."""
        self._ended = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return None

    @property
    def running(self) -> bool:
        return self.code is None

    def exit(self, code: int) -> None:
        """The run ends with `code` (no effect once it has ended)."""
        if self.code is None:
            self.code, self.ended_at = code, time.monotonic()
            self._ended.set()

    def hang(self) -> None:
        """It stops reporting and keeps running: a wedged device or a stuck collective."""
        if self.hung_at is None:
            self.hung_at = time.monotonic()

    def report(
        self, now: float, progress: SimProgress, step_seconds: float | None = None,
        slowness: float = 1.0,
    ) -> bool:  # fmt: skip
        """Writes the step this run reached by `now` (at `progress`'s rate, or one step per
        `step_seconds` of its gang since its last report) if it is a new one: the whole line in
        one write over the file (`echo ... > $GANGJOB_PROGRESS`), 3 syscalls; with its compute
        at `slowness` times the healthy one. Whether it reported."""
        if self.code is not None or self.hung_at is not None or self.started_at is None:
            return False
        if self.progress_path is None:
            return False
        if step_seconds is None:
            step = int((now - self.started_at) * progress.steps_per_second)
        else:
            self.position += (now - (self.advanced_at or self.started_at)) / step_seconds
            self.advanced_at = now
            step = int(self.position)
        if step == self.step:
            return False
        line = f"step={step}"
        if progress.compute_seconds is not None:
            rng = self.rng or random
            noise = 1.0 + rng.uniform(-progress.jitter, progress.jitter)
            line += f" compute={progress.compute_seconds * slowness * noise:.4f}"
        if progress.checkpoint_every > 0:
            line += f" checkpoint={step // progress.checkpoint_every * progress.checkpoint_every}"
        try:
            fd = os.open(self.progress_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, f"{line}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            return False  # the agent emptied its directory for a new epoch: this run is over
        self.step, self.reported_at = step, now
        return True

    async def start(self) -> None:
        self.started_at = time.monotonic()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.code is not None
        return self.code

    async def stop(self, grace: float) -> int:
        self.exit(STOPPED_EXIT_CODE)
        return await self.wait()


@dataclass
class Worker:
    """One pod the simulated kubelet runs."""

    name: str
    mode: AgentPlacement
    dir: Path
    uid: str
    """The pod's UID: the kubelet's writes are for this pod, never a later one of its name."""
    job: str = ""
    """The GangJob it works for: its gang steps together."""
    agent: Agent | None = None
    task: asyncio.Task[int] | None = None
    restarts: int = 0
    failed: bool = False
    lost: bool = False
    events: list[str] = field(default_factory=list)
    written: dict[str, float] = field(default_factory=dict)
    """`time.monotonic()` when the kubelet's status write holding its latest status of each
    kind (`restarting`, `restarted`, `running`, `failed`, `exited`) returned: when it became
    visible in the API. A status replaced before it was sent is marked by the write of the one
    replacing it."""
    trainer: SimTrainer | None = None
    """`Process` mode: the agent's latest trainer run. `Pod` mode with progress: the trainer
    container's stand-in while it runs."""
    trainer_runs: list[SimTrainer] = field(default_factory=list)
    """Every trainer run of this pod (`Pod` mode: with progress), the latest last."""
    next_exit: int | None = None
    """`Process` mode: the exit code of the next trainer run, at once (`SimKubelet.crash` while
    no run was going)."""

    def new_trainer(self, argv: Sequence[str], env: Mapping[str, str]) -> TrainerRun:
        """The agent's `trainer_factory`: a stand-in run, ended at once by a pending crash."""
        run = SimTrainer(argv, env)
        self.trainer = run
        self.trainer_runs.append(run)
        if self.next_exit is not None:
            run.exit(self.next_exit)
            self.next_exit = None
        return run


class SimKubelet:
    """Runs agents for the GangJob pods of one namespace; `run()` as a task, `close()` after."""

    def __init__(
        self,
        api: HttpClient,
        namespace: str,
        *,
        restart_delay: float = RESTART_DELAY,
        trainer_container: str = "trainer",
        kill_grace_seconds: float = 1.0,
        kubelet_concurrency: int = 64,
        arrival_url: str | None = None,
        start_delay: float = 0.0,
        restart_stop_delay: float | None = None,
        progress: SimProgress | None = None,
        arrival_from_pods: bool = False,
    ) -> None:
        """`restart_delay`: a whole-pod restart, the exit that triggers it to the new agent
        running; `restart_stop_delay` (at most `restart_delay`; None: `STOP_SHARE` of it): the
        exit to the kubelet's status that every container stopped and starts again (its
        restart condition gone); `start_delay`: a new pod Running (by KWOK) to its agent
        running. `kubelet_concurrency` bounds this kubelet's requests to the apiserver.
        `progress`: the trainers of its jobs report steps and their agents follow them (None:
        no trainer reports and no agent reads progress). `arrival_from_pods`: each agent's
        arrival endpoint is its pod's `GANGJOB_ARRIVAL_URL` rather than `arrival_url`."""
        self.api = api
        self.progress = progress
        self.start_delay = start_delay
        if restart_stop_delay is None:
            restart_stop_delay = STOP_SHARE * restart_delay
        self.restart_stop_delay = min(restart_stop_delay, restart_delay)
        self._starting: set[str] = set()  # UIDs of new pods whose agent is about to start
        self._finishing: set[str] = set()  # UIDs of terminating pods whose deletion we finish
        self.arrival_url = arrival_url
        # One client to the controller for every agent: each report's stream holds a connection.
        self.arrival_client = (
            HttpClient(arrival_url, max_idle=64, request_timeout=30.0) if arrival_url else None
        )
        self.arrival_from_pods = arrival_from_pods
        self._arrival_clients: dict[str, HttpClient] = {}  # the pods' own endpoints, by URL
        self._tokens: dict[str, Path] = {}  # pod UID -> its token file
        self.namespace = namespace
        self.restart_delay = restart_delay
        self.trainer = trainer_container
        self.kill_grace_seconds = kill_grace_seconds
        self.workers: dict[str, Worker] = {}
        self.pods: dict[str, JsonDict] = {}
        self.slow_nodes: dict[str, float] = {}
        """Node -> how many times the healthy compute its pods' trainers take (`degrade`)."""
        self.slow_pods: dict[str, float] = {}
        """Pod UID -> the same, for one pod (`slow`)."""
        self.step_seconds: dict[str, float] = {}
        """GangJob -> the step time its gang runs at now (with `SimProgress.compute_seconds`)."""
        self._root = Path(tempfile.mkdtemp(prefix=f"simkubelet-{namespace}-", dir=_volumes()))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._agent_tasks: set[asyncio.Task[int]] = set()
        self._changed = asyncio.Event()
        # Thousands of pods restart at once in a gang restart: the kubelets' status writes share
        # this process's connections, so they queue here rather than time out connecting.
        self._kubelet_slots = asyncio.Semaphore(kubelet_concurrency)
        self.status = StatusManager(
            api, self.pods_path, self.pods.get, workers=kubelet_concurrency,
            slots=self._kubelet_slots,
        )  # fmt: skip

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    # -- the pod watch -------------------------------------------------------------------
    async def run(self) -> None:
        """List and watch the namespace's gang pods; start and stop agents as they come/go.

        A watch that ends is opened again from the last resourceVersion seen, as a kubelet's
        reflector does: the apiserver closes a watcher that falls behind (this one, busy with
        thousands of agents), and listing every pod again would cost far more than the events
        it missed. Only an expired version or a broken stream lists again."""
        params = {"labelSelector": LABEL_NAME}
        rv = ""
        if self.progress is not None:
            self._spawn(self._report_progress(self.progress))
        while True:
            try:
                if not rv:
                    items, rv = await self._list(params)
                    self._relisted(items)
                query = {**params, "resourceVersion": rv, "allowWatchBookmarks": "true"}
                stream = self.api.watch(self.pods_path, query, inactivity_timeout=90.0)
                async with contextlib.aclosing(stream):
                    async for ev in stream:
                        kind, obj = ev["type"], ev["object"]
                        if kind == "ERROR":  # the version expired (410): list again
                            log.info("simkubelet watch: %s; listing again", obj.get("message"))
                            rv = ""
                            break
                        if kind in ("ADDED", "MODIFIED"):
                            self._seen(obj)
                        elif kind == "DELETED":
                            self._gone(obj)
                        rv = obj.get("metadata", {}).get("resourceVersion") or rv
            except (ClientError, OSError) as e:
                log.warning("simkubelet watch broke (%s); listing again", e)
                rv = ""
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
        if w is not None and pod.get("spec", {}).get("activeDeadlineSeconds") is not None:
            self._deadline_exceeded(w)
            return
        if w is not None:
            self._reconcile_ready(w, pod)
        if w is None and running:
            if self.start_delay <= 0:
                self._start_worker(pod, "started by the pod watch")
            elif pod["metadata"]["uid"] not in self._starting:
                self._starting.add(pod["metadata"]["uid"])
                self._spawn(self._start_later(pod))

    def _reconcile_ready(self, w: Worker, pod: JsonDict) -> None:
        """The kubelet's status manager puts back a Ready condition someone else changed (its
        `needsReconcile`): the node lifecycle controller marks every pod of a node it thinks
        lost not Ready, and once the node's heartbeats are back only the kubelet says the pod
        is ready again. Its Ready is its ContainersReady (no readiness gates here)."""
        uid = pod["metadata"]["uid"]
        if w.uid != uid or w.lost or w.failed or self.status.unsent(uid):
            return
        mine = self.status.latest(uid)
        want = _condition(mine if mine is not None else pod.get("status", {}), "ContainersReady")
        if want is None or _condition(pod.get("status", {}), "Ready") in (want, None):
            return
        w.events.append(f"Ready put back to {want}")
        stamp = _now()
        self._set_status(w, "ready", lambda status: _ready(status, want, stamp))

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
        self.status.forget(pod["metadata"]["uid"])
        if self.pods.get(name, {}).get("metadata", {}).get("uid") == pod["metadata"]["uid"]:
            self.pods.pop(name, None)
            self._stop_worker(name)

    # -- agents --------------------------------------------------------------------------
    def _start_worker(self, pod: JsonDict, why: str = "") -> None:
        name = pod["metadata"]["name"]
        uid = pod["metadata"]["uid"]
        job = pod["metadata"]["labels"][LABEL_NAME]
        wdir = self._root / name
        wdir.mkdir(parents=True, exist_ok=True)
        w = self.workers.get(name)
        if w is not None and w.uid != uid:
            # The worker of an earlier pod of this name (its node lost, its deletion not yet
            # seen when this pod replaced it in `pods`): it must not stand for the new pod,
            # whose status it would never write (`lost`).
            self._stop_worker(name)
            w = None
        w = w or Worker(name, pod_mode(pod), wdir, uid, job)
        self.workers[name] = w
        if why:
            w.events.append(why)
        progress = self.progress is not None and self.progress.follows(job)
        env = agent_env(pod) if progress or self.arrival_from_pods else {}
        arrival_url = self.arrival_url
        if self.arrival_from_pods:
            arrival_url = env.get(ENV_ARRIVAL_URL) or None
        config = Config(
            job_name=job,
            pod_name=name,
            namespace=self.namespace,
            dir=wdir,
            probe_port=None,
            kill_grace_seconds=self.kill_grace_seconds,
            pod_uid=uid,
            rank=agent_rank(pod),
            arrival_url=arrival_url,
            arrival_token_file=wdir / f"arrival-token-{uid}",
            progress_poll_seconds=PROGRESS_POLL_SECONDS if progress else None,
            hang_seconds=_seconds(env, ENV_HANG_SECONDS) if progress else None,
            progress_summary_seconds=_seconds(env, ENV_PROGRESS_SUMMARY_SECONDS)
            or DEFAULT_PROGRESS_SUMMARY_SECONDS,
        )
        process = w.mode is AgentPlacement.WRAPPER
        w.agent = Agent(
            config,
            self.api,
            mode=w.mode,
            command=(trainer_command(pod, self.trainer) or ["trainer"]) if process else (),
            env={"PATH": "/usr/bin:/bin"},
            arrival_client=self._arrival_client(arrival_url),
            trainer_factory=w.new_trainer if process else None,
        )
        w.task = asyncio.create_task(self._run_agent(w.agent, pod))
        self._agent_tasks.add(w.task)
        w.task.add_done_callback(self._agent_tasks.discard)
        w.task.add_done_callback(functools.partial(self._agent_done, w))
        self._poke()

    def _arrival_client(self, url: str | None) -> HttpClient | None:
        """The client every agent reporting to `url` shares (one per endpoint)."""
        if url is None or (url == self.arrival_url and self.arrival_client is not None):
            return self.arrival_client if url is not None else None
        if url not in self._arrival_clients:
            self._arrival_clients[url] = HttpClient(url, max_idle=64, request_timeout=30.0)
        return self._arrival_clients[url]

    async def _run_agent(self, agent: Agent, pod: JsonDict) -> int:
        if agent.config.arrival_url is not None:
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
                self._start_worker(now, "started by the pod watch")
        finally:
            self._starting.discard(uid)

    def _stop_worker(self, name: str) -> None:
        w = self.workers.pop(name, None)
        if w is not None:
            self._stop_trainer(w)
        if w is not None and w.agent is not None:
            w.agent.stop()

    @staticmethod
    def _stop_trainer(w: Worker) -> None:
        """`Pod` mode: the kubelet stops the trainer container (its stand-in reports no more).
        `Process` mode's runs are the agent's to stop."""
        if w.mode is not AgentPlacement.WRAPPER and w.trainer is not None:
            w.trainer.exit(STOPPED_EXIT_CODE)
            w.trainer = None

    def _agent_done(self, w: Worker, task: asyncio.Task[int]) -> None:
        self._poke()
        if task.cancelled() or self.workers.get(w.name) is not w or w.lost:
            return
        if task.exception() is not None:
            log.error("agent of %s failed: %r", w.name, task.exception())
            return
        code = task.result()
        if w.mode is AgentPlacement.WRAPPER:
            # The agent is the trainer container's process: its end is the container's, and
            # with `restartPolicy: Never` the pod's.
            self._exited(w, code)
        elif code == RESTART_EXIT_CODE:
            # The agent's own RestartAllContainers rule: the whole pod restarts in place.
            self._spawn(self._restart_all(w, "agent exited with the restart code"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what the real kubelet would do --------------------------------------------------
    def _set_status(self, w: Worker, kind: str, change: Callable[[JsonDict], None]) -> None:
        """The kubelet's status of the pod, changed by `change`, handed to its status manager:
        written when a worker gets to it, replaced if a newer one comes first. The first
        change starts from the pod's status as KWOK (the kubelet until then) wrote it."""
        status = self.status.latest(w.uid)
        if status is None:
            pod = self.pods.get(w.name)
            mine = pod is not None and pod["metadata"]["uid"] == w.uid
            status = json_copy(pod.get("status", {})) if pod is not None and mine else {}
        change(status)
        self.status.set(w.name, w.uid, status, functools.partial(self._mark, w.written, kind))

    async def _restart_all(self, w: Worker, why: str) -> None:
        """KEP-5532: every container of the pod restarts; same pod, UID, IP and volumes. The
        containers run again `restart_delay` after the agent ended, whenever the status writes
        saying so land: the node does not wait for the apiserver."""
        w.events.append(f"restart-all: {why}")
        self._stop_trainer(w)
        if w.agent is not None:
            w.agent.stop()
        if w.task is not None:
            with contextlib.suppress(Exception):
                await w.task
        self._set_status(w, "restarting", functools.partial(_restarting, _now()))
        # The kubelet stops every container, says they start again, then they run.
        await asyncio.sleep(self.restart_stop_delay)
        if not self._still(w):
            return
        self._set_status(w, "restarted", functools.partial(_restarted, _now()))
        await asyncio.sleep(self.restart_delay - self.restart_stop_delay)
        pod = self.pods.get(w.name)
        if not self._still(w) or pod is None:
            return
        w.restarts += 1
        self._start_worker(pod)
        self._set_status(w, "running", functools.partial(_running, _now()))

    def _mark(self, written: dict[str, float], kind: str, at: float) -> None:
        """A status write returned: `Worker.written` says so, and `wait` looks again."""
        written[kind] = at
        self._poke()

    def _still(self, w: Worker) -> bool:
        """The worker still runs here: its pod not gone, recreated or lost meanwhile."""
        pod = self.pods.get(w.name)
        alive = self.workers.get(w.name) is w and not w.lost
        return alive and pod is not None and pod["metadata"]["uid"] == w.uid

    def _deadline_exceeded(self, w: Worker) -> None:
        """The pod's `activeDeadlineSeconds` is set: the kubelet kills every container and the
        pod ends `Failed`, reason `DeadlineExceeded`, kept (only deadlines already past are
        simulated: the controller sets one to stop a pod)."""
        self.workers.pop(w.name, None)
        w.events.append("active deadline exceeded")
        if w.agent is not None:
            w.agent.stop()
        stamp = _now()

        def exceeded(status: JsonDict) -> None:
            ended = {c["name"] for c in _containers(status) if "terminated" in c.get("state", {})}
            _terminated(stamp, lambda c: None if c in ended else 137, {}, status)
            status["phase"], status["reason"] = "Failed", "DeadlineExceeded"

        self._set_status(w, "deadline", exceeded)

    def _exited(self, w: Worker, code: int) -> None:
        """A `Process`-mode agent ended with `code`: so did the trainer container, and the pod
        (Succeeded on 0, else Failed)."""
        w.events.append(f"agent exited {code}")
        trainer = self.trainer
        self._set_status(
            w, "exited",
            functools.partial(_terminated, _now(), lambda c: code if c == trainer else None, {}),
        )  # fmt: skip

    # -- failure injection (what a test does to a worker) --------------------------------
    def name_of(self, job: str, rank: int) -> str:
        """The pod of the job's worker `rank`, by its labels."""
        for name, pod in self.pods.items():
            labels = pod["metadata"].get("labels") or {}
            if labels.get(LABEL_NAME) == job and labels.get(LABEL_RANK) == str(rank):
                return name
        raise KeyError(f"no pod of worker {rank} of {job}")

    async def crash(self, name: str, code: int, message: str | None = None) -> None:
        """The worker's trainer exits with `code`, as a real one would. `Pod` mode: a code of
        the trainer's `RestartAllContainers` rule restarts the pod in place (returns once its
        new agent started), any other leaves the pod Failed, the trainer terminated with
        `message` (what it wrote to its termination log, which the kubelet reads into the
        status). `Process` mode: the agent's stand-in trainer run ends with `code` (the next
        run, at once, if none is going)."""
        w = self.workers[name]
        if w.mode is AgentPlacement.WRAPPER:
            if w.trainer is not None and w.trainer.running:
                w.trainer.exit(code)
            else:
                w.next_exit = code
            return
        pod = self.pods[name]
        if trainer_rule_codes(pod, self.trainer)(code):
            await self._restart_all(w, f"trainer exited {code}")
            return
        # Not in the rule: the trainer stays terminated with its real code; the pod fails.
        w.failed = True
        if w.agent is not None:
            w.agent.stop()
        trainer = self.trainer
        self._set_status(
            w, "failed",
            functools.partial(
                _terminated, _now(), lambda c: code if c == trainer else 0, {trainer: message}
            ),
        )  # fmt: skip

    def hang(self, name: str) -> SimTrainer:
        """The worker's trainer run stops reporting progress and keeps running, as a wedged
        device or a stuck collective leaves it (a worker with `progress`). Returns the
        run: its `reported_at` is its last step's time."""
        w = self.workers[name]
        run = w.trainer
        if run is None or not run.running:
            raise RuntimeError(f"{name}: no stand-in trainer runs")
        run.hang()
        return run

    def degrade(self, node: str, factor: float) -> None:
        """The device of `node` runs slow: its pods' trainers compute `factor` times as long
        per step (1: healthy again), and their gangs step at that pace. The slowness is the
        node's: a worker recreated elsewhere is healthy."""
        if factor == 1.0:
            self.slow_nodes.pop(node, None)
        else:
            self.slow_nodes[node] = factor

    def slow(self, name: str, factor: float) -> None:
        """As `degrade`, for the pod of this name now (a device allocated to it): the pod
        recreated under the name is healthy."""
        uid = self.pods[name]["metadata"]["uid"]
        if factor == 1.0:
            self.slow_pods.pop(uid, None)
        else:
            self.slow_pods[uid] = factor

    def node_of(self, name: str) -> str | None:
        """The node the pod of this name is bound to."""
        pod = self.pods.get(name)
        return None if pod is None else pod.get("spec", {}).get("nodeName")

    def slowness(self, name: str) -> float:
        """How many times the healthy compute the pod's trainer takes."""
        pod = self.pods.get(name)
        uid = pod["metadata"]["uid"] if pod is not None else None
        if uid in self.slow_pods:
            return self.slow_pods[uid]
        node = self.node_of(name)
        return self.slow_nodes.get(node, 1.0) if node is not None else 1.0

    def lose(self, name: str) -> None:
        """The worker's node died: its agent stops without a word (no status, no exit)."""
        w = self.workers.get(name)
        if w is not None:
            w.lost = True
            self._stop_trainer(w)
            if w.agent is not None:
                w.agent.stop()

    async def _report_progress(self, progress: SimProgress) -> None:
        """Every running stand-in trainer writes its step, on one timer for all of them; with
        compute, each gang at the pace of its slowest running trainer."""
        while True:
            now = time.monotonic()
            reported = False
            for w in self.workers.values():
                if w.trainer is None and w.agent is not None and w.agent.progress is not None:
                    self._start_pod_trainer(w, now)
                if w.trainer is not None and progress.compute_seconds is None:
                    reported |= w.trainer.report(now, progress)
            if progress.compute_seconds is not None:
                reported = self._step_gangs(now, progress)
            if reported:
                self._poke()
            await asyncio.sleep(progress.period)

    def _step_gangs(self, now: float, progress: SimProgress) -> bool:
        gangs: dict[str, list[tuple[SimTrainer, float]]] = {}
        for w in self.workers.values():
            run = w.trainer
            if run is None or not run.running or run.hung_at is not None:
                continue
            if run.rng is None:
                run.rng = random.Random(f"{progress.seed}/{w.name}/{len(w.trainer_runs)}")
            gangs.setdefault(w.job, []).append((run, self.slowness(w.name)))
        reported = False
        for job, runs in gangs.items():
            step = progress.step_seconds(max(slowness for _, slowness in runs))
            self.step_seconds[job] = step
            for run, slowness in runs:
                reported |= run.report(now, progress, step, slowness)
        return reported

    @staticmethod
    def _start_pod_trainer(w: Worker, now: float) -> None:
        """`Pod` mode: the kubelet starts the trainer container once its agent's barrier is
        open (the agent's startup probe); its stand-in reports to the agent's progress file, as
        the pod builder's `GANGJOB_PROGRESS` points the real one."""
        assert w.agent is not None
        state = w.agent.state
        if w.mode is AgentPlacement.WRAPPER or not state.barrier_open:
            return
        env = {ENV_PROGRESS: str(w.dir / PROGRESS_FILE), ENV_EPOCH: str(state.epoch)}
        w.trainer = SimTrainer([], env)
        w.trainer.started_at = now
        w.trainer_runs.append(w.trainer)

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
        await self.status.close()
        if self.arrival_client is not None:
            await self.arrival_client.close()
        for client in self._arrival_clients.values():
            await client.close()
        shutil.rmtree(self._root, ignore_errors=True)


# The kubelet's status transitions, each a change of its own latest status of the pod.


def _containers(status: JsonDict) -> list[JsonDict]:
    return [c for key in CONTAINER_LISTS for c in status.get(key, [])]


def _condition(status: JsonDict, kind: str) -> str | None:
    for c in status.get("conditions", []):
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def _ready(status: JsonDict, ready: str, stamp: str) -> None:
    conds = [c for c in status.get("conditions", []) if c["type"] != "AllContainersRestarting"]
    for c in conds:
        if c["type"] in ("Ready", "ContainersReady") and c.get("status") != ready:
            c["status"], c["lastTransitionTime"] = ready, stamp
    status["conditions"] = conds


def _restarting(stamp: str, status: JsonDict) -> None:
    """The pod's restart begins: `AllContainersRestarting`, not ready, restartCount +1, the
    synthetic lastState that keeps no real exit code."""
    _ready(status, "False", stamp)
    status["conditions"].append(
        {"type": "AllContainersRestarting", "status": "True", "lastTransitionTime": stamp}
    )
    for c in _containers(status):
        c["restartCount"] = c.get("restartCount", 0) + 1
        c["lastState"] = {"terminated": {**SYNTHETIC_EXIT, "finishedAt": stamp, "startedAt": stamp}}
        c["state"] = {"waiting": {"reason": "PodInitializing"}}
        c["ready"] = False


def _restarted(stamp: str, status: JsonDict) -> None:
    """Every container stopped and about to start again: the restart condition is gone."""
    _ready(status, "False", stamp)
    for c in _containers(status):
        c["state"] = {"waiting": {"reason": "RestartingAllContainers"}}


def _running(stamp: str, status: JsonDict) -> None:
    """The containers run again after a restart."""
    _ready(status, "True", stamp)
    status["phase"] = "Running"
    for c in _containers(status):
        c["state"] = {"running": {"startedAt": stamp}}
        c["ready"] = True
        c["started"] = True


def _terminated(
    stamp: str,
    codes: Callable[[str], int | None],
    messages: Mapping[str, str | None],
    status: JsonDict,
) -> None:
    """Containers ended, each with `codes(name)` (None: left as it is) and its termination
    message of `messages`, and with them the pod (`restartPolicy: Never`): Failed if one
    failed, else Succeeded."""
    _ready(status, "False", stamp)
    failed = False
    for c in _containers(status):
        code = codes(c["name"])
        if code is None:
            continue
        failed |= code != 0
        term: JsonDict = {"exitCode": code, "reason": "Error" if code else "Completed"}
        if messages.get(c["name"]):
            term["message"] = messages[c["name"]]
        c["state"] = {"terminated": {**term, "startedAt": stamp, "finishedAt": stamp}}
        c["ready"] = False
    status["phase"] = "Failed" if failed else "Succeeded"


def _write(path: Path, text: str) -> None:
    path.write_text(text)  # a few hundred bytes to a local dir, as the kubelet's volume would


async def _next_state(agent: Agent, seen: AgentState) -> None:
    """Returns when the agent's state is no longer `seen`."""
    await agent.wait_for(lambda s: s is not seen)
