"""The agent's HTTP client (chunked decoding, watch parsing, keep-alive, timeouts, auth) against
a scripted local HTTP server, and its probe server. No cluster."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.apiclient import (
    MERGE_PATCH,
    ApiError,
    HttpClient,
    LineSplitter,
    Pipe,
    TokenFile,
    TransportError,
    iter_chunked,
    parse_event,
)
from agent.probe import ProbeServer


def reader_of(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def chunks(data: bytes, eof: bool = True, timeout: float | None = None) -> list[bytes]:
    return [c async for c in iter_chunked(reader_of(data, eof), timeout)]


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


# chunked transfer decoding


async def test_chunked_body_with_extensions_and_trailers() -> None:
    data = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert await chunks(data) == [b"hello", b" ", b"world"]


async def test_chunked_body_leaves_what_follows_unread() -> None:
    reader = reader_of(chunked(b"abc") + b"HTTP/1.1 200 OK\r\n")
    assert [c async for c in iter_chunked(reader)] == [b"abc"]
    assert await reader.readline() == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    "data",
    [
        b"5\r\nhel",  # connection closed in a chunk
        b"5\r\nhelloXX",  # chunk not followed by CRLF
        b"zz\r\n",  # not a hex size
        b"5\r\nhello\r\n",  # closed before the last chunk
        b"0\r\nX: 1\r\n",  # closed in the trailers
    ],
)
async def test_broken_chunked_body_is_a_transport_error(data: bytes) -> None:
    with pytest.raises(TransportError):
        await chunks(data)


async def test_chunked_read_timeout() -> None:
    with pytest.raises(TimeoutError):
        await chunks(b"5\r\nhello\r\n", eof=False, timeout=0.05)


# watch lines


def test_line_splitter_joins_lines_across_chunks() -> None:
    lines = LineSplitter()
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b':1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert lines.pending == b'{"c"'
    assert lines.feed(b":3}\n\n") == [b'{"c":3}']
    assert lines.pending == b""


def test_line_splitter_caps_a_runaway_line() -> None:
    lines = LineSplitter(max_line=10)
    with pytest.raises(TransportError):
        lines.feed(b"x" * 11)


def test_parse_event() -> None:
    assert parse_event(b'{"type":"ADDED","object":{"a":1}}') == {
        "type": "ADDED",
        "object": {"a": 1},
    }
    for bad in (b"<html>502</html>", b"[1]", b'{"type":"ADDED"}', b'{"object":{}}'):
        with pytest.raises(TransportError):
            parse_event(bad)


# the client against a scripted server


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Responder = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Server:
    respond: Responder
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    url: str = ""


def response(status: int, body: object, *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + data


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Responder], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(respond: Responder) -> Server:
        state = Server(respond)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            try:
                while True:
                    line = await reader.readline()
                    if not line:
                        return
                    method, target, _ = line.decode().split(" ", 2)
                    headers: dict[str, str] = {}
                    while (h := await reader.readline()) not in (b"\r\n", b""):
                        k, _, v = h.decode().partition(":")
                        headers[k.strip().lower()] = v.strip()
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                    req = Request(method, target, headers, body)
                    state.requests.append(req)
                    await respond(req, writer)
                    await writer.drain()
                    if writer.is_closing():
                        return
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return state

    yield start
    for server in servers:
        server.close()


async def test_get_and_merge_patch_reuse_one_connection(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        w.write(response(200, {"method": req.method, "body": req.body.decode()}))

    server = await serve(respond)
    async with HttpClient(server.url, token="s3cret") as client:
        assert (await client.get("/api/v1/x"))["method"] == "GET"
        patched = await client.merge_patch("/api/v1/x", {"metadata": {"annotations": {"a": "1"}}})
        assert json.loads(patched["body"]) == {"metadata": {"annotations": {"a": "1"}}}
    assert server.connections == 1
    get, patch = server.requests
    assert get.headers["authorization"] == "Bearer s3cret"
    assert patch.headers["content-type"] == MERGE_PATCH


async def test_error_status_carries_the_status_reason(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        w.write(response(404, {"kind": "Status", "reason": "NotFound", "message": "pods nope"}))

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        with pytest.raises(ApiError) as err:
            await client.get("/api/v1/namespaces/n/pods/nope")
    assert (err.value.status, err.value.reason, err.value.message) == (404, "NotFound", "pods nope")
    assert not err.value.gone


async def test_server_closing_a_kept_alive_connection_is_retried_once(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    calls = 0

    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            w.close()  # the server dropped the idle connection: no answer on it
            return
        w.write(response(200, {"n": calls}))

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        assert await client.get("/a") == {"n": 1}
        assert await client.get("/a") == {"n": 3}
    assert server.connections == 2


async def test_request_timeout(serve: Callable[[Responder], Awaitable[Server]]) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    server = await serve(respond)
    async with HttpClient(server.url, request_timeout=0.1) as client:
        with pytest.raises(TransportError, match="no answer"):
            await client.get("/slow")


async def test_connection_refused_is_a_transport_error() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with HttpClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(TransportError):
            await client.get("/")


async def test_token_file_is_read_again_when_it_rotates(
    serve: Callable[[Responder], Awaitable[Server]], tmp_path: pathlib.Path
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        w.write(response(200, {}))

    server = await serve(respond)
    token = tmp_path / "token"
    token.write_text("one\n")
    async with HttpClient(server.url, token=TokenFile(token)) as client:
        await client.get("/")
        rotated = tmp_path / "token.new"
        rotated.write_text("two-longer\n")
        rotated.replace(token)  # the kubelet swaps the file atomically
        await client.get("/")
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer one",
        "Bearer two-longer",
    ]


def chunked_head() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


async def collect(stream: AsyncIterator[dict[str, Any]], types: list[str]) -> None:
    async for e in stream:
        types.append(e["type"])


def event(kind: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"resourceVersion": rv}}}).encode()


async def test_watch_streams_events_split_anywhere_then_keeps_the_connection(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        if "watch=true" not in req.target:
            w.write(response(200, {"ok": True}))
            return
        stream = event("ADDED", "1") + b"\n" + event("MODIFIED", "2") + b"\n"
        # Chunk boundaries fall in the middle of events and between them.
        w.write(chunked_head() + chunked(stream[:7], stream[7:60], stream[60:]))

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        stream = client.watch("/apis/x", {"fieldSelector": "metadata.name=a"})
        got = [(e["type"], e["object"]["metadata"]["resourceVersion"]) async for e in stream]
        assert got == [("ADDED", "1"), ("MODIFIED", "2")]
        assert await client.get("/x") == {"ok": True}
    assert server.connections == 1
    assert "fieldSelector=metadata.name%3Da" in server.requests[0].target


async def test_silent_watch_trips_the_inactivity_timeout(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        w.write(
            chunked_head() + b"%x\r\n%s\n\r\n" % (len(event("ADDED", "1")) + 1, event("ADDED", "1"))
        )
        await w.drain()
        await asyncio.sleep(10)

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        seen: list[str] = []
        with pytest.raises(TransportError, match="silent"):
            await collect(client.watch("/w", {}, inactivity_timeout=0.1), seen)
        assert seen == ["ADDED"]


async def test_watch_error_status_and_broken_stream(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        if "resourceVersion=old" in req.target:
            w.write(response(410, {"kind": "Status", "reason": "Expired", "code": 410}))
        else:
            w.write(chunked_head() + b"100\r\n" + event("ADDED", "1") + b"\n")
            w.close()

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        with pytest.raises(ApiError) as err:
            await collect(client.watch("/w", {"resourceVersion": "old"}), [])
        assert err.value.gone
        with pytest.raises(TransportError):
            await collect(client.watch("/w", {}), [])


def pipelined_head() -> bytes:
    """A stream's head that says a request may be sent behind it (the arrival endpoint's)."""
    return chunked_head()[:-2] + b"Gangjob-Pipelining: supersedes\r\n\r\n"


def line(kind: str, rv: str) -> bytes:
    data = event(kind, rv) + b"\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize("breaks", [False, True])
async def test_a_request_sent_behind_a_stream_is_answered_after_it_or_sent_again(
    serve: Callable[[Responder], Awaitable[Server]], breaks: bool
) -> None:
    # The next arrival report goes on the connection of the last one's stream: the server ends
    # that stream and answers next on the same connection. If the stream breaks instead, the
    # request is sent again on a connection of its own.
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        n = len(server.requests)
        if n == 1:
            w.write(pipelined_head() + line("STATE", "1"))  # held open
        elif n == 2 and breaks:
            w.close()
        else:  # the first stream's end (if on its connection), then the next's answer
            w.write((b"0\r\n\r\n" if n == 2 else b"") + chunked_head() + line("STATE", "2"))
            w.write(b"0\r\n\r\n")

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        first = Pipe()
        stream = client.stream("POST", "/v1/arrivals", {"n": 1}, pipe=first)
        assert (await anext(stream))["object"]["metadata"]["resourceVersion"] == "1"
        was_open = first.open
        rest: list[str] = []
        reading = asyncio.ensure_future(collect(stream, rest))  # to its end, as the agent
        second = client.stream("POST", "/v1/arrivals", {"n": 2}, behind=first)
        got = [e["object"]["metadata"]["resourceVersion"] async for e in second]
        assert got == ["2"]
        if breaks:
            with pytest.raises(TransportError):
                await reading
        else:
            await reading
        assert rest == []
        assert (was_open, first.open) == (True, False)
    assert [json.loads(r.body)["n"] for r in server.requests] == ([1, 2, 2] if breaks else [1, 2])
    assert server.connections == (2 if breaks else 1)


async def test_a_stream_whose_head_says_nothing_takes_no_request_behind_it(
    serve: Callable[[Responder], Awaitable[Server]],
) -> None:
    async def respond(req: Request, w: asyncio.StreamWriter) -> None:
        w.write(chunked_head() + line("STATE", "1"))

    server = await serve(respond)
    async with HttpClient(server.url) as client:
        pipe = Pipe()
        stream = client.stream("POST", "/v1/arrivals", {"n": 1}, pipe=pipe)
        assert await anext(stream)
        assert not pipe.open  # the next request connects anew
        await stream.aclose()


def test_server_url_is_checked() -> None:
    with pytest.raises(ValueError, match="https://host"):
        HttpClient("127.0.0.1:6443")


def test_in_cluster_reads_the_service_account(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    (tmp_path / "token").write_text("tok")
    # A CA the ssl module accepts: any PEM certificate; use the system one if it is there.
    ca = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
    if not ca.exists():
        pytest.skip("no system CA bundle to stand in for the service-account CA")
    (tmp_path / "ca.crt").write_bytes(ca.read_bytes())
    client = HttpClient.in_cluster(tmp_path)
    assert client.server == "https://[fd00::1]:6443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        HttpClient.in_cluster(tmp_path)


# the probe


async def fetch(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.36\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_probe_answers_barrier_and_healthz() -> None:
    open_ = False
    probe = ProbeServer("127.0.0.1", 0, lambda: open_)
    await probe.start()
    try:
        assert await fetch(probe.port, "/barrier") == (503, b"waiting\n")
        assert (await fetch(probe.port, "/healthz"))[0] == 200
        assert (await fetch(probe.port, "/nope"))[0] == 404
        open_ = True
        assert await fetch(probe.port, "/barrier?x=1") == (200, b"open\n")
    finally:
        await probe.close()
