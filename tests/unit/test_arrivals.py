"""Direct arrival without a cluster: the report's rules (parsing, which report wins, how it
joins a pod's view, the token review's answer), `plan`'s reading of an open barrier, and the
real endpoint (`controller.arrivals.make_app`) served in-process to real agents whose
apiserver is the in-memory `FakeApi`: they arrive, learn of the barrier from the answer, need
no watch after a restart in place, and fall back to the annotation when the endpoint is gone
or refuses them."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import pathlib
import time
import types
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from agent.agent import Agent, Step
from agent.apiclient import ApiError, HttpClient, TransportError
from agent.direct import DirectArrival
from agent.protocol import JobState
from agent.watch import newest
from api.constants import ANNOTATION_EPOCH, RESTART_EXIT_CODE
from api.v1alpha1 import GangJobStatus
from controller.arrivals import auth as arrival_auth
from controller.arrivals.auth import Identity, Unauthorized, identity_of
from controller.arrivals.book import ArrivalBook, Report, with_report
from controller.arrivals.server import BadReport, arrivals_app, parse_report
from controller.policy.gang import arrived_by_barrier
from controller.policy.views import PodView
from controller.runtime.httpserver import HttpServer
from localcluster.procs import free_port
from tests.unit.test_agent import (
    DEADLINE,
    JOB,
    NS,
    FakeApi,
    make_config,
    polled,
    running,
    until,
)

# -- the rules ---------------------------------------------------------------------------------

GOOD = {"namespace": NS, "job": JOB, "pod": "train-0", "uid": "u0", "epoch": 3, "exit": None}


def test_parse_report() -> None:
    posted = parse_report(GOOD)
    assert (posted.namespace, posted.job, posted.pod) == (NS, JOB, "train-0")
    assert posted.report == Report("u0", 3, None)
    # -1: the pod restarted under the agent, code unknown (as the annotation's "<E>:-1").
    assert parse_report({**GOOD, "exit": [3, -1]}).report.exit == (3, None)
    assert parse_report({**GOOD, "exit": [2, 137]}).report.exit == (2, 137)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({**GOOD, "pod": ""}, "pod:"),
        ({**GOOD, "uid": None}, "uid:"),
        ({**GOOD, "epoch": -1}, "epoch:"),
        ({**GOOD, "epoch": True}, "epoch:"),
        ({**GOOD, "exit": [1]}, "exit:"),
        ({**GOOD, "exit": [1, "x"]}, "exit[1]:"),
        ({**GOOD, "exit": [-2, 1]}, "exit[0]:"),
    ],
)
def test_a_bad_report_names_the_field(body: Any, field: str) -> None:
    with pytest.raises(BadReport, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_report(body)


def test_the_later_report_of_a_pod_wins() -> None:
    book = ArrivalBook()
    assert book.record(NS, "p", Report("u", 2))
    assert not book.record(NS, "p", Report("u", 1))  # a stale resend
    assert book.record(NS, "p", Report("u", 2, (2, None)))  # failed at 2: the exit joins
    assert not book.record(NS, "p", Report("u", 2))
    assert book.get(NS, "p") == Report("u", 2, (2, None))
    assert book.record(NS, "p", Report("new-uid", 0))  # a new pod of the name starts over
    book.forget(NS, "p", "u")  # the old pod's deletion leaves the new one's report
    assert book.get(NS, "p") == Report("new-uid", 0)
    book.forget(NS, "p", "new-uid")
    assert book.get(NS, "p") is None


def view(**kw: Any) -> PodView:
    base = PodView.from_pod(
        {"metadata": {"name": "train-0", "namespace": NS, "uid": "u0"}, "status": {}}
    )
    return dataclasses.replace(base, **kw)


def test_a_job_change_reaches_every_listener_and_never_raises_into_the_caller() -> None:
    # job_changed is called from the job cache's event handler: a failing listener (the
    # endpoint's streams) must not break the cache's watch.
    book = ArrivalBook()
    told: list[tuple[str, bool]] = []

    def failing(key: str, closing: bool) -> None:
        raise RuntimeError("a stream's transport broke")

    book.subscribe(failing)
    book.subscribe(lambda key, closing: told.append((key, closing)))
    book.job_changed(f"{NS}/{JOB}")
    book.close()
    assert told == [(f"{NS}/{JOB}", False), ("", True)]
    assert book.closing


def test_a_report_joins_the_pods_view() -> None:
    v = view(arrived_epoch=1, reported_exit=None)
    assert with_report(v, None) is v
    assert with_report(v, Report("other-uid", 5)) is v  # another pod's, of the same name
    assert with_report(v, Report("u0", 3)).arrived_epoch == 3
    assert with_report(view(arrived_epoch=4), Report("u0", 3)).arrived_epoch == 4
    joined = with_report(v, Report("u0", 3, (3, 1)))
    assert (joined.arrived_epoch, joined.reported_exit) == (3, (3, 1))
    older = with_report(view(reported_exit=(4, None)), Report("u0", 3, (3, 1)))
    assert older.reported_exit == (4, None)
    # The report overtook the kubelet's status write: the restart it came back from is still in
    # the cache, and must not read as a failure at the epoch it arrived at.
    restarting = view(arrived_epoch=1, conditions={"AllContainersRestarting": ("True", None)})
    assert with_report(restarting, Report("u0", 3)) is restarting


def review(**status: Any) -> dict[str, Any]:
    return {"status": status}


BOUND = review(
    authenticated=True,
    audiences=["gangjob.io/arrival"],
    user={
        "username": f"system:serviceaccount:{NS}:gangjob-worker",
        "extra": {
            "authentication.kubernetes.io/pod-name": ["train-0"],
            "authentication.kubernetes.io/pod-uid": ["u0"],
        },
    },
)


def test_identity_of_a_token_review() -> None:
    assert identity_of(BOUND, "gangjob.io/arrival") == Identity(NS, "train-0", "u0")
    with pytest.raises(Unauthorized, match="expired"):
        identity_of(review(authenticated=False, error="token expired"), "gangjob.io/arrival")
    with pytest.raises(Unauthorized, match="audience"):
        identity_of(BOUND, "something-else")
    unbound = review(authenticated=True, user={"username": "system:serviceaccount:ns:x"})
    with pytest.raises(Unauthorized, match="bound to a pod"):
        identity_of(unbound, "gangjob.io/arrival")


async def test_token_reviews_are_cached() -> None:
    calls: list[dict[str, Any]] = []

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body)
        return BOUND

    auth = arrival_auth.TokenAuthenticator(post)
    for _ in range(3):
        assert await auth.authenticate("t") == Identity(NS, "train-0", "u0")
    assert len(calls) == 1
    assert calls[0]["spec"] == {"token": "t", "audiences": ["gangjob.io/arrival"]}


def jwt(**claims: Any) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"e30.{body}.sig"


async def test_a_verdict_is_kept_no_longer_than_its_token_lives() -> None:
    calls = 0

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return BOUND

    auth = arrival_auth.TokenAuthenticator(post)
    live, dead = jwt(exp=time.time() + 3000), jwt(exp=time.time() - 1)
    for token in (live, live, dead, dead):
        await auth.authenticate(token)
    assert calls == 3  # the live one once, the expired one every time
    assert arrival_auth.token_expiry(jwt(exp=123)) == 123
    assert arrival_auth.token_expiry("not-a-jwt") is None
    assert arrival_auth.token_expiry(jwt(sub="x")) is None


T0 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("barrier", "created", "arrived", "want"),
    [
        (3, T0 - timedelta(seconds=5), None, 3),  # older than the open barrier: arrived
        (3, T0 - timedelta(seconds=5), 1, 3),
        (3, T0 + timedelta(seconds=2), None, None),  # created since (backoff): not yet
        (3, T0, None, None),  # the barrier's own second: left to its own report
        (2, T0 - timedelta(seconds=5), None, None),  # barrier of an older epoch
    ],
)
def test_an_open_barrier_says_who_arrived(
    barrier: int, created: datetime, arrived: int | None, want: int | None
) -> None:
    status = GangJobStatus(epoch=3, barrier_epoch=barrier, barrier_opened_at=T0)
    (got,) = arrived_by_barrier([view(creation_timestamp=created, arrived_epoch=arrived)], status)
    assert got.arrived_epoch == (want if want is not None else arrived)


def test_newest_of_two_views_of_a_job() -> None:
    a = JobState(epoch=3, barrier_epoch=2, phase="Restarting", resource_version="9")
    b = JobState(epoch=2, barrier_epoch=2, phase="Running")
    assert newest(a, b) == JobState(3, 2, "Restarting", "9")
    assert newest(b, a) == JobState(3, 2, "Restarting", "9")
    done = JobState(epoch=3, barrier_epoch=3, phase="Succeeded")
    assert newest(done, a).phase == "Succeeded"
    assert newest(a, done).phase == "Succeeded"


# -- the endpoint, with real agents ------------------------------------------------------------


@dataclasses.dataclass
class Controller:
    """The endpoint as the manager serves it, over a GangJob held in a dict."""

    fake: FakeApi
    book: ArrivalBook
    url: str
    reports: list[str]
    refuse: bool = False
    pod_jobs: dict[str, str] = dataclasses.field(default_factory=dict)
    """The GangJob of a pod in the controller's cache, where not JOB (pods of `fake`)."""
    stalls: list[str] = dataclasses.field(default_factory=list)
    """The jobs it was told a worker's stall began or ended in (progress summaries)."""
    fast: bool = True
    """Served with the fast path (else by aiohttp alone)."""
    _reported: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def on_report(self, key: str) -> None:
        self.reports.append(key)
        reported, self._reported = self._reported, asyncio.Event()
        reported.set()

    async def reported(self, count: int) -> None:
        async with asyncio.timeout(DEADLINE):
            while len(self.reports) < count:
                await self._reported.wait()

    def set_status(self, **status: Any) -> None:
        self.fake.set_status(**status)  # the apiserver's copy: the agents' watches
        self.book.job_changed(f"{NS}/{JOB}")  # the cache's: the streams

    def pod_job(self, namespace: str, pod: str) -> str | None:
        if namespace != NS:
            return None
        return self.pod_jobs.get(pod, JOB if pod in self.fake.pods else None)

    def arrived(self, pod: str) -> int | None:
        held = self.book.get(NS, pod)
        return held.epoch if held else None


@pytest.fixture(params=["fast", "aiohttp"])
async def controller(request: pytest.FixtureRequest) -> AsyncIterator[Controller]:
    """The endpoint served as the controller serves it (`HttpServer`: the fast path, the token's
    verdict cached), and by aiohttp alone (every request through its handlers)."""
    fake = FakeApi(epoch=0)
    book = ArrivalBook()
    port = free_port()
    ctl = Controller(fake, book, f"http://127.0.0.1:{port}", [], fast=request.param == "fast")

    async def authenticate(token: str) -> Identity:
        if ctl.refuse:
            raise Unauthorized("token expired")
        pod, uid = token.split("/")
        return Identity(NS, pod, uid)

    def cached(token: str) -> Identity | None:
        # a verdict is cached once reviewed; one refused is not (the review answers)
        return None if ctl.refuse else Identity(NS, *token.split("/"))

    app = arrivals_app(
        book,
        authenticate,
        lambda key: (fake.job or None) if key == f"{NS}/{JOB}" else None,
        pod_job=ctl.pod_job,
        accepting=lambda: True,
        on_report=ctl.on_report,
        on_news=ctl.stalls.append,
        lookup=None if request.param == "aiohttp" else cached,
    )
    async with HttpServer(app, "127.0.0.1", port):
        yield ctl


def direct_agent(
    ctl: Controller, tmp_path: pathlib.Path, client: HttpClient, pod: str = "train-0", **kw: Any
) -> Agent:
    uid = f"uid-{pod}"
    config = make_config(
        tmp_path,
        pod,
        pod_uid=uid,
        arrival_url=ctl.url,
        arrival_token_file=tmp_path / f"{pod}.token",
        **kw,
    )
    config.arrival_token_file.write_text(f"{pod}/{uid}")
    ctl.fake.add_pod(pod)
    ctl.fake.pods[pod]["metadata"]["uid"] = uid
    return Agent(config, ctl.fake, arrival_client=client)


async def test_an_agent_sends_each_report_behind_the_last_ones_stream_on_its_connection(
    controller: Controller, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Process gang's agent outlives every restart: each report goes on the connection of
    # the last one's stream (which it supersedes), so that the agent holds one connection
    # for its life, and a restart of N workers opens no connection (nor TLS handshake), however
    # long after the last. aiohttp's streams take nothing behind them: there the agent keeps
    # two connections in turn, the stream's and a kept one.
    ctl = controller
    opened: list[object] = []
    connect = asyncio.open_connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return await connect(*args, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", counted)
    config = make_config(tmp_path, "train-0", pod_uid="uid-train-0", arrival_url=ctl.url,
                         arrival_token_file=tmp_path / "token")  # fmt: skip
    config.arrival_token_file.write_text("train-0/uid-train-0")
    ctl.fake.add_pod("train-0")
    states: list[JobState] = []

    async def no_fallback(epoch: int, exit: tuple[int, int] | None = None) -> None:
        raise AssertionError("the endpoint took every report")

    fallback = types.SimpleNamespace(arrive=no_fallback)
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    async with HttpClient(ctl.url) as client:
        arrival = DirectArrival(client, config, fallback, states.append, lambda: None, log)
        try:
            for epoch in range(5):
                ctl.set_status(epoch=epoch)
                await arrival.arrive(epoch)
                assert ctl.arrived("train-0") == epoch  # taken before arrive returned
                await polled(lambda: not arrival._ending)  # the superseded stream read out
            ctl.set_status(epoch=4, barrierEpoch=4)
            await polled(lambda: bool(states) and states[-1].barrier_epoch == 4)
            assert len(opened) == (1 if ctl.fast else 2), opened
            assert ctl.reports == [f"{NS}/{JOB}"] * 5
        finally:
            await arrival.close()


async def test_agents_arrive_at_the_controller_and_learn_the_barrier_from_its_answer(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    ctl = controller
    async with HttpClient(ctl.url) as client:
        agents = [direct_agent(ctl, tmp_path, client, f"train-{r}") for r in range(3)]
        tasks = [asyncio.create_task(a.run()) for a in agents]
        for a in agents:
            await until(a, lambda s: s.step == Step.AT_BARRIER and s.epoch == 0)
        assert [ctl.arrived(f"train-{r}") for r in range(3)] == [0, 0, 0]
        assert ctl.reports == [f"{NS}/{JOB}"] * 3  # each queued the job for a pass
        assert ctl.fake.patches == []  # no pod written
        # New pods each read the job once and watch nothing: the answer streams the state.
        assert (ctl.fake.watches_opened, ctl.fake.job_gets) == (0, 3)
        ctl.set_status(barrierEpoch=0)
        for a in agents:
            await until(a, lambda s: s.barrier_open)
        ctl.set_status(epoch=1)  # the gang moves on: Pod-mode agents exit to restart the pod
        codes = await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)
        assert codes == [RESTART_EXIT_CODE] * 3

        # Restarted in place: the state file says where each stands; no read, no watch.
        opened, gets = ctl.fake.watches_opened, ctl.fake.job_gets
        again = [direct_agent(ctl, tmp_path, client, f"train-{r}") for r in range(3)]
        async with running(again[0]), running(again[1]), running(again[2]):
            for a in again:
                await until(a, lambda s: s.step == Step.AT_BARRIER and s.epoch == 1)
            assert [ctl.arrived(f"train-{r}") for r in range(3)] == [1, 1, 1]
            ctl.set_status(barrierEpoch=1)
            for a in again:
                await until(a, lambda s: s.barrier_open and s.epoch == 1)
            assert (ctl.fake.watches_opened, ctl.fake.job_gets) == (opened, gets)
            assert ctl.fake.patches == []


async def test_a_worker_that_failed_at_its_epoch_says_so_and_waits_for_the_next(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    ctl = controller
    async with HttpClient(ctl.url) as client:
        first = direct_agent(ctl, tmp_path, client)
        async with running(first):
            await until(first, lambda s: s.step == Step.AT_BARRIER)
            ctl.set_status(barrierEpoch=0)
            await until(first, lambda s: s.barrier_open)
        # Its pod restarted under it at epoch 0 (the trainer crashed): no second arrival at 0.
        again = direct_agent(ctl, tmp_path, client)
        async with running(again):
            await until(again, lambda s: s.step == Step.WAITING_FOR_EPOCH)
            await ctl.reported(2)
            held = ctl.book.get(NS, "train-0")
            assert held is not None
            assert held.exit == (0, None)
            ctl.set_status(epoch=1)
            await until(again, lambda s: s.step == Step.AT_BARRIER and s.epoch == 1)
            assert ctl.arrived("train-0") == 1


async def test_without_the_controller_the_agent_arrives_by_annotation(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeApi(epoch=0)
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    ctl = Controller(fake, ArrivalBook(), url, [])
    async with HttpClient(url, connect_timeout=1.0) as client:
        a = direct_agent(ctl, tmp_path, client, direct_fallback_seconds=0.2)
        async with running(a):
            await until(a, lambda s: s.step == Step.AT_BARRIER)
            assert fake.annotations("train-0") == {ANNOTATION_EPOCH: "0"}
            fake.set_status(barrierEpoch=0)  # seen through its own watch, started for this
            await until(a, lambda s: s.barrier_open)
            assert fake.watches_opened >= 1


async def test_a_refused_token_falls_back_at_once(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    controller.refuse = True
    async with HttpClient(controller.url) as client:
        a = direct_agent(controller, tmp_path, client, direct_fallback_seconds=60)
        async with running(a):
            await until(a, lambda s: s.step == Step.AT_BARRIER)
            assert controller.fake.annotations("train-0") == {ANNOTATION_EPOCH: "0"}
            assert controller.book.get(NS, "train-0") is None


async def test_the_endpoint_refuses_a_report_for_another_pod(controller: Controller) -> None:
    async with HttpClient(controller.url) as client:
        body = {**GOOD, "pod": "train-1", "uid": "u1"}
        with pytest.raises(ApiError, match=r"403.*bound to pod ns/train-0"):
            async for _ in client.stream("POST", "/v1/arrivals", body, token="train-0/u0"):
                pass
        with pytest.raises(ApiError, match=r"400.*epoch"):
            async for _ in client.stream(
                "POST", "/v1/arrivals", {**GOOD, "epoch": "x"}, token="train-0/u0"
            ):
                pass
        with pytest.raises(ApiError, match=r"404.*not found"):
            async for _ in client.stream(
                "POST", "/v1/arrivals", {**GOOD, "job": "nope", "uid": "u0"}, token="train-0/u0"
            ):
                pass
    assert controller.book.get(NS, "train-1") is None


async def test_the_agent_of_a_replaced_pod_does_not_annotate_its_namesake(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    """Recreated under it (same name, new UID), an old agent whose report the controller drops
    finds its token refused; its fallback write is conditional on its own UID and fails, and it
    stops reporting instead of marking the new pod arrived."""
    ctl = controller
    async with HttpClient(ctl.url) as client:
        a = direct_agent(ctl, tmp_path, client)
        async with running(a):
            await until(a, lambda s: s.step == Step.AT_BARRIER)
            ctl.fake.pods["train-0"]["metadata"]["uid"] = "the-new-pod"
            ctl.refuse = True  # the apiserver: the token's pod is gone
            ctl.book.forget(NS, "train-0", "uid-train-0")  # the old pod's deletion
            ctl.book.job_changed(f"{NS}/{JOB}")  # its stream ends
            await ctl.fake.until(lambda: ctl.fake.refused_patches == 1)  # it tried, once
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ctl.fake.until(lambda: ctl.fake.refused_patches > 1), 0.5)
    assert ctl.fake.annotations("train-0") == {}


class _Unreachable:
    """A controller nobody can reach: every report fails before an answer."""

    async def stream(
        self,
        method: str,
        target: str,
        body: Any = None,
        *,
        inactivity_timeout: float = 90.0,
        token: str | None = None,
        pipe: Any = None,
        behind: Any = None,
    ) -> AsyncIterator[Any]:
        if method:  # always: the `yield` below makes this a generator
            raise TransportError(f"{method} {target}: connection refused")
        yield {}


class _FlakyAnnotation:
    """The annotation channel with the apiserver down for the first `failures` writes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[tuple[int, tuple[int, int] | None]] = []

    async def arrive(self, epoch: int, exit: tuple[int, int] | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise TransportError("PATCH pod: connection refused")
        self.written.append((epoch, exit))

    async def close(self) -> None:
        return None


async def test_a_report_neither_channel_took_is_not_taken_for_accepted(
    tmp_path: pathlib.Path,
) -> None:
    """The controller out of reach and the apiserver down too (a crash during an apiserver
    restart): `arrive` raises for the agent to try again, and returns only once a write
    really landed; else the trainer's exit is lost and the gang waits for an epoch forever."""
    token = tmp_path / "token"
    token.write_text("t")
    config = make_config(tmp_path, arrival_token_file=str(token), direct_fallback_seconds=0.05)
    annotation = _FlakyAnnotation(failures=1)
    fell_back: list[bool] = []
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    direct = DirectArrival(
        _Unreachable(), config, annotation, lambda s: None, lambda: fell_back.append(True), log
    )
    with pytest.raises(TransportError, match="PATCH pod"):
        await asyncio.wait_for(direct.arrive(0, (0, 1)), DEADLINE)
    assert annotation.written == []
    await asyncio.wait_for(direct.arrive(0, (0, 1)), DEADLINE)  # the agent's retry
    assert annotation.written == [(0, (0, 1))]
    assert fell_back == [True, True]
    await direct.close()


async def test_after_its_job_is_deleted_an_agent_neither_reports_nor_annotates(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    """The controller ends the streams of a deleted job and answers a new report 404: the
    agent checks with the apiserver once, and stops, instead of falling back to a pod write
    (thousands at once when a big gang is deleted)."""
    ctl = controller
    async with HttpClient(ctl.url) as client:
        a = direct_agent(ctl, tmp_path, client, direct_fallback_seconds=0.1)
        async with running(a) as task:
            await until(a, lambda s: s.step == Step.AT_BARRIER)
            ctl.fake.delete_job()
            ctl.book.job_changed(f"{NS}/{JOB}")  # the cache saw it: the stream ends
            await polled(lambda: a.job_deleted)
            await asyncio.sleep(0.3)  # past the fallback's 0.1 s
            assert ctl.fake.patches == []
            assert ctl.fake.watches_opened == 0
            assert not task.done()


async def test_a_replica_that_does_not_lead_closes_the_connection_it_refuses() -> None:
    # A Service pins a kept-alive connection to the pod it chose: an agent whose pooled
    # connection reached this replica while it led must not send every later report to it,
    # a standby now. Its 503 closes the connection, and the next request connects anew.
    leading = False
    port = free_port()

    async def authenticate(token: str) -> Identity:
        raise AssertionError("not reached: a standby checks no token")

    app = arrivals_app(
        ArrivalBook(), authenticate, lambda key: None, pod_job=lambda ns, name: None,
        accepting=lambda: leading, on_report=lambda key: None,
    )  # fmt: skip
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in ("/v1/progress", "/v1/arrivals"):
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode()
            )
            head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
            assert head.startswith("http/1.1 503")
            assert "connection: close" in head
            assert await reader.read() != b""  # the body, then the end of the connection
            assert reader.at_eof()
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
    finally:
        await runner.cleanup()
