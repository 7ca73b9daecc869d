"""The agent's state machine, in both restart modes (docs/design.md section 3): choose the epoch to
arrive at, arrive, wait at the barrier, then in `Pod` mode open the probe and exit with
`RESTART_EXIT_CODE` when the gang moves on, in `Process` mode run the trainer and restart it
in place at each new epoch. From each barrier on, the agent follows its trainer's progress
(agent/monitor.py, docs/progress.md).

An `Agent` is a plain object on the running event loop: `await Agent(config, api).run()` returns
the exit code the pod's process would exit with. Tests and benchmarks run thousands side by
side in one process; the pod runs exactly one through `agent.cli`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from agent.apiclient import Api, ClientError, HttpClient, ssl_context
from agent.arrival import AnnotationArrival, Arrival
from agent.config import Config
from agent.direct import ControllerClient, DirectArrival, ProgressChannel
from agent.monitor import ProgressMonitor, trainer_env
from agent.probe import ProbeServer
from agent.protocol import (
    Backoff,
    Barrier,
    JobState,
    arrived_epoch,
    barrier,
    dense_rank,
    epoch_env,
    in_world,
    outside_world_env,
    rendezvous_id,
    target_epoch,
    world_file_text,
)
from agent.trainer import Trainer, TrainerFactory, TrainerRun
from agent.watch import JobWatcher
from api.constants import (
    ENV_ARRIVAL_CA_PEM,
    ENV_DIR,
    ENV_PET_RDZV_ID,
    EPOCH_FILE,
    FINISHED_FILE,
    LAUNCH_POLL_SECONDS,
    RESTART_EXIT_CODE,
    STATE_FILE,
    TRAINER_EXIT_FILE,
    UNKNOWN_EXIT_CODE,
    WORLD_FILE,
    AgentPlacement,
)

R = TypeVar("R")

STOPPED_EXIT_CODE = 143
"""`Process` mode, asked to stop with no trainer running: as if killed by SIGTERM."""


class Step(StrEnum):
    """Where the agent is in the protocol (for logs, tests and benchmarks)."""

    STARTING = "starting"
    WAITING_FOR_EPOCH = "waiting-for-epoch"
    """Failed at its epoch (or its trainer did): waits for the controller to raise it."""
    ARRIVING = "arriving"
    AT_BARRIER = "at-barrier"
    RUNNING = "running"
    """Barrier open: `Pod` mode's probe says so; `Process` mode's trainer runs."""
    STOPPING = "stopping"
    DONE = "done"


@dataclass(frozen=True)
class AgentState:
    step: Step = Step.STARTING
    epoch: int | None = None
    """The epoch the agent targets (arrived at, or arriving at)."""
    barrier_open: bool = False
    """The barrier of `epoch` is open and this worker runs at it."""
    probe_open: bool = False
    """What `Pod` mode's startup probe answers: the barrier is open, or the worker is outside
    the world of its open barrier and its launcher holds the trainer (`_outside_world`)."""
    trainer_pid: int | None = None
    trainer_runs: int = 0
    last_exit: tuple[int, int] | None = None
    """`Process` mode: (epoch, code) of the trainer's last exit on its own."""
    exit_code: int | None = None
    """What `run()` returned, once DONE."""
    since: float = 0.0
    """`time.monotonic()` when the step began."""


class Stopped(Exception):
    """`stop()` was called: unwind, stopping the trainer on the way."""


class Agent:
    """One worker's agent. `run()` once, as a task; `stop()` to end it early."""

    def __init__(
        self,
        config: Config,
        api: Api,
        *,
        mode: AgentPlacement = AgentPlacement.SIDECAR,
        command: Sequence[str] = (),
        arrival: Arrival | None = None,
        arrival_client: ControllerClient | None = None,
        env: Mapping[str, str] | None = None,
        logger: logging.Logger | None = None,
        adopts_orphans: bool = False,
        trainer_factory: TrainerFactory | None = None,
    ) -> None:
        """`trainer_factory` makes each `Process`-mode trainer run (default: a `Trainer`
        process of `command`)."""
        if mode is AgentPlacement.WRAPPER and not command:
            raise ValueError("Process mode needs the trainer's command")
        self.config = config
        self.mode = mode
        self.command = list(command)
        # `Process` mode: every child left after a trainer run is the run's (see Trainer).
        self.adopts_orphans = adopts_orphans
        self._new_trainer: TrainerFactory = trainer_factory or self._trainer_process
        self._api = api
        self._env = dict(os.environ if env is None else env)
        self.log = logging.LoggerAdapter(
            logger or logging.getLogger("agent"), {"pod": config.pod_name}
        )
        self._watcher = JobWatcher(api, config, self.log)
        self._own_client: HttpClient | None = None
        annotation = AnnotationArrival(api, config.pod_path, config.pod_uid)
        if arrival is None and config.arrival_url is not None and arrival_client is None:
            arrival_client = self._own_client = self._controller_client(config)
        if arrival is None and config.arrival_url is not None and arrival_client is not None:
            arrival = DirectArrival(
                arrival_client,
                config,
                annotation,
                self._watcher.offer,
                self._ensure_watching,
                self.log,
                job_gone=self._watcher.gone,
            )
        self._arrival: Arrival = arrival or annotation
        # Through the controller, an agent needs no watch of its own: the report's answer
        # streams the job's state (a new pod reads the job once, to know where to arrive).
        # The watch starts only when that channel fails.
        self._direct = isinstance(self._arrival, DirectArrival)
        self.progress: ProgressMonitor | None = None
        """Follows the trainer's progress (docs/progress.md) where `progress_poll_seconds` is
        set; it reports to the controller through the arrival endpoint only."""
        if config.progress_poll_seconds:
            send = None
            if self._direct and arrival_client is not None:
                send = ProgressChannel(arrival_client, config, self.log).send
            self.progress = ProgressMonitor(config, self.log, send)
        self._state = AgentState(since=time.monotonic())
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._probe: ProbeServer | None = None
        self._probe_ready = asyncio.Event()
        self._trainer: TrainerRun | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[bool] | None = None

    def _controller_client(self, config: Config) -> HttpClient | None:
        """The client to the arrival endpoint; None, and so the annotation, if the CA to
        verify it with cannot be read (nothing goes to an endpoint the agent cannot verify)."""
        assert config.arrival_url is not None
        tls = None
        if config.arrival_ca_pem is not None or config.arrival_ca_file is not None:
            try:
                if config.arrival_ca_pem is not None:
                    tls = ssl.create_default_context(cadata=config.arrival_ca_pem)
                else:
                    tls = ssl_context(config.arrival_ca_file)
            except (OSError, ssl.SSLError) as e:
                self.log.error(
                    "the arrival endpoint's CA %s is unreadable (%s): arriving by annotation",
                    "(" + ENV_ARRIVAL_CA_PEM + ")"
                    if config.arrival_ca_pem is not None
                    else config.arrival_ca_file,
                    e,
                )
                return None
        return HttpClient(config.arrival_url, ssl_context=tls)

    # observing

    @property
    def state(self) -> AgentState:
        return self._state

    @property
    def job(self) -> JobState | None:
        """The agent's latest view of its GangJob."""
        return self._watcher.state

    @property
    def job_deleted(self) -> bool:
        """The GangJob is gone: the agent no longer reads it, and idles until stopped."""
        return self._watcher.deleted

    async def wait_for(self, predicate: Callable[[AgentState], bool]) -> AgentState:
        """The first state (the current one included) for which `predicate` holds."""
        while not predicate(self._state):
            await self._changed.wait()
        return self._state

    async def probe_port(self) -> int:
        """The probe's port once it listens (`Pod` mode with `config.probe_port` set)."""
        await self._probe_ready.wait()
        if self._probe is None:
            raise RuntimeError("this agent serves no probe")
        return self._probe.port

    def _set(self, **changes: Any) -> None:
        if "step" in changes and changes["step"] != self._state.step:
            changes["since"] = time.monotonic()
        self._state = dataclasses.replace(self._state, **changes)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # running

    def stop(self) -> None:
        """Asks `run()` to end: `Process` mode stops the trainer first (SIGTERM, then SIGKILL
        after the grace) and returns its exit code."""
        self._stop.set()

    def _ensure_watching(self) -> None:
        """Starts the apiserver watch of the job, once."""
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(self._watcher.run())

    async def run(self) -> int:
        """Runs the protocol; returns the exit code for the pod's process."""
        self._stop_task = asyncio.create_task(self._stop.wait())
        if self.progress is not None:
            self.progress.replay_stacks()
        if not self._direct:
            self._ensure_watching()
        try:
            if self.mode is AgentPlacement.SIDECAR and self.config.probe_port is not None:
                self._probe = ProbeServer(
                    self.config.probe_host,
                    self.config.probe_port,
                    lambda: self._state.probe_open,
                )
                await self._probe.start()
            self._probe_ready.set()
            if self.mode is AgentPlacement.SIDECAR:
                code = await self._run_pod()
            else:
                code = await self._run_process()
        except Stopped:
            code = await self._stopped()
        finally:
            self._probe_ready.set()
            tasks = [t for t in (self._watch_task, self._stop_task) if t is not None]
            for task in tasks:
                task.cancel()
            # Collected, so a watcher that died of a bug does not also warn at exit.
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.progress is not None:
                await self.progress.stop()
            await self._arrival.close()
            if self._own_client is not None:
                await self._own_client.close()
            if self._trainer is not None:  # an error unwound past a running trainer
                await self._trainer.stop(self.config.kill_grace_seconds)
            if self._probe is not None:
                await self._probe.close()
        self._set(step=Step.DONE, exit_code=code, barrier_open=False, probe_open=False)
        return code

    async def _stopped(self) -> int:
        self.log.info("asked to stop")
        if self.mode is AgentPlacement.SIDECAR:
            return 0
        if self._trainer is None:
            return STOPPED_EXIT_CODE
        self._set(step=Step.STOPPING)
        self.log.info("stopping the trainer (grace %.0fs)", self.config.kill_grace_seconds)
        code = await self._trainer.stop(self.config.kill_grace_seconds)
        self._trainer = None
        self.log.info("trainer exited with code %d", code)
        return code

    async def _run_pod(self) -> int:
        target = await self._initial_target()
        await self._arrive(target)
        state = await self._wait_barrier(target)
        outside = barrier(state, target) is Barrier.OPEN and not self._in_world(state)
        if outside:
            state = await self._outside_world(target, state)
        if barrier(state, target) is Barrier.MOVED:
            self._save_state(target, state.epoch)
            self.log.info(
                "gang moved to epoch %d before the barrier of %d opened: exiting %d to restart",
                state.epoch,
                target,
                RESTART_EXIT_CODE,
            )
            return RESTART_EXIT_CODE
        if not outside:
            if self.progress is not None:
                self.progress.start(target, None)
            state = await self._until_moved_or_finished(target)
        if state.epoch <= target:
            if self.progress is not None:
                await self.progress.stop()
            if self.config.launched:
                self._tell_launcher_finished()
            self.log.info(
                "job %s%s: idle until the kubelet stops the pod",
                state.phase,
                f", role {self.config.role} Complete" if self._role_complete(state) else "",
            )
            state = await self._wait_job(lambda s: s.epoch > target)
        if self.progress is not None:
            await self.progress.stop()  # a stack collection under way ends first
        self._set(barrier_open=False, probe_open=False, step=Step.STOPPING)
        self._save_state(target, state.epoch)
        self.log.info(
            "gang moved to epoch %d: exiting %d to restart the pod",
            state.epoch,
            RESTART_EXIT_CODE,
        )
        return RESTART_EXIT_CODE

    async def _until_moved_or_finished(self, target: int) -> JobState:
        """`Pod` mode, the barrier of `target` open: waits until the gang moves on or the job
        finishes. With the trainer launched by `agent.pyz launch`, a trainer that exits 0
        meanwhile is reported: its launcher holds the container until the job finishes."""

        def done(s: JobState) -> bool:
            return s.epoch > target or s.finished or self._role_complete(s)

        if not self.config.launched:
            return await self._wait_job(done)
        reporter = asyncio.create_task(self._report_launched_exit(target))
        try:
            return await self._wait_job(done)
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)

    async def _report_launched_exit(self, target: int) -> None:
        path = self.config.dir / TRAINER_EXIT_FILE
        while True:
            try:
                if path.read_text().strip() == f"{target}:0":
                    break
            except OSError:
                pass  # not written: the trainer still runs
            await asyncio.sleep(LAUNCH_POLL_SECONDS)
        self._set(last_exit=(target, 0))
        await self._retry(
            f"reporting exit {target}:0", lambda: self._arrival.arrive(target, (target, 0))
        )
        self.log.info("reported trainer exit 0 at epoch %d; its launcher waits", target)

    def _role_complete(self, state: JobState) -> bool:
        """Every worker of this worker's role succeeded: the role is done for good, no part of
        a later restart, so a worker of it that succeeded need not be held."""
        return self.config.role is not None and self.config.role in state.complete_roles

    def _tell_launcher_finished(self) -> None:
        try:
            self._replace_file(FINISHED_FILE, "1\n")
        except OSError as e:
            self.log.error("cannot write %s: %s", self.config.dir / FINISHED_FILE, e)

    async def _run_process(self) -> int:
        target = await self._initial_target()
        while True:
            await self._arrive(target)
            state = await self._wait_barrier(target)
            if barrier(state, target) is Barrier.MOVED:
                self.log.info("gang moved to epoch %d before the barrier opened", state.epoch)
                target = state.epoch
                continue
            if not self._in_world(state):
                state = await self._outside_world(target, state)
                if state.finished:
                    return 0
                target = state.epoch
                continue
            moved, code = await self._run_trainer(target, state)
            if moved is not None:
                target = moved.epoch
                continue
            finished = await self._after_exit(target, code)
            if finished is not None:
                return finished
            target = self._job_state().epoch

    async def _after_exit(self, target: int, code: int) -> int | None:
        """Reports the trainer's exit at `target`; returns the agent's exit code if the worker is
        done, else None once the gang moved past `target`."""
        self._set(step=Step.ARRIVING, last_exit=(target, code))
        await self._retry(
            f"reporting exit {target}:{code}", lambda: self._arrival.arrive(target, (target, code))
        )
        self.log.info("reported trainer exit %d at epoch %d", code, target)
        # The controller classifies the exit: a restart raises the epoch, a failure ends the job.
        # A trainer that succeeded waits too: until the job has, it is one of the gang, and a
        # restart (another worker failed) runs it again at the new epoch, in this container.
        self._set(step=Step.WAITING_FOR_EPOCH)
        state = await self._wait_job(
            lambda s: s.epoch > target or s.finished or (code == 0 and self._role_complete(s))
        )
        if state.epoch > target:
            return None
        result = code if state.phase == "Failed" else 0
        self.log.info("job %s: exiting with code %d", state.phase, result)
        return result

    def _job_state(self) -> JobState:
        state = self._watcher.state
        assert state is not None  # set before any wait on it returned
        return state

    def _trainer_process(self, argv: Sequence[str], env: Mapping[str, str]) -> TrainerRun:
        return Trainer(argv, env, adopts=self.adopts_orphans)

    def _in_world(self, state: JobState) -> bool:
        return in_world(self.config.rank, state)

    async def _outside_world(self, target: int, state: JobState) -> JobState:
        """A worker outside the world of `target` at its open barrier: a spare
        (`elastic.spares`), or a surplus worker of an elastic resize whose pod is being deleted.
        It must run nothing at `target`, whose world has no place for it. Waits, its trainer
        held, until the gang moves on (a spare may then be a member: in `Pod` mode its pod
        restarts in place with the others) or finishes.

        `Pod` mode with the trainer run by `agent.pyz launch` (an elastic gang's always is):
        the `world` file says the worker is outside (`outside_world_env`), and the startup probe
        opens: the kubelet starts the launcher, which reads the file and starts nothing. A probe
        kept shut would fail past its `failureThreshold` (`barrierTimeoutSeconds + 60`) and the
        kubelet would restart the sidecar, in a loop, for as long as the spare idles."""
        held = self.mode is AgentPlacement.SIDECAR and self.config.launched
        if held:
            self._write_world_file(target, state)
            self._write_epoch_file(target)
        self._set(barrier_open=False, probe_open=held, step=Step.WAITING_FOR_EPOCH)
        self.log.info(
            "worker %s is outside the world of epoch %d (a spare): holding the trainer%s",
            self.config.rank,
            target,
            " (its launcher waits)" if held else "",
        )
        return await self._wait_job(lambda s: s.epoch > target or s.finished)

    async def _run_trainer(
        self, target: int, state: JobState | None = None
    ) -> tuple[JobState | None, int]:
        """Runs the trainer at `target` until it exits (None, code), or the gang moves on and it
        is stopped (the new job state, its code). With the epoch's world (`state`, an elastic
        gang's) it runs with the epoch's `RANK` and `WORLD_SIZE` (`epoch_env`)."""
        env = dict(self._env)
        if self.progress is not None:
            env = trainer_env(self.config.dir, env)
        if state is None:
            env |= epoch_env(target, None, None)
        else:
            rank = dense_rank(self.config.rank, state.dropped, state.places)
            env |= epoch_env(target, rank, state.world_size)
        env[ENV_DIR] = str(self.config.dir)
        env[ENV_PET_RDZV_ID] = rendezvous_id(self.config.job_name, target)
        trainer = self._new_trainer(self.command, env)
        self._trainer = trainer
        await trainer.start()
        runs = self._state.trainer_runs + 1
        self._set(step=Step.RUNNING, trainer_pid=trainer.pid, trainer_runs=runs)
        self.log.info("trainer started at epoch %d (pid %s)", target, trainer.pid)
        if self.progress is not None:
            self.progress.start(target, trainer.pid)
        exited = asyncio.create_task(trainer.wait())
        moved = asyncio.create_task(self._watcher.wait_for(lambda s: s.epoch > target))
        try:
            await self._first(exited, moved)
        finally:
            exited.cancel()
            moved.cancel()
            if self.progress is not None:
                await self.progress.stop()
        # Both at once: the trainer most likely died of the restart (its peers went away);
        # the new epoch wins and its exit is not reported against the old one.
        if moved.done() and not moved.cancelled():
            state = moved.result()
            self._set(step=Step.STOPPING)
            self.log.info("gang moved to epoch %d: stopping the trainer", state.epoch)
            code = await trainer.stop(self.config.kill_grace_seconds)
            self._trainer = None
            self._set(trainer_pid=None)
            self.log.info("trainer stopped (exit code %d)", code)
            return state, code
        code = exited.result()
        self._trainer = None
        self._set(trainer_pid=None)
        self.log.info("trainer exited with code %d at epoch %d", code, target)
        return None, code

    # protocol steps

    async def _initial_target(self) -> int:
        saved = self._load_state()
        if saved is not None:
            # Restarted in place: the state file says where this pod stands, and the report's
            # answer will say where the gang is (a gang that moved on meanwhile is MOVED).
            arrived, seen = saved
        else:
            pod = await self._retry("reading own pod", lambda: self._api.get(self.config.pod_path))
            arrived = arrived_epoch(pod)
            if self._direct:
                # One read, not a watch: the report's answer streams the job's state. N agents
                # each watching the job would be sent every status write of it, N times over.
                seen = (await self._retry("reading the job", self._watcher.read)).epoch
            else:
                self._ensure_watching()
                seen = (await self._wait_job(lambda s: True)).epoch
        target = target_epoch(arrived, seen)
        if target is not None:
            return target
        assert arrived is not None
        self._set(step=Step.WAITING_FOR_EPOCH, epoch=arrived)
        self.log.info(
            "pod already arrived at epoch %d (failed there): waiting for the next epoch", arrived
        )
        # Say so durably: the kubelet's restart condition is fleeting and the controller may
        # have been down for it. Best effort: the controller may also have seen it already.
        report = (arrived, UNKNOWN_EXIT_CODE)
        await self._retry(
            f"reporting the restart at epoch {arrived}",
            lambda: self._arrival.arrive(arrived, report),
        )
        state = await self._wait_job(lambda s: s.epoch > arrived)
        return state.epoch

    async def _arrive(self, target: int) -> None:
        self._set(step=Step.ARRIVING, epoch=target, barrier_open=False, probe_open=False)
        if self.progress is not None:
            self.progress.prepare()
        # Saved before the report: a crash right after it must not make the restarted agent
        # arrive at the same epoch a second time.
        self._save_state(target, target)
        await self._retry(f"arriving at epoch {target}", lambda: self._arrival.arrive(target))
        self.log.info("arrived at epoch %d", target)

    def _load_state(self) -> tuple[int | None, int] | None:
        """(arrived, seen) from the state file, if it is this pod's (same UID)."""
        if not self.config.pod_uid:
            return None
        try:
            saved = json.loads((self.config.dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("uid") != self.config.pod_uid:
            return None
        arrived, seen = saved.get("arrived"), saved.get("seen")
        if not isinstance(seen, int) or not (arrived is None or isinstance(arrived, int)):
            return None
        return arrived, seen

    def _save_state(self, arrived: int | None, seen: int) -> None:
        if not self.config.pod_uid:
            return
        body = {"uid": self.config.pod_uid, "arrived": arrived, "seen": seen}
        try:
            self._replace_file(STATE_FILE, json.dumps(body))
        except OSError as e:
            # Not fatal: without it a restarted agent reads its pod and its job instead.
            self.log.warning("cannot write %s: %s", self.config.dir / STATE_FILE, e)

    def _replace_file(self, name: str, text: str) -> None:
        """Writes `$GANGJOB_DIR/<name>` whole: a temporary file, then a rename, so that a reader
        (the trainer, or the agent after a restart) never sees it half-written."""
        path = self.config.dir / name
        tmp = path.with_name(f".{name}.tmp")
        self.config.dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)

    async def _wait_barrier(self, target: int) -> JobState:
        """Waits at the barrier of `target`; once open, writes the epoch file and opens the probe.
        Returns the job state that ended the wait."""
        self._set(step=Step.AT_BARRIER)
        started = time.monotonic()
        state = await self._wait_job(lambda s: barrier(s, target) is not Barrier.WAIT)
        if barrier(state, target) is Barrier.OPEN:
            if not self._in_world(state):
                return state  # a spare or surplus worker: the probe stays shut (`_outside_world`)
            self._write_world_file(target, state)
            self._write_epoch_file(target)
            # Process mode is RUNNING once its trainer is.
            step = Step.RUNNING if self.mode is AgentPlacement.SIDECAR else Step.AT_BARRIER
            self._set(step=step, barrier_open=True, probe_open=True)
            self.log.info("barrier open at %d after %.2fs", target, time.monotonic() - started)
        return state

    def _write_world_file(self, epoch: int, state: JobState) -> None:
        """An elastic gang's `world` file for `epoch`: the worker's `RANK` and `WORLD_SIZE`
        there, or, outside its world, the epoch alone (`outside_world_env`)."""
        if state.world_size is None or self.config.rank is None:
            return
        if self._in_world(state):
            rank = dense_rank(self.config.rank, state.dropped, state.places)
            env = epoch_env(epoch, rank, state.world_size)
        else:
            env = outside_world_env(epoch)
        try:
            self._replace_file(WORLD_FILE, world_file_text(env))
        except OSError as e:
            self.log.error("cannot write %s: %s", self.config.dir / WORLD_FILE, e)

    def _write_epoch_file(self, epoch: int) -> None:
        try:
            self._replace_file(EPOCH_FILE, f"{epoch}\n")
        except OSError as e:
            # Not fatal: the barrier matters more than the file, and Process mode also passes
            # the epoch in the environment.
            self.log.error("cannot write %s: %s", self.config.dir / EPOCH_FILE, e)

    # waiting

    async def _wait_job(self, predicate: Callable[[JobState], bool]) -> JobState:
        waiter = asyncio.create_task(self._watcher.wait_for(predicate))
        try:
            await self._first(waiter)
        finally:
            waiter.cancel()
        return waiter.result()

    async def _first(self, *tasks: asyncio.Task[Any]) -> None:
        """Waits until one of `tasks` is done; raises `Stopped` on `stop()` and the watcher's
        error if it died (a bug: it retries every API failure itself)."""
        assert self._stop_task is not None
        waits = {*tasks, self._stop_task}
        if self._watch_task is not None:
            waits.add(self._watch_task)
        while True:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if any(t.done() for t in tasks):
                return
            if self._stop_task.done():
                raise Stopped
            assert self._watch_task is not None
            self._watch_task.result()
            if not self._watcher.deleted:
                raise RuntimeError("job watcher ended")
            # The job is gone: nothing will come, and the agent idles until it is stopped.
            waits.discard(self._watch_task)

    async def _retry(self, what: str, call: Callable[[], Awaitable[R]]) -> R:
        """`call()` until it succeeds, with backoff; `Stopped` on `stop()`."""
        backoff = Backoff(self.config.backoff_initial, self.config.backoff_max)
        while True:
            try:
                return await call()
            except ClientError as e:
                delay = backoff.next()
                self.log.warning("%s failed (%s); retrying in %.1fs", what, e, delay)
            sleep = asyncio.create_task(asyncio.sleep(delay))
            try:
                await self._first(sleep)
            finally:
                sleep.cancel()
