"""controller.k8s (errors, transport, watch, client) against a scripted HTTP server: error
typing, retries, content types, paging and the watch loop (resume, bookmarks, HTML garbage, 410)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from controller.k8s import (
    GANGJOBS,
    LEASES,
    NODES,
    PODS,
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    Invalid,
    Kube,
    NotFound,
    RetryPolicy,
    TransportError,
    WatchEvent,
    error_from_response,
)
from controller.runtime import metrics

Handler = Callable[[web.Request], Any]
BODY = web.RequestKey("body", bytes)


def status(code: int, reason: str, message: str = "msg", **extra: Any) -> web.Response:
    body = {"kind": "Status", "status": "Failure", "code": code, "reason": reason}
    body |= {"message": message, **extra}
    return web.json_response(body, status=code)


@contextlib.asynccontextmanager
async def fake_apiserver(handler: Handler) -> AsyncIterator[tuple[Kube, list[web.Request]]]:
    seen: list[web.Request] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        request[BODY] = await request.read()
        result: web.StreamResponse = await handler(request)
        return result

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = Configuration(host=f"http://127.0.0.1:{port}")
    policy = RetryPolicy(attempts=4, initial_backoff=0.001, max_backoff=0.005, max_retry_after=0.01)
    try:
        async with Kube(ApiClient(config), request_timeout=5, retry=policy) as kube:
            yield kube, seen
    finally:
        await runner.cleanup()


def test_paths() -> None:
    assert PODS.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert PODS.path() == "/api/v1/pods"
    assert NODES.path(name="n1") == "/api/v1/nodes/n1"
    assert LEASES.path("ns") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
    assert GANGJOBS.api_version == "gangjob.io/v1alpha1"
    assert GANGJOBS.resource == "gangjobs.gangjob.io"
    with pytest.raises(ValueError, match="cluster-scoped"):
        NODES.path("ns")


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Gone),
        (422, "Invalid", Invalid),
        (500, "InternalError", ApiError),
    ],
)
def test_error_typing(code: int, reason: str, expected: type[ApiError]) -> None:
    body = json.dumps({"kind": "Status", "code": code, "reason": reason, "message": "m"})
    error = error_from_response(code, body.encode())
    assert type(error) is expected
    assert error.message == "m"


def test_html_error_page_is_an_api_error() -> None:
    error = error_from_response(502, b"<html><body>Bad Gateway</body></html>", {})
    assert error.status == 502
    assert error.retriable
    assert "Bad Gateway" in error.message


async def test_retries_5xx_and_429_then_succeeds() -> None:
    answers = [
        status(503, "ServiceUnavailable"),
        status(429, "TooManyRequests", details={"retryAfterSeconds": 1}),
        web.json_response({"metadata": {"name": "p"}}),
    ]

    async def handler(request: web.Request) -> web.Response:
        return answers.pop(0)

    before = metrics.REGISTRY.get_sample_value(
        "rest_client_requests_total", {"code": "503", "method": "GET", "resource": "pods"}
    )
    async with fake_apiserver(handler) as (kube, seen):
        pod = await kube.get(PODS, "p", "ns")
    assert pod["metadata"]["name"] == "p"
    assert len(seen) == 3
    after = metrics.REGISTRY.get_sample_value(
        "rest_client_requests_total", {"code": "503", "method": "GET", "resource": "pods"}
    )
    assert after == (before or 0) + 1


async def test_retries_are_bounded_and_optional() -> None:
    async def handler(request: web.Request) -> web.Response:
        return status(500, "InternalError")

    async with fake_apiserver(handler) as (kube, seen):
        with pytest.raises(ApiError) as info:
            await kube.get(PODS, "p", "ns")
        assert info.value.status == 500
        assert len(seen) == 4
        with pytest.raises(ApiError):
            await kube.get(PODS, "p", "ns", retry=False)
        assert len(seen) == 5


async def test_conflict_and_invalid_are_not_retried() -> None:
    answers = [
        status(409, "Conflict", "the object has been modified"),
        status(422, "Invalid", 'GangJob "x" is invalid: spec.replicas: must be >= 1'),
    ]

    async def handler(request: web.Request) -> web.Response:
        return answers.pop(0)

    async with fake_apiserver(handler) as (kube, seen):
        with pytest.raises(Conflict):
            await kube.patch(PODS, "p", {"metadata": {"labels": {"a": "b"}}}, "ns")
        with pytest.raises(Invalid, match=r"spec\.replicas"):
            await kube.create(GANGJOBS, {"metadata": {"name": "x", "namespace": "ns"}})
    assert len(seen) == 2


async def test_patch_is_a_merge_patch_and_delete_carries_preconditions() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Pod"})

    async with fake_apiserver(handler) as (kube, seen):
        await kube.patch_status(GANGJOBS, "job", {"status": {"epoch": 1}}, "ns")
        await kube.delete(PODS, "p", "ns", grace_period_seconds=0, uid="u1")
    patch, delete = seen
    assert patch.path == "/apis/gangjob.io/v1alpha1/namespaces/ns/gangjobs/job/status"
    assert patch.method == "PATCH"
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch[BODY]) == {"status": {"epoch": 1}}
    assert delete.method == "DELETE"
    options = json.loads(delete[BODY])
    assert options["gracePeriodSeconds"] == 0
    assert options["preconditions"] == {"uid": "u1"}


async def test_list_follows_continue_tokens() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.query.get("continue") == "t1":
            return web.json_response({"metadata": {"resourceVersion": "99"}, "items": [{"n": 2}]})
        return web.json_response(
            {"metadata": {"resourceVersion": "42", "continue": "t1"}, "items": [{"n": 1}]}
        )

    async with fake_apiserver(handler) as (kube, seen):
        listed = await kube.list(PODS, "ns", label_selector="gangjob.io/name=j", page_size=1)
    assert listed.items == [{"n": 1}, {"n": 2}]
    assert listed.resource_version == "42"
    assert seen[0].query["labelSelector"] == "gangjob.io/name=j"
    assert seen[0].query["limit"] == "1"
    async with fake_apiserver(handler) as (kube, seen):
        listed = await kube.list(PODS, "ns", page_size=1, transform=lambda o: {"n": -o["n"]})
    assert listed.items == [{"n": -1}, {"n": -2}]


async def collect(stream: AsyncGenerator[WatchEvent, None], into: list[WatchEvent]) -> None:
    async with contextlib.aclosing(stream):
        async for event in stream:
            into.append(event)


def line(event_type: str, rv: str, name: str = "p") -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": rv}}
    return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


async def test_watch_resumes_skips_garbage_and_raises_gone() -> None:
    streams = [
        [line("ADDED", "5"), b"<html>502 Bad Gateway</html>\n"],
        [line("MODIFIED", "6"), line("BOOKMARK", "7")],
        [
            json.dumps(
                {
                    "type": "ERROR",
                    "object": {"kind": "Status", "code": 410, "reason": "Expired",
                               "message": "too old resource version: 7 (20)"},
                }
            ).encode()
            + b"\n"
        ],
    ]  # fmt: skip

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for chunk in streams.pop(0):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    events: list[WatchEvent] = []
    async with fake_apiserver(handler) as (kube, seen):
        stream = kube.watch(PODS, "ns", resource_version="1", timeout_seconds=30)
        with pytest.raises(Gone, match="too old"):
            await collect(stream, events)
    assert [(e.type, e.object["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "5"),
        ("MODIFIED", "6"),
        ("BOOKMARK", "7"),
    ]
    assert [r.query["resourceVersion"] for r in seen] == ["1", "5", "7"]
    assert all(r.query["allowWatchBookmarks"] == "true" for r in seen)
    assert all(r.query["timeoutSeconds"] == "30" for r in seen)


async def test_watch_gives_up_after_repeated_failures() -> None:
    async def handler(request: web.Request) -> web.Response:
        return status(503, "ServiceUnavailable")

    async with fake_apiserver(handler) as (kube, seen):
        with pytest.raises(ApiError) as info:
            async for _ in kube.watch(PODS, "ns", max_failures=3):
                pass
    assert info.value.status == 503
    assert len(seen) == 3


async def test_watch_of_a_missing_resource_is_not_found() -> None:
    async def handler(request: web.Request) -> web.Response:
        return status(404, "NotFound", "the server could not find the requested resource")

    async with fake_apiserver(handler) as (kube, _):
        with pytest.raises(NotFound):
            async for _ in kube.watch(GANGJOBS):
                pass


async def test_connection_refused_is_a_bounded_transport_error() -> None:
    config = Configuration(host="http://127.0.0.1:9")  # discard port: nothing listens
    policy = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.002)
    async with Kube(ApiClient(config), request_timeout=2, retry=policy) as kube:
        with pytest.raises(TransportError):
            await kube.get(PODS, "p", "ns")
    assert metrics.REGISTRY.get_sample_value(
        "rest_client_requests_total", {"code": "<error>", "method": "GET", "resource": "pods"}
    )
