"""The arrival endpoint under hostile input, without a cluster (the real TokenReview is in
tests/integration/test_arrival_hostile.py): a report for another pod's GangJob, a body too
large, a flood of reports while tokens are being checked, more streams than allowed, one pod
holding many streams; each refused with nothing counted (neither the book nor the `accepted`
metric), and a real agent that meets a 429 waits and reports again instead of falling back
to its pod annotation."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.agent import Step
from agent.apiclient import ApiError, HttpClient
from agent.direct import DirectArrival, ProgressChannel
from agent.progress import Summary
from agent.protocol import JobState
from controller.arrivals import auth as arrival_auth
from controller.arrivals.auth import Identity
from controller.arrivals.book import ArrivalBook
from controller.arrivals.server import MAX_BODY_BYTES, Limits, arrivals_app
from controller.runtime.metrics import REGISTRY
from localcluster.procs import free_port
from tests.unit.test_agent import DEADLINE, JOB, NS, FakeApi, make_config, polled, running, until
from tests.unit.test_arrivals import GOOD, Controller, controller, direct_agent

__all__ = ["controller"]  # the fixture, shared with test_arrivals

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reports(result: str) -> float:
    value = REGISTRY.get_sample_value("gangjob_arrival_reports_total", {"result": result})
    return value or 0.0


class Served:
    """arrivals_app on a loopback port, over one GangJob whose pods are `pods`."""

    def __init__(self, limits: Limits, authenticate: Callable[[str], Any]) -> None:
        self.book = ArrivalBook()
        self.fake = FakeApi(epoch=0)
        self.pods = {"train-0", "train-1", "train-2"}
        self.url = f"http://127.0.0.1:{free_port()}"
        self.app = arrivals_app(
            self.book,
            authenticate,
            lambda key: self.fake.job if key == f"{NS}/{JOB}" else None,
            pod_job=lambda ns, pod: JOB if pod in self.pods else None,
            accepting=lambda: True,
            on_report=lambda key: None,
            limits=limits,
        )


async def by_token(token: str) -> Identity:
    pod, uid = token.split("/")
    return Identity(NS, pod, uid)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Served], Any]]:
    runners: list[web.AppRunner] = []

    async def start(served: Served) -> None:
        runner = web.AppRunner(served.app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(served.url.rsplit(":", 1)[1])).start()
        runners.append(runner)

    yield start
    for runner in runners:
        await runner.cleanup()


def body(pod: str, **fields: Any) -> dict[str, Any]:
    return {**GOOD, "pod": pod, "uid": f"u-{pod}", **fields}


async def first_line(session: aiohttp.ClientSession, url: str, pod: str) -> Any:
    """POSTs `pod`'s report; the response once its first state line came (held open)."""
    response = await session.post(
        f"{url}/v1/arrivals", json=body(pod), headers={"Authorization": f"Bearer {pod}/u-{pod}"}
    )
    if response.status == 200:
        await response.content.readline()
    return response


async def test_a_report_for_another_pods_gangjob_is_refused(controller: Controller) -> None:
    controller.fake.add_pod("train-0")
    controller.pod_jobs["train-0"] = "other"  # a worker of another GangJob of the namespace
    controller.pod_jobs["train-9"] = ""
    accepted, forbidden = reports("accepted"), reports("forbidden")
    async with HttpClient(controller.url) as client:
        with pytest.raises(ApiError, match=r"403.*worker of gangjob ns/other, not of ns/train"):
            async for _ in client.stream("POST", "/v1/arrivals", GOOD, token="train-0/u0"):
                pass
    assert controller.book.get(NS, "train-0") is None
    assert controller.reports == []
    assert (reports("accepted"), reports("forbidden")) == (accepted, forbidden + 1)


async def test_a_pod_the_cache_does_not_hold_yet_is_told_to_retry(
    controller: Controller,
) -> None:
    async with HttpClient(controller.url) as client:
        with pytest.raises(ApiError, match=r"503.*not seen yet") as e:
            async for _ in client.stream("POST", "/v1/arrivals", GOOD, token="train-0/u0"):
                pass
    assert e.value.status == 503
    assert controller.book.get(NS, "train-0") is None


async def test_a_body_too_large_is_refused_unread(
    serve: Callable[[Served], Any],
) -> None:
    reviewed: list[str] = []

    async def authenticate(token: str) -> Identity:
        reviewed.append(token)
        return await by_token(token)

    served = Served(Limits(), authenticate)
    await serve(served)
    big = body("train-0", incarnation=None, padding="x" * MAX_BODY_BYTES)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{served.url}/v1/arrivals", json=big, headers={"Authorization": "Bearer a/b"}
        )
        assert response.status == 413
    assert reviewed == []  # no TokenReview spent on it
    assert served.book.get(NS, "train-0") is None


async def test_a_flood_while_tokens_are_checked_gets_429_with_retry_after(
    serve: Callable[[Served], Any],
) -> None:
    release, both_waiting = asyncio.Event(), asyncio.Event()
    waiting = 0

    async def slow(token: str) -> Identity:  # a TokenReview that takes its time
        nonlocal waiting
        waiting += 1
        if waiting == 2:
            both_waiting.set()
        await release.wait()
        return await by_token(token)

    served = Served(Limits(pending=2, retry_after_seconds=7), slow)
    await serve(served)
    throttled, accepted = reports("throttled"), reports("accepted")
    async with aiohttp.ClientSession() as session:
        held = [asyncio.create_task(first_line(session, served.url, f"train-{i}")) for i in (0, 1)]
        async with asyncio.timeout(DEADLINE):
            await both_waiting.wait()
        over = await first_line(session, served.url, "train-2")
        assert over.status == 429
        assert over.headers["Retry-After"] == "7"
        assert "too many requests" in (await over.json())["message"]
        assert served.book.get(NS, "train-2") is None
        assert reports("throttled") == throttled + 1
        release.set()
        answers = await asyncio.gather(*held)
        assert [a.status for a in answers] == [200, 200]  # the two in flight go through
        assert reports("accepted") == accepted + 2
        # Their checks done, the slots are free again.
        again = await first_line(session, served.url, "train-2")
        assert again.status == 200
        for a in (*answers, again):
            a.close()


async def test_streams_are_bounded_and_a_pod_holds_one(serve: Callable[[Served], Any]) -> None:
    served = Served(Limits(streams=2), by_token)
    await serve(served)
    async with aiohttp.ClientSession() as session:
        first = await first_line(session, served.url, "train-0")
        second = await first_line(session, served.url, "train-1")
        assert (first.status, second.status) == (200, 200)
        over = await first_line(session, served.url, "train-2")
        assert over.status == 429
        assert served.book.get(NS, "train-2") is None
        # The same pod again (its agent restarted): the new stream replaces the old one, which
        # ends, whatever the limit.
        again = await first_line(session, served.url, "train-0")
        assert again.status == 200
        # The old stream ends at a chunk's boundary (not cut off): its connection stays good
        # for the agent's next request.
        async with asyncio.timeout(DEADLINE):
            assert await first.content.read() == b""
        assert first.content.is_eof()
        for r in (second, again):
            r.close()


async def test_the_token_cache_is_bounded() -> None:
    async def post(review: dict[str, Any]) -> dict[str, Any]:
        token = review["spec"]["token"]
        user = {"username": f"system:serviceaccount:{NS}:w", "extra": {
            arrival_auth.POD_NAME_EXTRA: [token], arrival_auth.POD_UID_EXTRA: ["u"]}}  # fmt: skip
        return {"status": {"authenticated": True, "user": user}}

    auth = arrival_auth.TokenAuthenticator(post, max_entries=10)
    for i in range(100):
        await auth.authenticate(f"t{i}")
        assert auth.cached <= 10
    assert auth.reviews == 100
    await auth.authenticate("t99")  # the newest verdicts are the ones kept
    assert auth.reviews == 100


async def test_an_agent_told_429_waits_and_reports_again_without_falling_back(
    controller: Controller, tmp_path: pathlib.Path
) -> None:
    ctl = controller
    busy = 0
    first: float | None = None

    @web.middleware
    async def overloaded(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal busy, first
        first = first or time.monotonic()
        if time.monotonic() - first < 0.7:  # busy for longer than the fallback deadline
            busy += 1
            return web.json_response(
                {"message": "too many requests"}, status=429, headers={"Retry-After": "0.2"}
            )
        return await handler(request)

    port = free_port()
    app = arrivals_app(
        ctl.book,
        by_token,
        lambda key: ctl.fake.job if key == f"{NS}/{JOB}" else None,
        pod_job=ctl.pod_job,
        accepting=lambda: True,
        on_report=ctl.on_report,
    )
    app.middlewares.append(overloaded)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    ctl.url = f"http://127.0.0.1:{port}"
    try:
        async with HttpClient(ctl.url) as client:
            # 429s, 0.2 s apart as told, outlast the fallback deadline: they must not count.
            a = direct_agent(ctl, tmp_path, client, direct_fallback_seconds=0.3)
            async with running(a):
                await until(a, lambda s: s.step == Step.AT_BARRIER)
                await ctl.reported(1)
                assert 2 <= busy <= 5  # it waited as told between them
                assert ctl.arrived("train-0") == 0  # arrived directly, after the 429s
                assert ctl.fake.patches == []  # no annotation: no fallback
    finally:
        await runner.cleanup()


SUMMARY = Summary(step=7, checkpoint=None, compute=0.1, steps_per_second=2.0, idle_seconds=0.2,
                  stalled=False, malformed=0)  # fmt: skip


async def test_an_agent_keeps_its_connection_from_one_arrival_to_the_next(
    serve: Callable[[Served], Any], tmp_path: pathlib.Path
) -> None:
    # A Process gang's agent reports every epoch while its previous report's stream is open:
    # the controller ends that stream cleanly and the agent keeps the connection for a later
    # request, so that a restart of N workers opens no N new connections (nor TLS handshakes).
    served = Served(Limits(), by_token)
    peers: list[Any] = []

    @web.middleware
    async def remember(request: web.Request, handler: Handler) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await handler(request)

    served.app.middlewares.append(remember)
    await serve(served)
    token = tmp_path / "token"
    token.write_text("train-0/u-train-0")
    config = make_config(tmp_path, "train-0", pod_uid="u-train-0", arrival_url=served.url,
                         arrival_token_file=token)  # fmt: skip
    states: list[JobState] = []
    log = logging.LoggerAdapter(logging.getLogger("test"), {})

    async def no_fallback(epoch: int, exit: tuple[int, int] | None = None) -> None:
        raise AssertionError("the endpoint took every report")

    fallback = types.SimpleNamespace(arrive=no_fallback)
    async with HttpClient(served.url) as client:
        arrival = DirectArrival(client, config, fallback, states.append, lambda: None, log)
        progress = ProgressChannel(client, config, log)
        try:
            for epoch in range(5):
                served.fake.set_status(epoch=epoch)
                served.book.job_changed(f"{NS}/{JOB}")
                await arrival.arrive(epoch)
                held = served.book.get(NS, "train-0")
                assert held is not None  # taken before arrive returned
                assert held.epoch == epoch
                await polled(lambda: not arrival._ending)  # the superseded stream read out
                # The progress summaries (every 30 s) share the pool with the arrivals.
                assert await progress.send(epoch, SUMMARY)
            assert len(peers) == 10
            # Two connections in turn: none new per arrival or per summary.
            assert len(set(peers)) <= 2, peers
            assert states[-1].epoch == 4
            assert served.book.progress(NS, "train-0") is not None
        finally:
            await arrival.close()


async def test_an_idle_stream_is_sent_its_line_again(serve: Callable[[Served], Any]) -> None:
    # The heartbeat: the agent tells a quiet gang from a dead controller by the repeated line.
    served = Served(Limits(), by_token)
    served.app = arrivals_app(
        served.book, by_token, lambda key: served.fake.job, pod_job=lambda ns, pod: JOB,
        accepting=lambda: True, on_report=lambda key: None, heartbeat=0.05,
    )  # fmt: skip
    await serve(served)
    async with aiohttp.ClientSession() as session:
        response = await first_line(session, served.url, "train-0")
        assert response.status == 200
        async with asyncio.timeout(DEADLINE):
            again = await response.content.readline()
        assert b'"STATE"' in again
        response.close()


async def test_a_write_that_changes_no_state_line_sends_the_streams_nothing(
    serve: Callable[[Served], Any],
) -> None:
    # Each second of a restart the arrived counts are written: at N=5000 that was 5000 writes
    # of an unchanged line per job write. Only a change of what the line says is sent.
    served = Served(Limits(), by_token)
    await serve(served)
    async with aiohttp.ClientSession() as session:
        response = await first_line(session, served.url, "train-0")
        assert response.status == 200
        served.fake.set_status(workers={"arrived": 2})  # a new version, the same line
        served.book.job_changed(f"{NS}/{JOB}")
        served.fake.set_status(epoch=1)
        served.book.job_changed(f"{NS}/{JOB}")
        async with asyncio.timeout(DEADLINE):
            line = await response.content.readline()
        assert JobState.from_object(json.loads(line)["object"]).epoch == 1
        response.close()
