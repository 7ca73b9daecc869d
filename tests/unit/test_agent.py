"""The agent without a cluster: the epoch-choice and barrier rules, its view of the GangJob, its
configuration, and its state machine in both modes driven by an in-memory API (watch semantics
with resourceVersions, 410s and broken streams). Also: the zipapp runs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from agent.agent import STOPPED_EXIT_CODE, Agent, AgentState, Step
from agent.apiclient import ApiError, JsonDict, TransportError
from agent.build import build_zipapp
from agent.config import Config, ConfigError
from agent.protocol import (
    Backoff,
    Barrier,
    JobState,
    arrival_patch,
    arrived_epoch,
    barrier,
    exit_status,
    target_epoch,
)
from api.constants import (
    ANNOTATION_EPOCH,
    ANNOTATION_EXIT,
    FINISHED_FILE,
    RESTART_EXIT_CODE,
    TRAINER_EXIT_FILE,
    AgentPlacement,
)
from controller.arrivals.server import state_line

DEADLINE = 10.0
NS = "ns"
JOB = "train"

# pure rules


@pytest.mark.parametrize(
    ("arrived", "epoch", "target"),
    [
        (None, 0, 0),  # fresh pod, fresh job
        (None, 5, 5),  # fresh pod (recreated worker) joins the gang's epoch
        (2, 3, 3),  # restarted for the gang's new epoch
        (1, 4, 4),  # several bumps missed: the newest epoch only
        (3, 3, None),  # failed at 3 (its pod restarted under it): wait for 4
        (0, 0, None),
        (5, 3, None),  # above the gang (should not happen): never arrive below own epoch
    ],
)
def test_target_epoch(arrived: int | None, epoch: int, target: int | None) -> None:
    assert target_epoch(arrived, epoch) == target


@pytest.mark.parametrize(
    ("epoch", "barrier_epoch", "target", "want"),
    [
        (3, None, 3, Barrier.WAIT),
        (3, 2, 3, Barrier.WAIT),
        (3, 3, 3, Barrier.OPEN),
        (4, 3, 3, Barrier.MOVED),  # bumped right after opening: the new epoch wins
        (4, None, 3, Barrier.MOVED),
        (4, 4, 3, Barrier.MOVED),
    ],
)
def test_barrier(epoch: int, barrier_epoch: int | None, target: int, want: Barrier) -> None:
    assert barrier(JobState(epoch, barrier_epoch), target) is want


def test_job_state_reads_defaults_and_ignores_garbage() -> None:
    assert JobState.from_object({}) == JobState(0, None, None, "")
    assert JobState.from_object({"metadata": {"resourceVersion": "7"}, "status": None}) == (
        JobState(0, None, None, "7")
    )
    obj = {"status": {"epoch": 2, "barrierEpoch": 1, "phase": "Running"}}
    assert JobState.from_object(obj) == JobState(2, 1, "Running", "")
    for bad in ("2", -1, True, 1.5):
        assert JobState.from_object({"status": {"epoch": bad, "barrierEpoch": bad}}) == (
            JobState(0, None, None, "")
        )
    assert JobState(phase="Failed").finished
    assert not JobState(phase="Restarting").finished


def test_annotations() -> None:
    assert arrival_patch(3) == {"metadata": {"annotations": {ANNOTATION_EPOCH: "3"}}}
    assert arrival_patch(3, (3, 1)) == {
        "metadata": {"annotations": {ANNOTATION_EPOCH: "3", ANNOTATION_EXIT: "3:1"}}
    }
    assert arrived_epoch({"metadata": {"annotations": {ANNOTATION_EPOCH: "12"}}}) == 12
    pods: list[JsonDict] = [{}, {"metadata": {}}]
    pods.append({"metadata": {"annotations": {ANNOTATION_EPOCH: "-1"}}})
    for pod in pods:
        assert arrived_epoch(pod) is None


def test_exit_status() -> None:
    assert [exit_status(c) for c in (0, 3, -9, -15)] == [0, 3, 137, 143]


def test_backoff_is_bounded_and_jittered() -> None:
    backoff = Backoff(0.2, 10.0)
    delays = [backoff.next() for _ in range(20)]
    assert all(0.2 <= d <= 10.0 for d in delays)
    assert delays[0] <= 0.2 + 1e-9
    assert max(delays[-5:]) > 5.0
    backoff.reset()
    assert backoff.next() <= 0.2 + 1e-9


def test_config_from_env() -> None:
    env = {"GANGJOB_NAME": "j", "POD_NAME": "j-0", "POD_NAMESPACE": "n"}
    config = Config.from_env(env)
    assert (config.job_name, config.pod_name, config.namespace) == ("j", "j-0", "n")
    assert (config.probe_port, config.dir, config.kill_grace_seconds) == (
        9445,
        pathlib.Path("/gangjob"),
        10.0,
    )
    assert config.jobs_path == "/apis/gangjob.io/v1alpha1/namespaces/n/gangjobs"
    assert config.pod_path == "/api/v1/namespaces/n/pods/j-0"
    env |= {"GANGJOB_AGENT_PORT": "8000", "GANGJOB_DIR": "/x", "GANGJOB_KILL_GRACE_SECONDS": "2.5"}
    config = Config.from_env(env)
    assert (config.probe_port, config.dir, config.kill_grace_seconds) == (
        8000,
        pathlib.Path("/x"),
        2.5,
    )
    with pytest.raises(ConfigError, match="POD_NAME"):
        Config.from_env({"GANGJOB_NAME": "j", "POD_NAMESPACE": "n"})
    for bad in ("0", "70000", "http", "1.5"):
        with pytest.raises(ConfigError, match="GANGJOB_AGENT_PORT"):
            Config.from_env(env | {"GANGJOB_AGENT_PORT": bad})
    with pytest.raises(ConfigError, match="GANGJOB_KILL_GRACE_SECONDS"):
        Config.from_env(env | {"GANGJOB_KILL_GRACE_SECONDS": "-1"})


def test_zipapp_runs(tmp_path: pathlib.Path) -> None:
    pyz = build_zipapp(tmp_path / "agent.pyz")
    assert os.access(pyz, os.X_OK)
    out = subprocess.run(
        [sys.executable, str(pyz), "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert "sidecar" in out.stdout
    assert "wrap" in out.stdout
    # Nothing but the agent's sources and the protocol names is shipped, and it does not need
    # the project installed.
    import zipfile

    names = zipfile.ZipFile(pyz).namelist()
    shipped = {"__main__.py", "api/", "api/__init__.py", "api/constants.py"}
    assert all(n in shipped or n.startswith("agent/") for n in names), names
    assert not [n for n in names if n.endswith(".pyc")]
    out = subprocess.run(
        [sys.executable, "-I", str(pyz), "sidecar"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "GANGJOB_NAME is not set" in out.stderr


# an in-memory API


class FakeApi:
    """One GangJob and its pods, with the apiserver's watch semantics: events after a
    resourceVersion, 410 for a compacted one, ERROR events and broken streams on demand."""

    def __init__(self, epoch: int = 0, phase: str = "Running") -> None:
        self.rv = 1
        self.compacted = 0
        self.job: JsonDict = {
            "metadata": {"name": JOB, "namespace": NS, "resourceVersion": "1"},
            "status": {"epoch": epoch, "phase": phase},
        }
        self.history: list[tuple[int, JsonDict]] = []
        self.pods: dict[str, JsonDict] = {}
        self.patches: list[tuple[str, JsonDict]] = []
        self.fail_patches = 0
        self.refused_patches = 0
        self.fail_gets = 0
        self._wake = asyncio.Event()
        self._break_watches = 0
        self.watches_opened = 0
        self.job_gets = 0

    def add_pod(self, name: str, annotations: Mapping[str, str] | None = None) -> None:
        self.pods[name] = {"metadata": {"name": name, "annotations": dict(annotations or {})}}

    def annotations(self, pod: str) -> dict[str, str]:
        result: dict[str, str] = self.pods[pod]["metadata"]["annotations"]
        return result

    def set_status(self, **status: Any) -> None:
        self.rv += 1
        self.job = copy.deepcopy(self.job)
        self.job["status"].update(status)
        self.job["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, {"type": "MODIFIED", "object": self.job}))
        self._notify()

    def delete_job(self) -> None:
        self.rv += 1
        gone = copy.deepcopy(self.job)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, {"type": "DELETED", "object": gone}))
        self.job = {}
        self._notify()

    def compact(self) -> None:
        """Every resourceVersion so far expires: watches from them get 410."""
        self.compacted = self.rv

    def break_watches(self, n: int = 1) -> None:
        self._break_watches = n
        self._notify()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Waits until `predicate()` holds, checked again after every change or watch."""
        async with asyncio.timeout(DEADLINE):
            while not predicate():
                await self._wake.wait()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JsonDict:
        await asyncio.sleep(0)
        if self.fail_gets:
            self.fail_gets -= 1
            raise TransportError("injected")
        name = path.rsplit("/", 1)[1]
        if path.endswith("/gangjobs"):
            # As the apiserver: the list's resourceVersion is the latest, the item's its own.
            assert params == {"fieldSelector": f"metadata.name={JOB}"}
            self.job_gets += 1
            meta = {"resourceVersion": str(self.rv)}
            return {"metadata": meta, "items": [copy.deepcopy(self.job)] if self.job else []}
        if name not in self.pods:
            raise ApiError(404, "NotFound")
        return copy.deepcopy(self.pods[name])

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        await asyncio.sleep(0)
        if self.fail_patches:
            self.fail_patches -= 1
            raise ApiError(503, "ServiceUnavailable")
        name = path.rsplit("/", 1)[1]
        want = patch["metadata"].get("uid")
        if want is not None and self.pods[name]["metadata"].get("uid") != want:
            self.refused_patches += 1
            self._notify()
            raise ApiError(409, "Conflict", "Precondition failed: UID in precondition")
        self.rv += 1  # one revision counter for all objects, as etcd's
        self.patches.append((name, patch))
        self.annotations(name).update(patch["metadata"]["annotations"])
        self._notify()
        return copy.deepcopy(self.pods[name])

    async def watch(
        self, path: str, params: Mapping[str, str], *, inactivity_timeout: float
    ) -> AsyncGenerator[JsonDict, None]:
        assert params["fieldSelector"] == f"metadata.name={JOB}"
        assert params["allowWatchBookmarks"] == "true"
        self.watches_opened += 1
        self._notify()
        since = int(params.get("resourceVersion") or self.rv)
        if since < self.compacted:
            yield {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
            return
        while True:
            if self._break_watches:
                self._break_watches -= 1
                raise TransportError("injected: stream broke")
            for rv, event in self.history:
                if rv > since:
                    since = rv
                    yield event
            wake = self._wake
            await wake.wait()


def make_config(tmp_path: pathlib.Path, pod: str = "train-0", **kw: Any) -> Config:
    return Config(
        job_name=JOB,
        pod_name=pod,
        namespace=NS,
        dir=tmp_path / pod,
        probe_port=None,
        backoff_initial=0.01,
        backoff_max=0.05,
        **kw,
    )


async def polled(predicate: Callable[[], bool]) -> None:
    """Until `predicate()` holds, for state nothing signals (checked every 10 ms)."""
    async with asyncio.timeout(DEADLINE):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(a: Agent) -> AsyncIterator[asyncio.Task[int]]:
    task = asyncio.create_task(a.run())
    try:
        yield task
    finally:
        if not task.done():
            a.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, DEADLINE)


async def until(a: Agent, predicate: Callable[[AgentState], bool]) -> AgentState:
    return await asyncio.wait_for(a.wait_for(predicate), DEADLINE)


def at(step: Step, epoch: int) -> Callable[[AgentState], bool]:
    return lambda s: s.step == step and s.epoch == epoch


# Pod mode


async def test_pod_mode_arrives_waits_opens_and_restarts_on_a_bump(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=2)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 2))
        assert fake.annotations("train-0") == {ANNOTATION_EPOCH: "2"}
        assert not a.state.barrier_open
        assert not (tmp_path / "train-0" / "epoch").exists()
        fake.set_status(barrierEpoch=1)  # an older barrier is not ours
        fake.set_status(barrierEpoch=2)
        await until(a, lambda s: s.barrier_open)
        assert (tmp_path / "train-0" / "epoch").read_text() == "2\n"
        fake.set_status(epoch=3)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    assert a.state.step == Step.DONE
    assert not a.state.barrier_open
    assert len(fake.patches) == 1


async def test_pod_mode_after_its_pod_restarted_arrives_at_the_next_epoch(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=2)
    fake.add_pod("train-0", {ANNOTATION_EPOCH: "2"})  # it failed at 2: no second arrival at 2
    a = Agent(make_config(tmp_path), fake)
    async with running(a):
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH)
        fake.set_status(barrierEpoch=2)  # the gang is running at 2 without it
        await asyncio.sleep(0.05)  # give it a chance to misbehave
        # Its only write: the durable report that it failed at 2 (code unknown), the epoch
        # annotation unchanged: it does not arrive at 2 a second time.
        assert fake.patches == [
            (
                "train-0",
                {"metadata": {"annotations": {ANNOTATION_EPOCH: "2", ANNOTATION_EXIT: "2:-1"}}},
            )
        ]
        fake.set_status(epoch=3)
        await until(a, at(Step.AT_BARRIER, 3))
        assert fake.annotations("train-0")[ANNOTATION_EPOCH] == "3"


async def test_pod_mode_restarts_when_the_gang_moves_on_before_the_barrier(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=1)
    fake.add_pod("train-0", {ANNOTATION_EPOCH: "0"})
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 1))
        fake.set_status(epoch=2)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    assert not (tmp_path / "train-0" / "epoch").exists()


async def test_pod_mode_stays_idle_when_the_job_finished(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        fake.set_status(phase="Succeeded")
        await asyncio.sleep(0.05)
        assert not task.done()
        a.stop()  # the kubelet stops the sidecar once the trainer ended
        assert await asyncio.wait_for(task, DEADLINE) == 0


async def test_process_mode_runs_a_trainer_that_succeeded_again_when_the_gang_restarts(
    tmp_path: pathlib.Path,
) -> None:
    """The trainer exited 0, then another worker failed: the gang's restart runs it again at the
    new epoch, in the same container."""
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=sh("exit 0"))
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH and s.last_exit == (0, 0))
        fake.set_status(epoch=1)
        await until(a, at(Step.AT_BARRIER, 1))
        fake.set_status(barrierEpoch=1)
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH and s.last_exit == (1, 0))
        assert a.state.trainer_runs == 2
        fake.set_status(phase="Succeeded")
        assert await asyncio.wait_for(task, DEADLINE) == 0


async def test_process_mode_a_worker_that_succeeded_ends_once_its_role_is_complete(
    tmp_path: pathlib.Path,
) -> None:
    """A role done for good (an initializer every worker of which succeeded) is no part of a
    later restart: its worker need not wait for the job."""
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(
        make_config(tmp_path, role="init"), fake, mode=AgentPlacement.WRAPPER, command=sh("exit 0")
    )
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH and s.last_exit == (0, 0))
        fake.set_status(roles=[{"name": "other", "state": "Complete"}])
        await asyncio.sleep(0.05)
        assert not task.done()
        fake.set_status(roles=[{"name": "init", "state": "Complete"}])
        assert await asyncio.wait_for(task, DEADLINE) == 0


def test_the_state_line_names_the_complete_roles_only() -> None:
    job = {
        "metadata": {"name": "llama"},
        "status": {
            "epoch": 2,
            "barrierEpoch": 2,
            "phase": "Running",
            "roles": [{"name": "init", "state": "Complete", "succeeded": 1},
                      {"name": "worker", "state": "Running"}],
        },
    }  # fmt: skip
    event = json.loads(state_line(job))
    state = JobState.from_object(event["object"])
    assert (state.epoch, state.barrier_epoch, state.phase) == (2, 2, "Running")
    assert state.complete_roles == {"init"}
    assert event["object"]["status"]["roles"] == [{"name": "init", "state": "Complete"}]
    assert "roles" not in json.loads(state_line({"status": {"epoch": 0}}))["object"]["status"]


async def test_pod_mode_reports_a_launched_trainers_success_and_releases_its_launcher(
    tmp_path: pathlib.Path,
) -> None:
    """`agent.pyz launch` wrote that its trainer exited 0 at the epoch: the sidecar reports it,
    and once the job has finished tells the launcher, which then ends the container."""
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path, launched=True), fake)
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        (a.config.dir / TRAINER_EXIT_FILE).write_text("0:0\n")
        await until(a, lambda s: s.last_exit == (0, 0))
        await polled(lambda: fake.annotations("train-0").get(ANNOTATION_EXIT) == "0:0")
        assert not (a.config.dir / FINISHED_FILE).exists()
        fake.set_status(phase="Succeeded")
        await polled(lambda: (a.config.dir / FINISHED_FILE).exists())
        a.stop()  # the kubelet stops the sidecar once the launcher ended
        assert await asyncio.wait_for(task, DEADLINE) == 0


async def test_pod_mode_ignores_a_launched_success_of_an_older_epoch(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=1)
    fake.add_pod("train-0")
    config = make_config(tmp_path, launched=True)
    config.dir.mkdir(parents=True)
    (config.dir / TRAINER_EXIT_FILE).write_text("0:0\n")
    a = Agent(config, fake)
    async with running(a) as task:
        fake.set_status(barrierEpoch=1)
        await until(a, lambda s: s.barrier_open)
        fake.set_status(epoch=2)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    assert a.state.last_exit is None
    assert ANNOTATION_EXIT not in fake.annotations("train-0")


@pytest.mark.parametrize("seen", ["event", "read"])
async def test_an_agent_stops_reading_a_deleted_job(tmp_path: pathlib.Path, seen: str) -> None:
    """Its pod is garbage once the job is gone: an agent that went on reading would cost the
    apiserver a list per worker every backoff period until the pod is collected."""
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        if seen == "read":
            fake.job = {}  # the deletion found by the read after the watch expired
            fake.compact()
            fake.break_watches(1)
        else:
            fake.delete_job()
        await polled(lambda: a.job_deleted)
        lists = fake.job_gets
        await asyncio.sleep(0.3)  # backoff 0.01-0.05 s: a dozen reads if it went on
        assert fake.job_gets == lists
        assert not task.done()  # idle until the kubelet stops it


async def test_pod_mode_serves_the_barrier_probe(tmp_path: pathlib.Path) -> None:
    from tests.unit.test_agent_http import fetch

    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    config = make_config(tmp_path)
    config = Config(**{**config.__dict__, "probe_port": 0, "probe_host": "127.0.0.1"})
    a = Agent(config, fake)
    async with running(a):
        port = await asyncio.wait_for(a.probe_port(), DEADLINE)
        assert (await fetch(port, "/healthz"))[0] == 200
        await until(a, at(Step.AT_BARRIER, 0))
        assert (await fetch(port, "/barrier"))[0] == 503
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        assert (await fetch(port, "/barrier"))[0] == 200


async def test_survives_broken_watches_410_and_failed_writes(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    fake.fail_patches = 3  # the apiserver is down while it arrives
    fake.fail_gets = 2
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 0))
        assert fake.annotations("train-0") == {ANNOTATION_EPOCH: "0"}
        opened, gets = fake.watches_opened, fake.job_gets
        fake.break_watches()  # resumed from its resourceVersion, no GET
        await fake.until(lambda: fake.watches_opened == opened + 1)
        assert fake.job_gets == gets
        fake.set_status(phase="Running")
        fake.compact()
        fake.break_watches()  # resumes from a compacted resourceVersion: 410, GET again
        await fake.until(lambda: fake.watches_opened == opened + 3)
        assert fake.job_gets == gets + 1
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        fake.set_status(epoch=1)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE


async def test_watches_a_job_unchanged_for_longer_than_the_watch_window(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    for rank in range(1, 4):
        fake.add_pod(f"train-{rank}")
        await fake.merge_patch(f"/pods/train-{rank}", arrival_patch(0))  # other writes...
    fake.compact()  # ...and the job's own resourceVersion has left the watch window
    a = Agent(make_config(tmp_path), fake)
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 0))
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.barrier_open)
        fake.set_status(epoch=1)
        assert await asyncio.wait_for(task, DEADLINE) == RESTART_EXIT_CODE
    assert fake.job_gets == 1


async def test_a_thousand_agents_in_one_process(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=4)
    agents = []
    for rank in range(1000):
        fake.add_pod(f"train-{rank}")
        agents.append(Agent(make_config(tmp_path, f"train-{rank}"), fake))
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(a.wait_for(at(Step.AT_BARRIER, 4)) for a in agents)), DEADLINE
        )
        fake.set_status(barrierEpoch=4)
        await asyncio.wait_for(
            asyncio.gather(*(a.wait_for(lambda s: s.barrier_open) for a in agents)), DEADLINE
        )
        fake.set_status(epoch=5)
        codes = await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)
    finally:
        for t in tasks:
            t.cancel()
    assert set(codes) == {RESTART_EXIT_CODE}
    assert len(fake.patches) == 1000


# Process mode (real subprocesses)


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


async def test_process_mode_reports_exits_and_restarts_at_the_new_epoch(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    # Fails at epoch 0, succeeds at 1; checks the epoch reaches it by env and by file, and
    # torchrun's rendezvous id changes with it.
    script = (
        '[ "$GANGJOB_EPOCH" = "$(cat "$GANGJOB_DIR/epoch")" ] || exit 9; '
        f'[ "$PET_RDZV_ID" = "{JOB}-epoch-$GANGJOB_EPOCH" ] || exit 8; '
        '[ "$GANGJOB_EPOCH" = 1 ] && exit 0; exit 3'
    )
    a = Agent(make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=sh(script))
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 0))
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH)
        assert fake.annotations("train-0") == {ANNOTATION_EPOCH: "0", ANNOTATION_EXIT: "0:3"}
        assert a.state.last_exit == (0, 3)
        fake.set_status(epoch=1)
        await until(a, at(Step.AT_BARRIER, 1))
        assert fake.annotations("train-0")[ANNOTATION_EPOCH] == "1"
        fake.set_status(barrierEpoch=1)
        # A success keeps the worker in the gang until the job has succeeded.
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH and s.last_exit == (1, 0))
        assert not task.done()
        fake.set_status(phase="Succeeded")
        assert await asyncio.wait_for(task, DEADLINE) == 0
    assert fake.annotations("train-0") == {ANNOTATION_EPOCH: "1", ANNOTATION_EXIT: "1:0"}
    assert a.state.trainer_runs == 2
    # Each write is one patch: arrive 0, exit 0:3, arrive 1, exit 1:0.
    assert len(fake.patches) == 4


async def test_process_mode_kills_the_trainer_on_a_bump_and_restarts_it(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0, phase="Running")
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=sh("sleep 30"))
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        first = await until(a, at(Step.RUNNING, 0))
        assert first.trainer_pid is not None
        fake.set_status(epoch=1)
        await until(a, at(Step.AT_BARRIER, 1))
        with pytest.raises(ProcessLookupError):
            os.kill(first.trainer_pid, 0)  # the whole group is gone, reaped
        assert ANNOTATION_EXIT not in fake.annotations("train-0")  # a kill is not a failure
        fake.set_status(barrierEpoch=1)
        second = await until(a, at(Step.RUNNING, 1))
        assert second.trainer_runs == 2
        a.stop()  # SIGTERM forwarded to the trainer's group
        assert await asyncio.wait_for(task, DEADLINE) == 128 + 15


async def test_process_mode_sigkills_a_trainer_that_ignores_sigterm(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    config = make_config(tmp_path, kill_grace_seconds=0.2)
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    # `trap '' TERM` ignores SIGTERM in the shell and in the sleep it starts; the FIFO says when
    # the trap is set (a SIGTERM before it would end the shell at once).
    script = "trap '' TERM; echo ready > \"$READY\"; sleep 30; exit 0"
    env = {**os.environ, "READY": str(ready)}
    a = Agent(config, fake, mode=AgentPlacement.WRAPPER, command=sh(script), env=env)
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        try:
            said = await asyncio.wait_for(asyncio.to_thread(ready.read_text), DEADLINE)
        finally:
            # If the trainer never wrote, unblock the reading thread (EOF), or it hangs the run.
            with contextlib.suppress(OSError):
                os.close(os.open(ready, os.O_WRONLY | os.O_NONBLOCK))
        assert said == "ready\n"
        a.stop()
        assert await asyncio.wait_for(task, DEADLINE) == 128 + 9


async def test_process_mode_exits_with_the_code_when_the_job_failed(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=sh("exit 3"))
    async with running(a) as task:
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.step == Step.WAITING_FOR_EPOCH)
        fake.set_status(phase="Failed")
        assert await asyncio.wait_for(task, DEADLINE) == 3


async def test_process_mode_stop_before_the_barrier(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=["true"])
    async with running(a) as task:
        await until(a, at(Step.AT_BARRIER, 0))
        a.stop()
        assert await asyncio.wait_for(task, DEADLINE) == STOPPED_EXIT_CODE


async def test_process_mode_missing_command_counts_as_exit_127(tmp_path: pathlib.Path) -> None:
    fake = FakeApi(epoch=0)
    fake.add_pod("train-0")
    a = Agent(
        make_config(tmp_path), fake, mode=AgentPlacement.WRAPPER, command=["/nonexistent/trainer"]
    )
    async with running(a):
        fake.set_status(barrierEpoch=0)
        await until(a, lambda s: s.last_exit == (0, 127))


def test_process_mode_needs_a_command(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="command"):
        Agent(make_config(tmp_path), FakeApi(), mode=AgentPlacement.WRAPPER)
