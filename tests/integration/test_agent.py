"""In-process agents against the real apiserver of the local `sim` cluster, with the test playing
the controller by hand: it creates a GangJob and its pods (KWOK runs them), raises
`status.epoch`, opens barriers through `status.barrierEpoch`, and checks what the agents write
on their pods, serve on their probes and return."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest
import yaml

from agent.agent import Agent, AgentState, Step
from agent.apiclient import HttpClient, ssl_context
from agent.config import Config
from api.builders import gangjob
from api.constants import ANNOTATION_EPOCH, ANNOTATION_EXIT, RESTART_EXIT_CODE, AgentPlacement
from controller.k8s import CRDS, GANGJOBS, PODS, AlreadyExists, JsonDict, Kube
from localcluster.addons import crd_established
from localcluster.cluster import Cluster
from tests.unit.test_agent_http import fetch
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
DEADLINE = 30.0
JOB = "train"


@pytest.fixture(scope="module")
async def gangjob_crd(sim_kubeconfig: pathlib.Path) -> None:
    """The committed GangJob CRD, installed if the cluster lacks it, and Established."""
    crd = yaml.safe_load((REPO / "manifests/crd/gangjob.io_gangjobs.yaml").read_text())
    name = crd["metadata"]["name"]
    async with await Kube.from_kubeconfig(sim_kubeconfig, request_timeout=10) as kube:
        with contextlib.suppress(AlreadyExists):
            await kube.create(CRDS, crd)

        await wait_for(kube, CRDS, name, None, crd_established, timeout=60, what="Established")


@pytest.fixture(scope="module")
def admin_tls(sim_cluster: Cluster) -> ssl.SSLContext:
    """One TLS context for every agent (loading certificates is the costly part)."""
    pki = sim_cluster.pki
    return ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")


async def create_gang(kube: Kube, namespace: str, replicas: int) -> None:
    template = {"spec": {"containers": [{"name": "trainer", "image": "registry.invalid/t:1"}]}}
    await kube.create(GANGJOBS, gangjob(JOB, replicas, template=template), namespace)
    for rank in range(replicas):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{JOB}-{rank}",
                "labels": {"gangjob.io/name": JOB, "gangjob.io/rank": str(rank)},
            },
            "spec": template["spec"],
        }
        await kube.create(PODS, pod, namespace)
    await asyncio.gather(
        *(
            wait_for(kube, PODS, f"{JOB}-{rank}", namespace, is_running, what="Running")
            for rank in range(replicas)
        )
    )


def is_running(pod: JsonDict) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Running")


async def set_status(kube: Kube, namespace: str, **status: Any) -> None:
    await kube.patch_status(GANGJOBS, JOB, {"status": status}, namespace)


def annotated(expected: Mapping[str, str]) -> Callable[[JsonDict], bool]:
    def check(pod: JsonDict) -> bool:
        annotations = pod["metadata"].get("annotations") or {}
        return all(annotations.get(k) == v for k, v in expected.items())

    return check


async def all_annotated(
    kube: Kube, namespace: str, ranks: Iterable[int], want: Mapping[str, str]
) -> None:
    """Waits (on watches) until every pod of `ranks` carries the annotations `want`."""
    await asyncio.gather(
        *(
            wait_for(kube, PODS, f"{JOB}-{r}", namespace, annotated(want), DEADLINE, str(want))
            for r in ranks
        )
    )


async def until(agents: Sequence[Agent], predicate: Callable[[AgentState], bool]) -> None:
    await asyncio.wait_for(asyncio.gather(*(a.wait_for(predicate) for a in agents)), DEADLINE)


def words(path: pathlib.Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def lines_of(path: pathlib.Path, count: int) -> list[str]:
    """The file's lines once it has at least `count` (or what it has after DEADLINE)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        lines = words(path)
        if len(lines) >= count or loop.time() > deadline:
            return lines
        await asyncio.sleep(0.05)


def at(step: Step, epoch: int) -> Callable[[AgentState], bool]:
    return lambda s: s.step == step and s.epoch == epoch


class Fleet:
    """Agents of one gang running in this process, each with its own client, as in pods."""

    def __init__(self, server: str, tls: ssl.SSLContext, namespace: str, root: pathlib.Path):
        self.server = server
        self.tls = tls
        self.namespace = namespace
        self.root = root
        self.tasks: dict[Agent, asyncio.Task[int]] = {}
        self.clients: list[HttpClient] = []

    def start(
        self,
        rank: int,
        mode: AgentPlacement = AgentPlacement.SIDECAR,
        command: Sequence[str] = (),
        client: HttpClient | None = None,
        **tuning: Any,
    ) -> Agent:
        client = client or HttpClient(self.server, ssl_context=self.tls)
        self.clients.append(client)
        config = Config(
            job_name=JOB,
            pod_name=f"{JOB}-{rank}",
            namespace=self.namespace,
            dir=self.root / str(rank),
            probe_port=0 if mode is AgentPlacement.SIDECAR else None,
            probe_host="127.0.0.1",
            kill_grace_seconds=5.0,
            **tuning,
        )
        agent = Agent(config, client, mode=mode, command=command)
        self.tasks[agent] = asyncio.create_task(agent.run())
        return agent

    async def result(self, agent: Agent) -> int:
        return await asyncio.wait_for(self.tasks[agent], DEADLINE)

    async def close(self) -> None:
        for agent in self.tasks:
            agent.stop()
        await asyncio.wait_for(
            asyncio.gather(*self.tasks.values(), return_exceptions=True), DEADLINE
        )
        for client in self.clients:
            await client.close()


@pytest.fixture
async def fleet(
    sim_cluster: Cluster,
    admin_tls: ssl.SSLContext,
    namespace: str,
    gangjob_crd: None,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Fleet]:
    agents = Fleet(sim_cluster.server, admin_tls, namespace, tmp_path)
    try:
        yield agents
    finally:
        await agents.close()


async def test_pod_mode_gang_arrives_opens_and_restarts(
    sim_kube: Kube, namespace: str, fleet: Fleet
) -> None:
    await create_gang(sim_kube, namespace, 3)
    await set_status(sim_kube, namespace, epoch=1, phase="Running")
    agents = [fleet.start(rank) for rank in range(3)]

    await all_annotated(sim_kube, namespace, range(3), {ANNOTATION_EPOCH: "1"})
    await until(agents, at(Step.AT_BARRIER, 1))
    ports = [await a.probe_port() for a in agents]
    for port in ports:
        assert (await fetch(port, "/barrier"))[0] == 503
        assert (await fetch(port, "/healthz"))[0] == 200

    await set_status(sim_kube, namespace, barrierEpoch=1)
    await until(agents, lambda s: s.barrier_open)
    for rank, port in enumerate(ports):
        assert (await fetch(port, "/barrier"))[0] == 200
        assert (fleet.root / str(rank) / "epoch").read_text() == "1\n"

    # The gang restarts: every Pod-mode agent exits with the code of its RestartAllContainers rule.
    await set_status(sim_kube, namespace, epoch=2, phase="Restarting")
    assert [await fleet.result(a) for a in agents] == [RESTART_EXIT_CODE] * 3

    # The kubelet restarts each pod in place: new agents, same pods, join epoch 2.
    agents = [fleet.start(rank) for rank in range(3)]
    await all_annotated(sim_kube, namespace, range(3), {ANNOTATION_EPOCH: "2"})
    await set_status(sim_kube, namespace, barrierEpoch=2, phase="Running")
    await until(agents, lambda s: s.barrier_open and s.epoch == 2)
    assert (fleet.root / "0" / "epoch").read_text() == "2\n"

    # Rank 1's trainer crashes at 2 and its pod restarts: its new agent must not rejoin 2.
    agents[1].stop()
    assert await fleet.result(agents[1]) == 0
    again = fleet.start(1)
    await until([again], lambda s: s.step == Step.WAITING_FOR_EPOCH)
    await set_status(sim_kube, namespace, epoch=3, phase="Restarting")
    await all_annotated(sim_kube, namespace, [1], {ANNOTATION_EPOCH: "3"})
    assert await fleet.result(agents[0]) == RESTART_EXIT_CODE
    assert await fleet.result(agents[2]) == RESTART_EXIT_CODE


async def test_process_mode_restarts_the_trainer_in_place_and_reports_exits(
    sim_kube: Kube, namespace: str, fleet: Fleet
) -> None:
    await create_gang(sim_kube, namespace, 2)
    # Each run records torchrun's rendezvous id as the agent gave it.
    ids = fleet.root / "rdzv-ids"
    sleeper = fleet.start(
        0, AgentPlacement.WRAPPER, ["sh", "-c", f'echo "$PET_RDZV_ID" >> {ids}; sleep 30']
    )
    # Fails with 3 at epoch 0, then trains at the next epoch.
    flaky = fleet.start(
        1, AgentPlacement.WRAPPER, ["sh", "-c", '[ "$GANGJOB_EPOCH" = 0 ] && exit 3; sleep 30']
    )
    await all_annotated(sim_kube, namespace, range(2), {ANNOTATION_EPOCH: "0"})

    await set_status(sim_kube, namespace, barrierEpoch=0, phase="Running")
    first = await asyncio.wait_for(sleeper.wait_for(at(Step.RUNNING, 0)), DEADLINE)
    await all_annotated(sim_kube, namespace, [1], {ANNOTATION_EPOCH: "0", ANNOTATION_EXIT: "0:3"})
    await until([flaky], lambda s: s.step == Step.WAITING_FOR_EPOCH)

    # The controller classifies the exit and restarts the gang: the sleeper's trainer is killed
    # in place (the agent stays up), both arrive at 1 and start again behind the barrier.
    await set_status(sim_kube, namespace, epoch=1, phase="Restarting")
    await all_annotated(sim_kube, namespace, range(2), {ANNOTATION_EPOCH: "1"})
    await until([sleeper, flaky], at(Step.AT_BARRIER, 1))
    assert first.trainer_pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(first.trainer_pid, 0)
    await set_status(sim_kube, namespace, barrierEpoch=1, phase="Running")
    await until([sleeper, flaky], at(Step.RUNNING, 1))
    assert sleeper.state.trainer_runs == 2
    assert flaky.state.trainer_runs == 2
    # A new epoch, a new rendezvous: a run of epoch 0 could never join the group of epoch 1.
    # (The trainer's shell writes its line after the agent has started it: wait for it.)
    assert await lines_of(ids, 2) == [f"{JOB}-epoch-0", f"{JOB}-epoch-1"]

    # Asked to stop (the pod is deleted): SIGTERM goes to each trainer, whose code is returned.
    sleeper.stop()
    flaky.stop()
    assert await fleet.result(sleeper) == 128 + 15
    assert await fleet.result(flaky) == 128 + 15


class CountingClient(HttpClient):
    """Counts the watches it opened, and lets a test wait for a count."""

    def __init__(self, server: str, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.watches = 0
        self._opened = asyncio.Event()

    def watch(
        self, path: str, params: Mapping[str, str], *, inactivity_timeout: float = 90.0
    ) -> AsyncGenerator[JsonDict, None]:
        self.watches += 1
        opened, self._opened = self._opened, asyncio.Event()
        opened.set()
        return super().watch(path, params, inactivity_timeout=inactivity_timeout)

    async def until_watches(self, n: int) -> None:
        async with asyncio.timeout(DEADLINE):
            while self.watches < n:
                await self._opened.wait()


async def test_watch_resumes_across_server_timeouts(
    sim_kube: Kube, namespace: str, fleet: Fleet
) -> None:
    await create_gang(sim_kube, namespace, 1)
    client = CountingClient(fleet.server, ssl_context=fleet.tls)
    # The apiserver ends each watch after 1-2 s; the agent resumes from the last
    # resourceVersion each time, and misses nothing written in between.
    agent = fleet.start(0, client=client, watch_timeout_seconds=1)
    await until([agent], at(Step.AT_BARRIER, 0))
    await set_status(sim_kube, namespace, phase="Running")
    await client.until_watches(3)
    await set_status(sim_kube, namespace, barrierEpoch=0)
    await until([agent], lambda s: s.barrier_open)
    await client.until_watches(client.watches + 2)
    await set_status(sim_kube, namespace, epoch=1)
    assert await fleet.result(agent) == RESTART_EXIT_CODE
