"""The fast path beside aiohttp (controller.runtime.fastpath): which requests it may take, and a
connection handed to aiohttp with what the fast path declined."""

from __future__ import annotations

import asyncio
import pathlib
import ssl
from collections.abc import Callable

import pytest
from aiohttp import web

from controller.runtime.fastpath import (
    CLOSE,
    DECLINE,
    FAST_PATH,
    KEEP,
    PIPELINED,
    STREAMING,
    Held,
    Request,
    Route,
    parse,
)
from controller.runtime.httpserver import HttpServer

PATHS = frozenset({"/v1/arrivals"})
MAX_BODY = 64
CERTS = pathlib.Path(__file__).parent / "testdata" / "arrival-tls"
BODY = b'{"a": 1}'


def request(
    *headers: bytes, line: bytes = b"POST /v1/arrivals HTTP/1.1", body: bytes = BODY
) -> bytes:
    head = [line, b"Host: x", *headers]
    if not any(h.lower().startswith(b"content-length") for h in headers):
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def test_a_whole_report_is_taken() -> None:
    got = parse(
        request(b"Authorization: Bearer t0k.en", b"Connection: keep-alive"), PATHS, MAX_BODY
    )
    assert isinstance(got, Request)
    assert (got.path, got.authorization, got.body, got.close) == (
        "/v1/arrivals",
        b"Bearer t0k.en",
        BODY,
        False,
    )
    got = parse(request(b"connection: Close"), PATHS, MAX_BODY)
    assert isinstance(got, Request)
    assert got.close


@pytest.mark.parametrize(
    "raw",
    [
        request(line=b"GET /v1/arrivals HTTP/1.1"),
        request(line=b"POST /v1/arrivals HTTP/1.0"),
        request(line=b"POST /v1/arrivals?x=1 HTTP/1.1"),
        request(line=b"POST  /v1/arrivals HTTP/1.1"),
        request(line=b"POST /metrics HTTP/1.1"),
        request(b"Transfer-Encoding: chunked"),
        request(b"Expect: 100-continue"),
        request(b"Content-Encoding: gzip"),
        request(b"Upgrade: h2c"),
        request(b"Connection: upgrade"),
        request(b"Content-Length: 8", b"Content-Length: 8"),
        request(b"Content-Length: +8"),
        request(body=b"x" * (MAX_BODY + 1)),  # aiohttp refuses it (413): never buffered here
        request(b"Content-Length: 1000000000", body=b""),
        request(b"Authorization: Bearer a", b"Authorization: Bearer b"),
        request(b"Bad Name: x"),
        request(b"NoColon"),
        request(b"X: a\nInjected: b"),
        request(b"X: a\rb"),
        request(b"X: \x00"),
        request("X: caf\u00e9".encode()),
        request() + b"POST",  # pipelined
        b"POST /v1/arrivals HTTP/1.1\r\nHost: x\r\n\r\n",  # no length
        b"POST /v1/arrivals HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
        b"x" * 9000,  # no head's end within the bound
    ],
)
def test_anything_else_goes_to_aiohttp(raw: bytes) -> None:
    assert parse(raw, PATHS, MAX_BODY) is False


def test_a_request_in_pieces_is_read_whole() -> None:
    raw = request(b"Authorization: Bearer t")
    for cut in (10, raw.index(b"\r\n\r\n") + 2, len(raw) - 1):
        assert parse(raw[:cut], PATHS, MAX_BODY) is True
    assert isinstance(parse(raw, PATHS, MAX_BODY), Request)


async def _exchange(port: int, raw: bytes, tls: ssl.SSLContext | None = None) -> bytes:
    """One request on a new connection, then a GET on the same one; both answers' heads."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls else None
    )
    heads = []
    for data in (raw, b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n"):
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        heads.append(head.split(b"\r\n")[0] + b" " + await reader.readexactly(length))
    writer.close()
    return b" | ".join(heads)


@pytest.mark.parametrize("tls", [False, True])
async def test_a_declined_request_is_answered_by_aiohttp_and_so_is_the_next(tls: bool) -> None:
    taken: list[Request] = []

    def take(
        request: Request, transport: asyncio.Transport, done: Callable[[str], None]
    ) -> Held | None:
        if request.authorization != b"Bearer fast":
            done(DECLINE)
            return None
        taken.append(request)
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
        done(CLOSE if request.close else KEEP)
        return None

    async def slow(request: web.Request) -> web.Response:
        return web.Response(text=f"aiohttp:{(await request.read()).decode()}")

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="plain")

    app = web.Application()
    app.router.add_post("/v1/arrivals", slow)
    app.router.add_get("/plain", plain)
    app[FAST_PATH] = Route(PATHS, take, MAX_BODY)
    server_tls = client_tls = None
    if tls:  # the hand-over of a TLS connection: aiohttp gets the decrypting transport
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(CERTS / "tls.crt", CERTS / "tls.key")
        client_tls = ssl.create_default_context(cafile=CERTS / "ca.crt")
    async with HttpServer(app, "127.0.0.1", 0, ssl_context=server_tls) as server:
        assert server.port is not None
        fast = await _exchange(server.port, request(b"Authorization: Bearer fast"), client_tls)
        declined = await _exchange(server.port, request(b"Authorization: Bearer other"), client_tls)
    assert fast == b"HTTP/1.1 200 OK fast | HTTP/1.1 200 OK plain"
    assert declined == b'HTTP/1.1 200 OK aiohttp:{"a": 1} | HTTP/1.1 200 OK plain'
    assert [r.authorization for r in taken] == [b"Bearer fast"]


async def test_a_kept_connection_that_goes_quiet_is_closed() -> None:
    # The agent of a lost node sends no FIN: its kept connection must not live forever.
    def take(
        request: Request, transport: asyncio.Transport, done: Callable[[str], None]
    ) -> Held | None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
        done(KEEP)
        return None

    app = web.Application()
    app[FAST_PATH] = Route(PATHS, take, MAX_BODY, idle_seconds=0.3)
    async with HttpServer(app, "127.0.0.1", 0) as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        started = asyncio.get_running_loop().time()
        for _ in range(2):  # each request restarts the wait
            await asyncio.sleep(0.2)
            writer.write(request(b"Authorization: Bearer fast"))
            assert await asyncio.wait_for(reader.readuntil(b"fast"), 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert asyncio.get_running_loop().time() - started >= 0.3 + 0.4
        writer.close()


class _Streams:
    """A fast path whose answers stream (one chunk each, the request's body), until ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.review = False  # the next answer is held before it begins (a token review)

    def take(
        self, request: Request, transport: asyncio.Transport, done: Callable[[str], None]
    ) -> Held | None:
        streams = self

        class Answer:
            streaming = not self.review

            def end(self, why: str) -> None:
                streams.ended.append(why)
                if self.streaming:
                    transport.write(b"0\r\n\r\n")
                    done(KEEP)

        if not self.review:
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            transport.write(head + b"%x\r\n%b\r\n" % (len(request.body), request.body))
            done(STREAMING)
        return Answer()


async def test_a_request_sent_behind_a_streaming_answer_ends_it_and_is_answered_next() -> None:
    # HTTP/1.1 pipelining, as an agent that outlives a restart sends its next report: on the
    # connection of its last one's stream. That stream ends at a chunk's boundary, and the
    # next answer follows it on the same connection.
    streams = _Streams()
    app = web.Application()
    app[FAST_PATH] = Route(PATHS, streams.take, MAX_BODY)
    async with HttpServer(app, "127.0.0.1", 0) as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request(body=b"first"))
        assert await asyncio.wait_for(reader.readuntil(b"first\r\n"), 5)
        second = request(body=b"second")
        writer.write(second[:20])  # in pieces: the stream goes on until the request is whole
        await asyncio.sleep(0.1)
        assert streams.ended == []
        writer.write(second[20:])
        rest = await asyncio.wait_for(reader.readuntil(b"second\r\n"), 5)
        assert rest.startswith(b"0\r\n\r\nHTTP/1.1 200 OK\r\n")  # the first's end, then
        assert streams.ended == [PIPELINED]
        # A request before an answer has begun (its token under review) cuts the connection.
        streams.review = True
        writer.write(request(body=b"third"))  # ends the second, and is held for review
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        writer.write(request(body=b"fourth"))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # cut
        assert streams.ended == [PIPELINED, PIPELINED, "hung up"]
        writer.close()
