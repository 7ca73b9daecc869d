"""A fast path beside aiohttp for small, whole, ordinary POSTs (the arrival endpoint's reports,
docs/design.md section 3.4): a connection's request that is one of them is handed to the app's
`FastPath` as bytes; anything else, and anything the fast path declines, goes to aiohttp's own
request handler, which serves that connection from then on.

Why: aiohttp's request machinery (its protocol, request, response and writer objects, a task
per connection) costs the controller ~0.15 ms of CPU per report and ~14 KiB per held stream, at
5000 workers most of the endpoint's share of a restart and ~70 MiB
(docs/bench/controller_cost-2026-11-28.md). The fast path reads only what an agent sends, and
strictly: one request line `POST <path> HTTP/1.1`, header lines `name: value` of plain ASCII,
one `Content-Length` (no transfer or content coding, no `Expect`), the body whole, nothing after
it. Whatever it does not take, aiohttp answers exactly as without it (every refusal included).

One pipelined request is taken (HTTP/1.1 allows a client to send its next request before the
answer to the last is complete): a request sent behind an answer that streams (`Held.streaming`)
ends that answer, at a chunk's boundary, and is then taken as if it came next. That is how an
agent that outlives a restart (`Process` mode) sends its next report on the connection of its
last report's stream, which that report supersedes anyway: a restart of N such workers opens no
connection (nor TLS handshake). A stream's head says that it may be ended so
(`api.constants.PIPELINING_HEADER`); aiohttp's own streams do not, and an agent sends nothing
behind those.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Protocol

from aiohttp import web

MAX_HEAD_BYTES = 8 * 1024
"""A report's head is ~1.3 KiB (its token ~1 KiB); a longer one goes to aiohttp."""
_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\t\x20-\x7e]*")
"""A header value's bytes: visible ASCII, spaces and tabs (no controls, no bare CR or LF)."""
_DECLINED = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"})
IDLE_SECONDS = 75.0
"""A connection that waits this long for its next request is closed, as aiohttp closes an idle
kept-alive one (its `keepalive_timeout`): the agent of a lost node sends no FIN, and its kept
connection would otherwise hold a socket for the controller's lifetime."""


class Request:
    """A whole request the fast path may take: its path, `Authorization` value (None: absent),
    body, and whether the client asked to close the connection after it."""

    __slots__ = ("authorization", "body", "close", "path")

    def __init__(self, path: str, authorization: bytes | None, body: bytes, close: bool) -> None:
        self.path = path
        self.authorization = authorization
        self.body = body
        self.close = close


class Held(Protocol):
    """A request still being answered after `FastPath` returned (a stream, or a token being
    reviewed): `end` is called when the client hangs up (`HUNG_UP`), or with `PIPELINED` when
    it sends a request behind an answer that `streaming` says streams: that answer then ends
    at a chunk's boundary (and `done`), so that the request behind it can be taken."""

    def end(self, why: str) -> None: ...

    @property
    def streaming(self) -> bool: ...


KEEP, CLOSE, DECLINE, STREAMING = "keep", "close", "decline", "streaming"
"""How a request ended, told to `done`: answered, and the connection takes the next request;
answered, close it; declined, nothing written: aiohttp answers it and serves the connection.
STREAMING is no end: the answer goes on, and will not be declined (the request's bytes, kept
for aiohttp until then, are let go: a stream is held for a whole epoch)."""


class FastPath(Protocol):
    """Takes a request: calls `done` once, with KEEP, CLOSE or DECLINE, when its answer is
    complete (at once, or later: then it returns what is still `Held`), and before that
    perhaps with STREAMING."""

    def __call__(
        self, request: Request, transport: asyncio.Transport, done: Callable[[str], None]
    ) -> Held | None: ...


@dataclass(frozen=True)
class Route:
    """The fast path of an app, the paths it may take, and the longest body it reads (a longer
    one is aiohttp's to refuse: the fast path never holds more than this and a head)."""

    paths: frozenset[str]
    take: FastPath
    max_body: int
    idle_seconds: float = IDLE_SECONDS


FAST_PATH: web.AppKey[Route] = web.AppKey("fast_path")
"""An app that has a fast path names it here; `controller.runtime.httpserver.HttpServer` serves
it through `Switch`."""
HUNG_UP = "hung up"
"""`Held.end`'s reason when the client closed the connection."""
PIPELINED = "pipelined"
"""`Held.end`'s reason when the client sent its next request behind the streaming answer."""


def parse(buffer: bytes, paths: frozenset[str], max_body: int) -> Request | bool:
    """The request in `buffer`, if it is whole and the fast path's kind; True: not whole yet
    (read more); False: not one for the fast path."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return len(buffer) < MAX_HEAD_BYTES
    if end > MAX_HEAD_BYTES:
        return False
    lines = buffer[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return False
    path = parts[1].decode("latin-1")
    if path not in paths:
        return False
    length: int | None = None
    authorization: bytes | None = None
    close = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
            return False
        value = value.strip(b" \t")
        name = name.lower()
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return False
            length = int(value)
        elif name == b"authorization":
            if authorization is not None:
                return False
            authorization = value
        elif name == b"connection":
            option = value.lower()
            if option == b"close":
                close = True
            elif option != b"keep-alive":
                return False
        elif name in _DECLINED:
            return False
    if length is None or length > max_body:
        return False
    start = end + 4
    if len(buffer) < start + length:
        return True
    if len(buffer) > start + length:
        return False  # a pipelined request: agents send none, aiohttp queues it
    return Request(path, authorization, buffer[start:], close)


class Switch(asyncio.Protocol):
    """One connection: requests the fast path takes, until one it does not; from then on
    aiohttp's `RequestHandler` (made by `factory`) serves the connection."""

    __slots__ = (
        "_buffer",
        "_busy",
        "_factory",
        "_fast",
        "_idle",
        "_idle_seconds",
        "_max_body",
        "_open",
        "_paths",
        "_taken",
        "_transport",
    )

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        route: Route,
        open_: set[Switch],
    ) -> None:
        self._factory = factory
        self._fast = route.take
        self._paths = route.paths
        self._max_body = route.max_body
        self._idle_seconds = route.idle_seconds
        self._idle: asyncio.TimerHandle | None = None
        self._open = open_
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._taken = b""  # the request being taken, for aiohttp if the fast path declines
        self._busy: Held | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._open.add(self)
        self._wait_idle()

    def _wait_idle(self) -> None:
        """Closes the connection if no request comes within `idle_seconds`."""
        self._stop_idle()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._idle_seconds, self.close)

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._stop_idle()
        busy = self._busy
        if busy is not None and not busy.streaming:
            # A request before the last one's answer has begun (its token under review): no
            # agent sends one, it waits for the answer.
            transport.abort()
            return
        buffer = self._buffer + data if self._buffer else data
        request = parse(buffer, self._paths, self._max_body)
        if request is True:
            self._buffer = buffer
            if busy is None:
                self._wait_idle()  # for the rest of it
            return
        self._buffer = b""
        if busy is not None:
            # The next request, sent behind a streaming answer: that answer ends here, and
            # this request is taken (or handed to aiohttp) as the connection's next.
            busy.end(PIPELINED)
            if self._busy is not None or transport.is_closing():
                return  # the answer asked to close the connection: nothing follows it
            self._stop_idle()  # `done` waits for the next request: it is here
        if request is False:
            self._hand_over(transport, buffer)
            return
        self._busy, self._taken = _TAKING, buffer  # until `_done` (perhaps within the call)
        held = self._fast(request, transport, self._done)
        if self._busy is _TAKING:
            self._busy = held

    def _hand_over(self, transport: asyncio.Transport, buffer: bytes) -> None:
        """aiohttp serves the rest of this connection, from `buffer` on (its own keep-alive
        timeout included)."""
        self._stop_idle()
        self._open.discard(self)
        handler = self._factory()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.data_received(buffer)

    def _done(self, outcome: str) -> None:
        if outcome == STREAMING:
            self._taken = b""
            return
        self._busy = None
        taken, self._taken = self._taken, b""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if outcome == DECLINE:
            self._hand_over(transport, taken)
        elif outcome == CLOSE:
            transport.close()
        else:
            self._wait_idle()  # KEEP: the next request, or the idle timeout

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_idle()
        self._open.discard(self)
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.end(HUNG_UP)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _Taking:
    streaming = False

    def end(self, why: str) -> None:
        return None


_TAKING = _Taking()
_date: tuple[int, bytes] = (0, b"")


def date_header() -> bytes:
    """`Date: <now>\\r\\n`, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, b"Date: %s\r\n" % formatdate(now, usegmt=True).encode())
    return _date[1]
