"""A trainer's progress from the helper, through a real `Process`-mode agent, to the controller's
real progress endpoint and its book, with the agent's token checked by a real TokenReview on the
sim cluster's apiserver; the trainer then hangs, and its stall reaches the book once, with its
stacks collected by the agent. The test plays the rest of the controller: the GangJob's state
the endpoint streams is a dict it changes."""

from __future__ import annotations

import asyncio
import pathlib
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from agent.agent import Agent, Step
from agent.apiclient import HttpClient
from agent.config import Config
from api.builders import gangjob
from api.constants import ARRIVAL_AUDIENCE, LABEL_NAME, STACKS_FILE, AgentPlacement
from controller.arrivals.auth import TokenAuthenticator
from controller.arrivals.book import ArrivalBook, ProgressReport
from controller.arrivals.server import arrivals_app
from controller.k8s import GANGJOBS, PODS, TOKENREVIEWS, JsonDict, Kube
from localcluster.cluster import Cluster
from localcluster.procs import free_port
from tests.integration.test_agent import admin_tls, gangjob_crd
from tests.integration.test_arrival_hostile import SA, SERVICE_ACCOUNTS, token

pytestmark = pytest.mark.integration

__all__ = ["admin_tls", "gangjob_crd"]  # fixtures, shared

JOB = "train"
POD = f"{JOB}-0"
DEADLINE = 60.0

TRAINER = """\
import os, time
import gangjob_progress

for i in range(1, 6):
    gangjob_progress.step(i, compute=0.01, checkpoint=i - i % 2)
with open(os.environ["GANGJOB_PROGRESS"], "a") as f:
    f.write("loss=0.3\\n")  # no step: malformed
time.sleep(120)  # hung: alive, and no step any more
"""


@dataclass
class Controller:
    """The endpoint as the manager serves it, with the real TokenReview."""

    book: ArrivalBook
    url: str
    job: JsonDict
    stalls: list[str] = field(default_factory=list)

    def set_status(self, namespace: str, **status: object) -> None:
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.job["status"].update(status)
        self.book.job_changed(f"{namespace}/{JOB}")


@pytest.fixture
async def worker(sim_kube: Kube, namespace: str, gangjob_crd: None) -> JsonDict:
    """The GangJob and its one worker pod, run by KWOK under the ServiceAccount `worker`."""
    template = {"spec": {"containers": [{"name": "trainer", "image": "registry.invalid/t:1"}]}}
    await sim_kube.create(GANGJOBS, gangjob(JOB, 1, template=template), namespace)
    await sim_kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": SA}}, namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "labels": {LABEL_NAME: JOB, "gangjob.io/rank": "0"}},
        "spec": {"serviceAccountName": SA, **template["spec"]},
    }
    created: JsonDict = await sim_kube.create(PODS, pod, namespace)
    return created


@pytest.fixture
async def controller(sim_kube: Kube, namespace: str, worker: JsonDict) -> AsyncIterator[Controller]:
    book = ArrivalBook()
    job = {"metadata": {"name": JOB, "resourceVersion": "1"},
           "status": {"epoch": 0, "barrierEpoch": None, "phase": "Running"}}  # fmt: skip
    auth = TokenAuthenticator(lambda body: sim_kube.create(TOKENREVIEWS, body))
    port = free_port()
    ctl = Controller(book, f"http://127.0.0.1:{port}", job)
    app = arrivals_app(
        book,
        auth.authenticate,
        lambda key: job if key == f"{namespace}/{JOB}" else None,
        pod_job=lambda ns, name: JOB if (ns, name) == (namespace, POD) else None,
        accepting=lambda: True,
        on_report=lambda key: None,
        on_news=ctl.stalls.append,
    )
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield ctl
    finally:
        await runner.cleanup()


async def until_progress(book: ArrivalBook, namespace: str, stalled: bool) -> ProgressReport:
    """The worker's progress once the book holds a stalled (or any) one; polled, as the book
    signals nothing."""
    async with asyncio.timeout(DEADLINE):
        while True:
            held = book.progress(namespace, POD)
            if held is not None and (held.stalled_since is not None or not stalled):
                return held
            await asyncio.sleep(0.05)


async def test_progress_reaches_the_book_and_a_hang_is_reported_once(
    sim_cluster: Cluster,
    sim_kube: Kube,
    namespace: str,
    admin_tls: ssl.SSLContext,
    worker: JsonDict,
    controller: Controller,
    tmp_path: pathlib.Path,
) -> None:
    ctl = controller
    token_file = tmp_path / "arrival-token"
    token_file.write_text(token(sim_cluster, namespace, worker, ARRIVAL_AUDIENCE))
    config = Config(
        job_name=JOB,
        pod_name=POD,
        namespace=namespace,
        dir=tmp_path / "gangjob",
        probe_port=None,
        kill_grace_seconds=5.0,
        pod_uid=worker["metadata"]["uid"],
        arrival_url=ctl.url,
        arrival_token_file=token_file,
        progress_poll_seconds=0.1,
        progress_summary_seconds=0.5,
        hang_seconds=2.0,
    )
    async with (
        HttpClient(sim_cluster.server, ssl_context=admin_tls) as api,
        HttpClient(ctl.url) as to_controller,
    ):
        agent = Agent(
            config,
            api,
            mode=AgentPlacement.WRAPPER,
            command=[sys.executable, "-c", TRAINER],
            arrival_client=to_controller,
        )
        task = asyncio.create_task(agent.run())
        try:
            async with asyncio.timeout(DEADLINE):
                await agent.wait_for(lambda s: s.step == Step.AT_BARRIER)
            ctl.set_status(namespace, barrierEpoch=0)
            held = await until_progress(ctl.book, namespace, stalled=True)
        finally:
            agent.stop()
            await asyncio.wait_for(task, DEADLINE)

    assert (held.uid, held.epoch) == (worker["metadata"]["uid"], 0)
    assert (held.step, held.checkpoint, held.compute_seconds) == (5, 4, 0.01)
    assert held.malformed == 1
    assert held.trainer_state == "S"  # asleep: alive, and no step any more
    assert held.trainer_cpu_seconds is not None
    assert held.stalled_since is not None
    assert held.stalled_since <= held.received_at
    # The epoch's first summary queued a pass, and the stall's one message another.
    assert ctl.stalls == [f"{namespace}/{JOB}"] * 2
    assert agent.progress is not None
    assert agent.progress.stalls == 1
    # The agent asked the hung trainer for its stacks before stopping it.
    stacks = (config.dir / STACKS_FILE).read_text()
    assert "(most recent call first)" in stacks
    assert 'File "<string>", line 8 in <module>' in stacks
