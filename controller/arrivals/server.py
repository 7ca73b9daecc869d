"""The arrival endpoint `POST /v1/arrivals` (docs/design.md section 3): parse a report, check
who sends it (controller.arrivals.auth), record it in the book (controller.arrivals.book), and
answer with a stream of the GangJob's state, one JSON line per change of `status.epoch`,
`barrierEpoch` or `phase` in this controller's cache (so only what is stored in the apiserver),
which spares every agent its own watch. Beside it, `POST /v1/progress` takes a worker's progress
summary (docs/progress.md) with the same checks, into the same book, and answers at once.

Both are served twice over: through aiohttp's handlers (`arrivals`, `progress`), and, for a
whole, plain request whose sender passes every check, by `fast` without aiohttp's request
machinery (controller.runtime.fastpath; docs/design.md section 3.4): the same checks, book,
streams and lines, at about a third of the CPU and memory per report. What `fast` declines
(any refusal but a failed token review, which it answers as `_check` would) aiohttp answers.

Whoever reaches the port may send anything (docs/design.md, "The arrival endpoint's limits"):
bodies are small, requests not yet authenticated are bounded in number (over it: 429 with
Retry-After), a report counts only from the pod its token is bound to and for that pod's own
GangJob, each pod holds one stream (a new one ends the old), and the streams are bounded in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import Counter

from api.constants import ARRIVALS_PATH, PIPELINING_HEADER, PIPELINING_SUPERSEDES, PROGRESS_PATH
from api.v1alpha1 import Phase
from controller.arrivals.auth import Identity, Unauthorized
from controller.arrivals.book import ArrivalBook, ProgressReport, Report
from controller.runtime import metrics
from controller.runtime.fastpath import (
    CLOSE,
    DECLINE,
    FAST_PATH,
    HUNG_UP,
    KEEP,
    STREAMING,
    Held,
    Request,
    Route,
    date_header,
)

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
MAX_BODY_BYTES = 16 * 1024
"""A report is ~300 bytes; aiohttp's default would read a megabyte per request."""
HEARTBEAT_SECONDS = 30.0
"""The state line is sent again this often on an idle stream: the agent's inactivity timeout
(90 s) tells a dead controller from a quiet gang."""
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})
MAX_INCARNATION = 64
MAX_UNREAD_BYTES = 64 * 1024
"""A stream whose agent leaves this much of it unread is cut: ~400 lines of ~150 bytes."""
P = TypeVar("P")


@dataclass(frozen=True)
class Posted:
    """A parsed report request."""

    namespace: str
    job: str
    pod: str
    report: Report


@dataclass(frozen=True)
class Limits:
    """What the endpoint takes at once; beyond it, 429 with `Retry-After`.

    `pending`: requests not yet authenticated (reading the body, waiting for the TokenReview):
    a gang of thousands starting together queues at the authenticator, a flood of bad tokens
    stops here. `streams`: answers held open, over every GangJob (each pod holds one, so a job
    holds at most its pods': what a gang needs)."""

    pending: int = 1024
    streams: int = 65536
    retry_after_seconds: int = 1


class BadReport(ValueError):
    """The body is not a report; the message names the field."""


def parse_report(body: Any) -> Posted:
    """The request body as a report, or `BadReport` naming the field that is wrong."""
    if not isinstance(body, dict):
        raise BadReport("the body must be a JSON object")

    def text(name: str) -> str:
        value = body.get(name)
        if not isinstance(value, str) or not value:
            raise BadReport(f"{name}: a non-empty string is required")
        return value

    def epoch(value: Any, name: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadReport(f"{name}: a non-negative integer is required")
        return value

    at = epoch(body.get("epoch"), "epoch")
    exit: tuple[int, int | None] | None = None
    raw = body.get("exit")
    if raw is not None:
        if not isinstance(raw, list) or len(raw) != 2:
            raise BadReport("exit: [epoch, code] or null is required")
        code = raw[1]
        if not isinstance(code, int) or isinstance(code, bool):
            raise BadReport("exit[1]: an integer exit code is required")
        # -1: the pod restarted under the agent and the kubelet kept no code (as the annotation)
        exit = (epoch(raw[0], "exit[0]"), None if code < 0 else code)
    incarnation = body.get("incarnation")
    if incarnation is not None and (
        not isinstance(incarnation, str) or not 0 < len(incarnation) <= MAX_INCARNATION
    ):
        raise BadReport(f"incarnation: a string of 1-{MAX_INCARNATION} characters or null")
    report = Report(text("uid"), at, exit, incarnation=incarnation)
    return Posted(text("namespace"), text("job"), text("pod"), report)


@dataclass(frozen=True)
class PostedProgress:
    """A parsed progress request."""

    namespace: str
    job: str
    pod: str
    uid: str
    epoch: int
    step: int
    steps_per_second: float | None
    checkpoint: int | None
    compute_seconds: float | None
    idle_seconds: float
    stalled: bool
    malformed: int
    trainer_state: str | None = None
    trainer_cpu_seconds: float | None = None
    compute_median_seconds: float | None = None
    compute_samples: int = 0
    compute_window_seconds: float | None = None

    def progress(self, now: float) -> ProgressReport:
        """As the book keeps it, received at `now` (wall clock)."""
        changed_at = now - self.idle_seconds
        return ProgressReport(
            uid=self.uid,
            epoch=self.epoch,
            step=self.step,
            steps_per_second=self.steps_per_second,
            checkpoint=self.checkpoint,
            compute_seconds=self.compute_seconds,
            step_changed_at=changed_at,
            stalled_since=changed_at if self.stalled else None,
            malformed=self.malformed,
            received_at=now,
            trainer_state=self.trainer_state,
            trainer_cpu_seconds=self.trainer_cpu_seconds,
            compute_median_seconds=self.compute_median_seconds,
            compute_samples=self.compute_samples,
            compute_since=None
            if self.compute_median_seconds is None
            else now - (self.compute_window_seconds or 0.0),
        )


def parse_progress(body: Any) -> PostedProgress:
    """The request body as a progress summary, or `BadReport` naming the field that is wrong."""
    if not isinstance(body, dict):
        raise BadReport("the body must be a JSON object")
    summary = body.get("progress")
    if not isinstance(summary, dict):
        raise BadReport("progress: an object is required")

    def text(name: str) -> str:
        value = body.get(name)
        if not isinstance(value, str) or not value:
            raise BadReport(f"{name}: a non-empty string is required")
        return value

    def count(where: dict[str, Any], name: str, field: str, optional: bool = False) -> Any:
        value = where.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadReport(f"{field}: a non-negative integer is required")
        return value

    def seconds(name: str, optional: bool = True, where: str = "progress") -> Any:
        holder = summary if where == "progress" else summary.get("trainer") or {}
        value = holder.get(name)
        if value is None and optional:
            return None
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise BadReport(f"{where}.{name}: a non-negative number is required")
        return float(value)

    trainer = summary.get("trainer")
    state: str | None = None
    if trainer is not None:
        if not isinstance(trainer, dict):
            raise BadReport("progress.trainer: an object or null is required")
        state = trainer.get("state")
        if not isinstance(state, str) or len(state) != 1:
            raise BadReport("progress.trainer.state: a process state letter is required")

    stalled = summary.get("stalled", False)
    if not isinstance(stalled, bool):
        raise BadReport("progress.stalled: true or false is required")
    return PostedProgress(
        namespace=text("namespace"),
        job=text("job"),
        pod=text("pod"),
        uid=text("uid"),
        epoch=count(body, "epoch", "epoch"),
        step=count(summary, "step", "progress.step"),
        steps_per_second=seconds("stepsPerSecond"),
        checkpoint=count(summary, "checkpoint", "progress.checkpoint", optional=True),
        compute_seconds=seconds("computeSeconds"),
        idle_seconds=seconds("idleSeconds", optional=False),
        stalled=stalled,
        malformed=count(summary, "malformed", "progress.malformed", optional=True) or 0,
        trainer_state=state,
        trainer_cpu_seconds=seconds("cpuSeconds", where="progress.trainer"),
        compute_median_seconds=seconds("computeMedianSeconds"),
        compute_samples=count(summary, "computeSamples", "progress.computeSamples", True) or 0,
        compute_window_seconds=seconds("computeWindowSeconds"),
    )


def state_line(job: JsonDict) -> bytes:
    """A GangJob's protocol state as one line of the stream (watch-event shaped, so that the
    agent reads it with the parser of its watch)."""
    status = job.get("status") or {}
    state = {k: status.get(k) for k in ("epoch", "barrierEpoch", "phase")}
    if status.get("worldSize") is not None:
        # The world of `epoch`: the agent gives it to the trainer it starts at that epoch.
        state["worldSize"] = status["worldSize"]
    if status.get("dropped"):
        state["dropped"] = status["dropped"]
    if status.get("places"):
        state["places"] = status["places"]
    # Only the roles done for good: a worker of one that succeeded is then no longer held.
    complete = [r["name"] for r in status.get("roles") or () if r.get("state") == "Complete"]
    if complete:
        state["roles"] = [{"name": name, "state": "Complete"} for name in complete]
    obj = {"metadata": {"name": (job.get("metadata") or {}).get("name", "")}, "status": state}
    return json.dumps({"type": "STATE", "object": obj}).encode() + b"\n"


def arrivals_app(
    book: ArrivalBook,
    authenticate: Callable[[str], Awaitable[Identity]],
    job: Callable[[str], JsonDict | None],
    *,
    pod_job: Callable[[str, str], str | None],
    accepting: Callable[[], bool],
    on_report: Callable[[str], None],
    on_news: Callable[[str], None] | None = None,
    lookup: Callable[[str], Identity | None] | None = None,
    heartbeat: float = HEARTBEAT_SECONDS,
    limits: Limits = Limits(),
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The endpoint. `job(key)` reads the GangJob from the cache; `pod_job(namespace, pod)`
    the name of the GangJob whose worker the cached pod is (None: no such pod in the cache);
    `accepting()` is whether this replica leads with synced caches; `on_report(key)` queues
    the job for a pass; `on_news(key)` is told when a worker's stall begins or ends, its
    compute shifts (a straggler may begin or end), or the job's first summary of an epoch
    comes (any other progress summary queues nothing). `lookup(token)`, the authenticator's
    cached verdict (no review), gives the app its fast path (`fast`): a report whose token is
    cached and that passes every check is taken without aiohttp's request machinery."""
    # One line per version of each job, not one per stream: a job change wakes every stream of
    # its gang (thousands), and they all send the same bytes.
    lines: dict[str, tuple[str, bytes]] = {}
    accepted = metrics.ARRIVAL_REPORTS.labels("accepted")  # bound once: a restart brings N
    progress_accepted = metrics.PROGRESS_REPORTS.labels("accepted")
    pending = 0
    # The stream each pod holds, by (namespace, pod): a newer report of the pod ends it.
    held: dict[tuple[str, str], _Stream] = {}
    # The streams sent lines, by GangJob key: a job change writes its line to each directly
    # (`push`), no task woken per stream.
    by_job: dict[str, dict[tuple[str, str], _Stream]] = {}

    def line_of(key: str, obj: JsonDict) -> bytes:
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        hit = lines.get(key)
        if hit is None or hit[0] != version or not version:
            line = state_line(obj)
            if hit is not None and hit[1] == line:
                # A write that changed nothing a stream sends (the arrived counts, each second
                # of a restart): the same line object, so no stream is sent it again.
                line = hit[1]
            hit = lines[key] = (version, line)
        return hit[1]

    def changed(key: str, closing: bool) -> None:
        for each in list(by_job) if closing else (key,):
            push(each)

    def open_stream(posted: Posted, key: str, transport: asyncio.Transport) -> _Stream:
        """A checked report (either server's) into the book, and its stream, the pod's own."""
        accepted.inc()
        if book.record(posted.namespace, posted.pod, posted.report, job=key):
            on_report(key)
        me = _Stream(posted.namespace, posted.pod, posted.report.uid, transport)
        pod = (posted.namespace, posted.pod)
        older = held.get(pod)
        held[pod] = me
        if older is not None:
            # The pod's agent reports again: its old stream ends, at a chunk's boundary, so
            # that the agent may keep that connection for its next request.
            older.end(_SUPERSEDED)
        metrics.ARRIVAL_STREAMS.inc()
        return me

    def take_progress(posted: PostedProgress, key: str) -> None:
        """A checked progress summary (either server's) into the book."""
        progress_accepted.inc()
        if book.record_progress(key, posted.pod, posted.progress(clock())) and on_news:
            on_news(key)

    def let_go(key: str, pod: tuple[str, str], me: _Stream) -> None:
        """A stream has ended (either server's): it is no longer the pod's, nor its job's."""
        metrics.ARRIVAL_STREAMS.dec()
        if held.get(pod) is me:
            del held[pod]
        group = by_job.get(key)
        if group is not None and group.get(pod) is me:
            del group[pod]
            if not group:
                del by_job[key]

    def push(key: str, force: bool = False, only: _Stream | None = None) -> None:
        """The job's state line to each of its streams (or `only` the one) that has not been
        sent it (`force`: to every one, the heartbeat), and the streams whose report no longer
        holds ended."""
        group = by_job.get(key)
        if not group:
            return
        obj = None if book.closing else job(key)
        if obj is None:
            lines.pop(key, None)
            for stream in list(group.values()):
                stream.end(_ENDED)  # deleted (the agent sees its watch end) or stopping
            return
        line = line_of(key, obj)
        framed = b"%x\r\n%b\r\n" % (len(line), line)  # one chunk, as aiohttp frames it
        terminal = (obj.get("status") or {}).get("phase") in TERMINAL
        for stream in list(group.values()) if only is None else (only,):
            transport = stream.transport
            if transport.is_closing():
                stream.end(_HUNG_UP)
                continue
            report = book.get(stream.namespace, stream.pod)
            if report is None or report.uid != stream.uid:
                stream.end(_ENDED)  # the pod is gone, or replaced
                continue
            if force or stream.sent is not line:
                if transport.get_write_buffer_size() > MAX_UNREAD_BYTES:
                    transport.abort()  # the agent reads nothing: it holds memory, not a stream
                    stream.end(_HUNG_UP)
                    continue
                try:
                    transport.write(framed)
                except (OSError, RuntimeError):  # closed under us: as the agent hanging up
                    stream.end(_HUNG_UP)
                    continue
                stream.sent = line
            if terminal:
                stream.end(_ENDED)

    book.subscribe(changed)

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(heartbeat)
            for key in list(by_job):
                push(key, force=True)

    async def arrivals(request: web.Request) -> web.StreamResponse:
        nonlocal pending
        if not accepting():
            return _not_leading()
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return _error(401, "unauthorized", "a bearer token is required")
        if pending >= limits.pending:
            return _busy(limits, f"{pending} reports are being checked")
        pending += 1
        try:
            checked = await _check(request, auth[7:].strip(), _posted_report)
        finally:
            pending -= 1
        if isinstance(checked, web.Response):
            return checked
        posted, key = checked
        pod = (posted.namespace, posted.pod)
        if len(held) >= limits.streams and pod not in held:
            return _busy(limits, f"{len(held)} streams are open")
        transport = request.transport
        if transport is None:
            raise ConnectionResetError  # the agent hung up already
        me = open_stream(posted, key, transport)
        ended = me.ended = asyncio.get_running_loop().create_future()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            obj = None if book.closing else job(key)
            if obj is not None:
                # The first line through aiohttp (it sends the headers with it); the later ones
                # by `push`, written straight to the transport in the same framing.
                line = line_of(key, obj)
                await response.write(line)
                me.sent = line
                if book.closing or (obj.get("status") or {}).get("phase") in TERMINAL:
                    me.end(_ENDED)
                elif me.why is None:
                    by_job.setdefault(key, {})[pod] = me
                    now = job(key)  # what changed while the first line was written
                    if now is not None and line_of(key, now) is not line:
                        push(key, only=me)
                if await ended == _HUNG_UP:
                    raise ConnectionResetError
            await response.write_eof()
        except ConnectionResetError:
            pass  # the agent hung up: it moved on, its pod restarted, or it is gone
        finally:
            let_go(key, pod, me)
        return response

    async def _check(
        request: web.Request,
        token: str,
        parse: Callable[[Any], tuple[P, Identity, str]],
        counter: Counter = metrics.ARRIVAL_REPORTS,
    ) -> tuple[P, str] | web.Response:
        """The report, if its sender may make it; else the refusal. `parse` makes the report
        of the body, with who sends it and for which GangJob."""
        try:
            posted, mine, name = parse(await request.json())
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "invalid", f"a report is at most {MAX_BODY_BYTES} bytes", counter)
        except (ValueError, BadReport) as e:
            return _error(400, "invalid", f"not a report: {e}", counter)
        try:
            who = await authenticate(token)
        except Unauthorized as e:
            return _error(401, "unauthorized", str(e), counter)
        except Exception as e:  # the apiserver did not answer the review: try again later
            log.warning("TokenReview failed: %s", e)
            return _error(503, "unavailable", "cannot check the token now", counter)
        if who != mine:
            message = f"the token is bound to pod {who.namespace}/{who.pod} (uid {who.uid})"
            return _error(403, "forbidden", message, counter)
        key = f"{mine.namespace}/{name}"
        if job(key) is None:
            return _error(404, "unknown", f"gangjob {key} not found", counter)
        owner = pod_job(mine.namespace, mine.pod)
        if owner is None:
            # Created moments ago, and not in this controller's cache yet: the agent retries.
            message = f"pod {mine.namespace}/{mine.pod} not seen yet"
            return _error(503, "unavailable", message, counter)
        if owner != name:
            message = (
                f"pod {mine.namespace}/{mine.pod} is a worker of gangjob "
                f"{mine.namespace}/{owner}, not of {key}"
            )
            return _error(403, "forbidden", message, counter)
        return posted, key

    async def progress(request: web.Request) -> web.Response:
        nonlocal pending
        counter = metrics.PROGRESS_REPORTS
        if not accepting():
            return _not_leading(counter)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return _error(401, "unauthorized", "a bearer token is required", counter)
        if pending >= limits.pending:
            return _busy(limits, f"{pending} reports are being checked", counter)
        pending += 1
        try:
            checked = await _check(request, auth[7:].strip(), _posted_progress, counter)
        finally:
            pending -= 1
        if isinstance(checked, web.Response):
            return checked
        posted, key = checked
        take_progress(posted, key)
        return web.Response(body=_TAKEN, status=202, content_type="application/json")

    def fast(
        request: Request, transport: asyncio.Transport, done: Callable[[str], None]
    ) -> Held | None:
        """`arrivals` and `progress` without aiohttp, for a report that passes every check: the
        same book, streams and lines; its token reviewed, if its verdict is not cached, as
        `authenticate` does. Any other is declined (`done(DECLINE)`, nothing written nor
        recorded), and aiohttp's path answers it."""
        arrival = request.path == ARRIVALS_PATH
        auth = request.authorization or b""
        token = auth[7:].strip().decode("ascii") if auth.startswith(b"Bearer ") else ""
        if lookup is None or book.closing or not token or not accepting():
            done(DECLINE)
            return None
        try:
            body = json.loads(request.body)
            posted, mine, name = (_posted_report if arrival else _posted_progress)(body)
        except (ValueError, BadReport):
            done(DECLINE)
            return None
        who = lookup(token)
        if who is not None:
            return take(request, posted, mine, name, who, transport, done)
        nonlocal pending
        if pending >= limits.pending:
            done(DECLINE)
            return None
        pending += 1
        review = _Review(asyncio.ensure_future(authenticate(token)))

        def reviewed(task: asyncio.Future[Identity]) -> None:
            nonlocal pending
            pending -= 1
            if task.cancelled():
                return  # the agent hung up
            counter = metrics.ARRIVAL_REPORTS if arrival else metrics.PROGRESS_REPORTS
            error = task.exception()
            if error is None:
                who = task.result()
                review.held = take(request, posted, mine, name, who, transport, done)
                return
            if isinstance(error, Unauthorized):
                answer = _refusal(401, "unauthorized", str(error), counter)
            else:  # the apiserver did not answer the review: try again later
                log.warning("TokenReview failed: %s", error)
                answer = _refusal(503, "unavailable", "cannot check the token now", counter)
            transport.write(answer)
            done(CLOSE if request.close else KEEP)

        review.task.add_done_callback(reviewed)
        return review

    def take(
        request: Request,
        posted: Posted | PostedProgress,
        mine: Identity,
        name: str,
        who: Identity,
        transport: asyncio.Transport,
        done: Callable[[str], None],
    ) -> Held | None:
        """`fast`, the token's verdict known."""
        key = f"{mine.namespace}/{name}"
        obj = job(key) if who == mine else None
        if obj is None or pod_job(mine.namespace, mine.pod) != name:
            done(DECLINE)  # refused: aiohttp's path says why
            return None
        # What a held stream keeps of its request: not the request (its token is ~1 KiB).
        last = CLOSE if request.close else KEEP
        close = b"Connection: close\r\n" if request.close else b""
        if isinstance(posted, PostedProgress):
            take_progress(posted, key)
            transport.write(_TAKEN_HEAD + date_header() + close + b"\r\n" + _TAKEN)
            done(last)
            return None
        pod = (posted.namespace, posted.pod)
        if len(held) >= limits.streams and pod not in held:
            done(DECLINE)
            return None
        me = open_stream(posted, key, transport)
        line = line_of(key, obj)
        framed = b"%x\r\n%b\r\n" % (len(line), line)
        transport.write(_STREAM_HEAD + date_header() + close + b"\r\n" + framed)
        me.sent = line
        done(STREAMING)

        def ended(why: str) -> None:
            let_go(key, pod, me)
            if why == _HUNG_UP or transport.is_closing():
                done(CLOSE)
                return
            transport.write(b"0\r\n\r\n")  # the answer's end: the connection stays good
            done(last)

        me.on_end = ended
        if (obj.get("status") or {}).get("phase") in TERMINAL:
            me.end(_ENDED)
        else:
            by_job.setdefault(key, {})[pod] = me
        return me

    async def closing(_: web.Application) -> None:
        book.close()

    async def beating(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(heartbeats())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(ARRIVALS_PATH, arrivals)
    app.router.add_post(PROGRESS_PATH, progress)
    if lookup is not None:
        app[FAST_PATH] = Route(frozenset({ARRIVALS_PATH, PROGRESS_PATH}), fast, MAX_BODY_BYTES)
    app.on_shutdown.append(closing)
    app.cleanup_ctx.append(beating)
    return app


_SUPERSEDED, _ENDED, _HUNG_UP = "superseded", "ended", HUNG_UP
_TAKEN = json.dumps({"kind": "Status", "status": "Success"}).encode()
"""A progress summary's answer, encoded once: ~167 of them a second at N=5000."""
_TAKEN_HEAD = (
    b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: %d\r\n" % len(_TAKEN)
)
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
    + f"{PIPELINING_HEADER}: {PIPELINING_SUPERSEDES}\r\n".encode()
)
"""The fast path's answers' heads, as aiohttp writes them (less its `Server`), before `Date`.
A stream's says that the agent's next report may follow on its connection, behind it
(`controller.runtime.fastpath`: a request sent behind a streaming answer ends it)."""


@dataclass(eq=False, slots=True)
class _Stream:
    """One agent's open answer: the pod and UID its report is of, the connection, the line
    it was sent last, and why it ended once it does (`why`; told to `ended`, the aiohttp
    handler's, or to `on_end`, the fast path's)."""

    namespace: str
    pod: str
    uid: str
    transport: asyncio.Transport
    sent: bytes | None = None
    why: str | None = None
    ended: asyncio.Future[str] | None = None
    on_end: Callable[[str], None] | None = None

    @property
    def streaming(self) -> bool:
        """A fast-path stream under way (`on_end` is set until it ends): a request sent behind
        it on its connection ends it (`fastpath.PIPELINED`, as a superseding report would)."""
        return self.on_end is not None

    def end(self, why: str) -> None:
        if self.why is not None:
            return
        self.why = why
        if self.ended is not None:
            self.ended.set_result(why)
        on_end, self.on_end = self.on_end, None  # it holds this stream: no cycle left for the GC
        if on_end is not None:
            on_end(why)


class _Review:
    """A fast-path report whose token is being reviewed, then (`held`) its stream."""

    __slots__ = ("held", "task")

    def __init__(self, task: asyncio.Future[Identity]) -> None:
        self.task = task
        self.held: Held | None = None

    @property
    def streaming(self) -> bool:
        return self.held is not None and self.held.streaming

    def end(self, why: str) -> None:
        if self.held is not None:
            self.held.end(why)
        else:
            self.task.cancel()


def _failure(status: int, message: str) -> dict[str, Any]:
    """A refusal's body, a Kubernetes `Status`."""
    return {"kind": "Status", "status": "Failure", "code": status, "message": message}


def _refusal(status: int, result: str, message: str, counter: Counter) -> bytes:
    """`_error`'s answer as the fast path writes it."""
    counter.labels(result).inc()
    data = json.dumps(_failure(status, message)).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\n" % (
        status,
        HTTPStatus(status).phrase.encode(),
    ) + b"Content-Length: %d\r\n%b\r\n%b" % (len(data), date_header(), data)


def _posted_report(body: Any) -> tuple[Posted, Identity, str]:
    posted = parse_report(body)
    return posted, Identity(posted.namespace, posted.pod, posted.report.uid), posted.job


def _posted_progress(body: Any) -> tuple[PostedProgress, Identity, str]:
    posted = parse_progress(body)
    return posted, Identity(posted.namespace, posted.pod, posted.uid), posted.job


def _error(
    status: int,
    result: str,
    message: str,
    counter: Counter = metrics.ARRIVAL_REPORTS,
    headers: dict[str, str] | None = None,
) -> web.Response:
    counter.labels(result).inc()
    return web.json_response(_failure(status, message), status=status, headers=headers)


def _not_leading(counter: Counter = metrics.ARRIVAL_REPORTS) -> web.Response:
    """503 from a replica that does not lead (or whose caches are not synced), and the
    connection closed with it: the Service pins a kept-alive connection to the pod it chose,
    and an agent whose pooled connection reached this replica while it led would otherwise
    send every later report here, a standby, for as long as the connection lives (a progress
    summary is not retried elsewhere). Reconnecting, it reaches the leader."""
    response = _error(503, "unavailable", "not leading (or caches not synced)", counter)
    response.force_close()
    return response


def _busy(limits: Limits, why: str, counter: Counter = metrics.ARRIVAL_REPORTS) -> web.Response:
    return _error(
        429,
        "throttled",
        f"too many requests ({why}): retry after {limits.retry_after_seconds}s",
        counter,
        {"Retry-After": str(limits.retry_after_seconds)},
    )
