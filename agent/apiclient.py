"""The agent's own Kubernetes API client: a small HTTP/1.1 client on `asyncio.open_connection`.

Owns GET, merge-PATCH and streaming watches (chunked transfer decoding, a read-inactivity
timeout), bearer-token or client-certificate auth, request timeouts and a few kept-alive
connections. Standard library only: the agent ships alone as a zipapp, and a test process runs
thousands of agents, so a client is a few sockets and no threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlencode, urlsplit

from api.constants import PIPELINING_HEADER, PIPELINING_SUPERSEDES, SERVICE_ACCOUNT_DIR

JsonDict = dict[str, Any]
T = TypeVar("T")

USER_AGENT = "gangjob-agent/0.1"
MERGE_PATCH = "application/merge-patch+json"
# A watch line is one JSON object; a GangJob is a few KiB. The cap only stops a broken stream
# from growing a buffer without bound.
MAX_LINE = 16 << 20
MAX_HEADER_LINES = 100


class ClientError(Exception):
    """A request failed: the agent retries on any of these."""


class TransportError(ClientError):
    """No usable answer: connection refused or reset, TLS failure, timeout, malformed HTTP."""


class ApiError(ClientError):
    """The apiserver answered with an error status."""

    def __init__(
        self, status: int, reason: str = "", message: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".rstrip(": "))
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        """Seconds from a `Retry-After` header (429, 503), if the answer had one."""

    @property
    def gone(self) -> bool:
        """410: the resourceVersion to resume from is no longer served; read again."""
        return self.status == 410

    @classmethod
    def from_status(
        cls, status: int, body: bytes, headers: Mapping[str, str] | None = None
    ) -> ApiError:
        """From the response status, its body (a `Status` object, or anything else) and its
        headers (lower-case names)."""
        reason, message = "", body[:200].decode(errors="replace")
        with contextlib.suppress(ValueError):
            obj = json.loads(body)
            if isinstance(obj, dict):
                reason = str(obj.get("reason") or "")
                message = str(obj.get("message") or "")
        retry_after = None
        with contextlib.suppress(ValueError):  # the HTTP-date form is not used by our servers
            retry_after = max(0.0, float((headers or {}).get("retry-after", "")))
        return cls(status, reason, message, retry_after)


class Api(Protocol):
    """What the agent needs of the API: the real `HttpClient`, or a fake in tests."""

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JsonDict: ...

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict: ...

    def watch(
        self, path: str, params: Mapping[str, str], *, inactivity_timeout: float
    ) -> AsyncGenerator[JsonDict, None]:
        """Raw watch events (`{"type": ..., "object": ...}`) until the server ends the stream.

        Raises `ClientError` on a broken or silent stream."""
        ...


class TokenFile:
    """A bearer token read from a file and read again whenever the file changes.

    The kubelet rotates projected service-account tokens (about hourly) by swapping a symlink,
    so a changed (mtime, size, inode) of the target is the signal."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        try:
            st = self.path.stat()
        except OSError:
            return self._token  # keep the last good one; the next call tries again
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            with contextlib.suppress(OSError):
                self._token = self.path.read_text().strip()
                self._stamp = stamp
        return self._token


def ssl_context(
    ca_file: str | os.PathLike[str] | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client TLS context trusting `ca_file` (else the system store), with a client cert.

    Build one and share it among many clients: loading certificates is the costly part."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if cert_file:
        ctx.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    return ctx


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        # No wait_closed(): a TLS close_notify to a dead peer can hang, and nothing is lost.
        self.writer.close()


class Pipe:
    """A stream's connection, which the next request may take before the stream ends
    (`HttpClient.stream(..., behind=pipe)`) when the server's answer said it ends the stream
    for one so (`PIPELINING_HEADER`): the request is written at once, the stream read to its
    end, and the request's answer read next on the same connection (HTTP/1.1 pipelining). The
    agent's next arrival report takes its last one's stream's connection so: one connection
    for the agent's life, and no new one (nor TLS handshake) per restart."""

    __slots__ = ("_conn", "_next")

    def __init__(self) -> None:
        self._conn: _Conn | None = None  # while the stream is read and may be followed
        self._next: asyncio.Future[_Conn] | None = None  # the request behind it, waiting

    @property
    def open(self) -> bool:
        """A request may be sent behind the stream now."""
        conn = self._conn
        return conn is not None and self._next is None and not conn.writer.is_closing()

    def _follow(self) -> tuple[_Conn, asyncio.Future[_Conn]]:
        assert self._conn is not None
        assert self._next is None
        self._next = asyncio.get_running_loop().create_future()
        return self._conn, self._next

    def _end(self, conn: _Conn, complete: bool) -> bool:
        """The stream on `conn` ended (`complete`: read to its end, the connection good). True
        if a request was sent behind it: the connection is then that request's (handed over)
        or closed, never pooled (its answer is on the way)."""
        self._conn = None
        waiting, self._next = self._next, None
        if waiting is None:
            return False
        if complete and not waiting.done():
            waiting.set_result(conn)
            return True
        conn.close()
        if not waiting.done():
            waiting.set_exception(TransportError("the stream ahead of the request broke"))
        return True


@dataclass
class _Head:
    status: int
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def length(self) -> int | None:
        value = self.headers.get("content-length")
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise TransportError(f"bad Content-Length {value!r}") from None

    @property
    def keep_alive(self) -> bool:
        return "close" not in self.headers.get("connection", "").lower()


async def _within(timeout: float | None, aw: Awaitable[T]) -> T:
    if timeout is None:
        return await aw
    async with asyncio.timeout(timeout):
        return await aw


async def read_head(reader: asyncio.StreamReader) -> _Head:
    """The status line and headers of a response."""
    line = await reader.readline()
    if not line:
        raise TransportError("connection closed before a response")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TransportError(f"bad status line {line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise TransportError("connection closed in the response headers")
        if line in (b"\r\n", b"\n"):
            return _Head(int(parts[1]), headers)
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise TransportError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    raise TransportError("too many response headers")


async def iter_chunked(
    reader: asyncio.StreamReader, read_timeout: float | None = None
) -> AsyncIterator[bytes]:
    """The data of a `Transfer-Encoding: chunked` body, chunk by chunk, trailers skipped.

    `read_timeout` bounds each wait for the next chunk, whole (a watch's inactivity timeout):
    one timer per chunk, not one per read, as a fleet's streams carry many small chunks."""
    while True:
        async with asyncio.timeout(read_timeout):
            data = await _read_chunk(reader)
        if data is None:
            return
        yield data


async def _read_chunk(reader: asyncio.StreamReader) -> bytes | None:
    """One chunk's data; None after the last chunk and its trailers."""
    line = await reader.readline()
    if not line.endswith(b"\n"):
        raise TransportError("connection closed in a chunked body")
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise TransportError(f"bad chunk size line {line[:40]!r}") from None
    if size == 0:
        while True:  # trailer fields up to the blank line
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise TransportError("connection closed in chunked trailers")
            if line in (b"\r\n", b"\n"):
                return None
    try:
        data = await reader.readexactly(size + 2)
    except asyncio.IncompleteReadError:
        raise TransportError("connection closed in a chunk") from None
    if data[-2:] != b"\r\n":
        raise TransportError("chunk not followed by CRLF")
    return data[:-2]


class LineSplitter:
    """Splits a byte stream into lines (one watch event each), whatever the chunk boundaries."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        *lines, rest = self._buf.split(b"\n")
        if len(rest) > self._max:
            raise TransportError(f"watch line longer than {self._max} bytes")
        self._buf = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished last line."""
        return bytes(self._buf)


def parse_event(line: bytes) -> JsonDict:
    """One watch line as an event dict; a `TransportError` if it is not one (an HTML page from a
    proxy, a truncated object)."""
    try:
        event = json.loads(line)
    except ValueError:
        raise TransportError(f"watch line is not JSON: {line[:80]!r}") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise TransportError(f"watch line is not an event: {line[:80]!r}")
    if not isinstance(event.get("object"), dict):
        raise TransportError(f"watch event without an object: {line[:80]!r}")
    return event


class HttpClient:
    """HTTP/1.1 to one apiserver. Safe to share among many agents of one event loop.

    `token` is a string or a callable returning the current one (`TokenFile`); client
    certificates go in `ssl_context`. Every plain request has a total deadline
    (`request_timeout`); watches have `inactivity_timeout` per read instead."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        token: str | Callable[[], str] | None = None,
        request_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        max_idle: int = 2,
        user_agent: str = USER_AGENT,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {server!r}: want https://host[:port]")
        self.server = server.rstrip("/")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._host_header = url.netloc
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._token: Callable[[], str] | None
        if isinstance(token, str):
            fixed = token
            self._token = lambda: fixed
        else:
            self._token = token
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._idle: list[_Conn] = []
        self._max_idle = max_idle
        self._user_agent = user_agent

    @classmethod
    def in_cluster(
        cls, sa_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR, **kwargs: Any
    ) -> HttpClient:
        """From a pod's environment: `KUBERNETES_SERVICE_HOST`/`_PORT` and the service-account
        token and CA (the token is re-read as it rotates)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("KUBERNETES_SERVICE_HOST is not set: not running in a pod?")
        if ":" in host:  # IPv6 service address
            host = f"[{host}]"
        sa = Path(sa_dir)
        return cls(
            f"https://{host}:{port}",
            ssl_context=ssl_context(sa / "ca.crt"),
            token=TokenFile(sa / "token"),
            **kwargs,
        )

    async def close(self) -> None:
        """Closes idle connections (open watches end with their generator)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # verbs

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JsonDict:
        target = f"{path}?{urlencode(dict(params))}" if params else path
        return await self._json("GET", target, None, None)

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        return await self._json("PATCH", path, json.dumps(patch).encode(), MERGE_PATCH)

    async def delete(self, path: str, options: JsonDict) -> JsonDict:
        """A delete with DeleteOptions (grace period, a UID precondition)."""
        return await self._json("DELETE", path, json.dumps(options).encode(), "application/json")

    async def post(self, path: str, body: JsonDict, *, token: str | None = None) -> JsonDict:
        """A create (not retried on a broken kept-alive connection: not idempotent). `token`
        replaces the client's own for this request."""
        data = json.dumps(body).encode()
        return await self._json("POST", path, data, "application/json", token)

    async def watch(
        self, path: str, params: Mapping[str, str], *, inactivity_timeout: float = 90.0
    ) -> AsyncGenerator[JsonDict, None]:
        query = dict(params)
        query["watch"] = "true"
        target = f"{path}?{urlencode(query)}"
        async for event in self.stream("GET", target, inactivity_timeout=inactivity_timeout):
            yield event

    async def stream(
        self,
        method: str,
        target: str,
        body: JsonDict | None = None,
        *,
        inactivity_timeout: float = 90.0,
        token: str | None = None,
        pipe: Pipe | None = None,
        behind: Pipe | None = None,
    ) -> AsyncGenerator[JsonDict, None]:
        """A request whose answer is a chunked stream of JSON objects, one per line (a watch, or
        the controller's arrival stream); yields them as they come. `token` replaces the
        client's own for this request. `pipe`: set while the stream is read, if the server
        takes a request behind it; `behind`: another stream's pipe, on which this request is
        sent, if open (else, or if that stream breaks first, on a connection of its own)."""
        data = json.dumps(body).encode() if body is not None else None
        conn = None
        if behind is not None and behind.open:
            conn = await self._send_behind(behind, method, target, data, token)
        if conn is None:
            conn = await self._send(method, target, data, None, self.request_timeout, token)
        reusable = False
        try:
            head = await self._head(conn, self.request_timeout)
            if head.status != 200:
                raw = await self._body(conn, head, inactivity_timeout)
                reusable = head.keep_alive
                raise ApiError.from_status(head.status, raw, head.headers)
            if not head.chunked:
                raise TransportError(f"{method} {target}: the answer is not a chunked stream")
            if (
                pipe is not None
                and head.keep_alive
                and (head.headers.get(PIPELINING_HEADER.lower()) == PIPELINING_SUPERSEDES)
            ):
                pipe._conn = conn
            lines = LineSplitter()
            try:
                async for chunk in iter_chunked(conn.reader, inactivity_timeout):
                    for line in lines.feed(chunk):
                        yield parse_event(line)
            except TimeoutError:
                raise TransportError(f"stream silent for {inactivity_timeout}s") from None
            except (OSError, EOFError) as e:
                raise TransportError(f"stream broke: {e!r}") from e
            if lines.pending.strip():
                raise TransportError("stream ended in the middle of an object")
            reusable = head.keep_alive
        finally:
            # Stopped early (the consumer closed the generator) leaves unread bytes: close.
            if pipe is None or not pipe._end(conn, reusable):
                self._release(conn, reusable)

    # plumbing

    async def _send_behind(
        self, pipe: Pipe, method: str, target: str, body: bytes | None, token: str | None
    ) -> _Conn | None:
        """The request written behind `pipe`'s stream, and its connection once that stream
        has ended; None if it could not be sent so (then it is sent anew: a report sent
        twice is recorded once)."""
        conn, ready = pipe._follow()
        try:
            conn.writer.write(self._request(method, target, body, None, token))
            async with asyncio.timeout(self.request_timeout):
                await conn.writer.drain()
                # Cancelled with this wait (a timeout): the stream, ending later, then closes
                # the connection rather than hand it to nobody.
                return await ready
        except (OSError, TimeoutError, ClientError):
            ready.cancel()
            conn.close()
            return None

    def _request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        content_type: str | None,
        token: str | None,
    ) -> bytes:
        lines = [
            f"{method} {target} HTTP/1.1",
            f"Host: {self._host_header}",
            f"User-Agent: {self._user_agent}",
            "Accept: application/json",
        ]
        if token is None:
            token = self._token() if self._token else ""
        if token:
            lines.append(f"Authorization: Bearer {token}")
        if body is not None:
            lines.append(f"Content-Type: {content_type or 'application/json'}")
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")

    async def _json(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str | None,
        token: str | None = None,
    ) -> JsonDict:
        try:
            async with asyncio.timeout(self.request_timeout):
                status, data = await self._roundtrip(method, path, body, content_type, token)
        except TimeoutError:
            raise TransportError(f"{method} {path}: no answer in {self.request_timeout}s") from None
        if not 200 <= status < 300:
            raise ApiError.from_status(status, data)
        try:
            obj = json.loads(data)
        except ValueError:
            raise TransportError(f"{method} {path}: answer is not JSON") from None
        if not isinstance(obj, dict):
            raise TransportError(f"{method} {path}: answer is not an object")
        return obj

    async def _roundtrip(
        self,
        method: str,
        target: str,
        body: bytes | None,
        content_type: str | None,
        token: str | None = None,
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = await self._send(method, target, body, content_type, None, token)
            reusable = False
            try:
                head = await self._head(conn, None)
                data = await self._body(conn, head, None)
                reusable = head.keep_alive
                return head.status, data
            except TransportError:
                # A kept-alive connection the server closed while idle fails before any answer:
                # try once more on a new one (GET and PATCH of a merge patch are idempotent).
                if conn.reused and attempt == 1 and method != "POST":
                    continue
                raise
            finally:
                self._release(conn, reusable)
        raise AssertionError("unreachable")

    async def _send(
        self,
        method: str,
        target: str,
        body: bytes | None,
        content_type: str | None,
        timeout: float | None,
        token: str | None = None,
    ) -> _Conn:
        conn = await self._acquire(timeout)
        request = self._request(method, target, body, content_type, token)
        try:
            conn.writer.write(request)
            await _within(timeout, conn.writer.drain())
        except (OSError, TimeoutError) as e:
            conn.close()
            if conn.reused:  # stale kept-alive connection: a fresh one gets one chance
                return await self._send(method, target, body, content_type, timeout, token)
            raise TransportError(f"sending {method} {target}: {e!r}") from e
        return conn

    async def _head(self, conn: _Conn, timeout: float | None) -> _Head:
        try:
            return await _within(timeout, read_head(conn.reader))
        except TimeoutError:
            raise TransportError(f"no response headers in {timeout}s") from None
        except (OSError, EOFError, ValueError) as e:
            raise TransportError(f"reading response headers: {e!r}") from e

    async def _body(self, conn: _Conn, head: _Head, timeout: float | None) -> bytes:
        try:
            if head.chunked:
                return b"".join([c async for c in iter_chunked(conn.reader, timeout)])
            length = head.length
            if length is not None:
                return await _within(timeout, conn.reader.readexactly(length))
            head.headers["connection"] = "close"  # body delimited by EOF: no reuse
            return await _within(timeout, conn.reader.read())
        except TimeoutError:
            raise TransportError(f"response body not complete in {timeout}s") from None
        except (OSError, EOFError, ValueError) as e:
            raise TransportError(f"reading response body: {e!r}") from e

    async def _acquire(self, timeout: float | None) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused = True
                return conn
            conn.close()
        try:
            reader, writer = await _within(
                timeout or self.connect_timeout,
                asyncio.open_connection(
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                    limit=1 << 20,
                ),
            )
        except TimeoutError:
            raise TransportError(
                f"connecting to {self.server}: timed out after {self.connect_timeout}s"
            ) from None
        except OSError as e:
            raise TransportError(f"connecting to {self.server}: {e!r}") from e
        return _Conn(reader, writer)

    def _release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < self._max_idle and not conn.reader.at_eof():
            conn.reused = False
            self._idle.append(conn)
        else:
            conn.close()
