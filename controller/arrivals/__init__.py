"""Direct arrival: agents report to the controller instead of writing their pod (DESIGN.md
section 3, "Scale"). Owns the endpoint `POST /v1/arrivals`, who may use it, the book of reports
it holds, and how a report joins the pod's view for `plan`.

A report is `(pod UID, epoch, optional trainer exit)`, the same facts as the pod annotations
`gangjob.io/epoch` and `gangjob.io/exit`, and `plan` reads both channels alike: whichever says
the later epoch wins. The answer to a report is a stream of the GangJob's state, one JSON line
per change of `status.epoch`, `barrierEpoch` or `phase` in this controller's cache (so only
what is stored in the apiserver), which spares every agent its own watch.

Reports live in memory only, and that is safe: an agent holds its report's stream open and
sends the report again when it breaks (a restarted or new leader), or falls back to the
annotation; once the barrier of an epoch is open `plan` knows from the status alone that every
worker present arrived at it.

Who may report: the agent shows a projected service-account token with the audience
`gangjob.io/arrival` (useless against the apiserver), checked once by a TokenReview and then
cached; the token is bound to the pod, and the pod it names must be the one reported for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from api.constants import ARRIVAL_AUDIENCE, ARRIVALS_PATH
from api.v1alpha1 import Phase
from controller.policy.classify import all_containers_restarting
from controller.policy.views import PodView
from controller.runtime import metrics

log = logging.getLogger(__name__)

__all__ = [
    "ARRIVAL_AUDIENCE",
    "ArrivalBook",
    "Identity",
    "Report",
    "TokenAuthenticator",
    "Unauthorized",
    "make_app",
    "parse_report",
]

HEARTBEAT_SECONDS = 30.0
"""The state line is sent again this often on an idle stream: the agent's inactivity timeout
(90 s) tells a dead controller from a quiet gang."""
TOKEN_CACHE_SECONDS = 3600.0
"""At most this long, and never past the token's own `exp`: a gang of 5000 re-reviewing every
token in the middle of a restart costs the apiserver 5000 requests (seen at N=5000 with a
10-minute cache). A pod's projected token is rotated by the kubelet well before it expires."""
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})
JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Report:
    """What an agent said last: it arrived at `epoch`; `exit` = (epoch, code or None)."""

    uid: str
    epoch: int
    exit: tuple[int, int | None] | None = None

    def supersedes(self, other: Report) -> bool:
        """Whether this report replaces `other` (same pod): a later epoch, or at the same epoch
        an exit where there was none."""
        if self.uid != other.uid:
            return True
        return (self.epoch, self.exit is not None) >= (other.epoch, other.exit is not None)


@dataclass(frozen=True)
class Identity:
    """The pod a token is bound to."""

    namespace: str
    pod: str
    uid: str


@dataclass(frozen=True)
class Posted:
    """A parsed report request."""

    namespace: str
    job: str
    pod: str
    report: Report


class BadReport(ValueError):
    """The body is not a report; the message names the field."""


class Unauthorized(Exception):
    """The token is not valid for this endpoint."""


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
    return Posted(text("namespace"), text("job"), text("pod"), Report(text("uid"), at, exit))


def with_report(view: PodView, report: Report | None) -> PodView:
    """The pod's view with an agent's direct report merged in: the later of the annotation's
    epoch and the report's, and the exit report at the later epoch."""
    if report is None or report.uid != view.uid:
        return view
    if all_containers_restarting(view):
        # The report came the fast way and can overtake the kubelet's status write in our pod
        # cache: the condition may be the restart the agent has already come back from. Until
        # the cache catches up, the pod counts where its own status puts it; a real failure
        # after arriving is not lost, its agent reports it (`exit`) once restarted.
        return view
    arrived = view.arrived_epoch
    if arrived is None or report.epoch > arrived:
        arrived = report.epoch
    exit = view.reported_exit
    if report.exit is not None and (exit is None or report.exit[0] >= exit[0]):
        exit = report.exit
    if (arrived, exit) == (view.arrived_epoch, view.reported_exit):
        return view
    return dataclasses.replace(view, arrived_epoch=arrived, reported_exit=exit)


class ArrivalBook:
    """The reports the agents hold, by pod, and a wake-up per GangJob for their streams."""

    def __init__(self) -> None:
        self._reports: dict[tuple[str, str], Report] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self.closing = False
        """The server is stopping: streams end now (their agents report to the next leader)."""

    def close(self) -> None:
        self.closing = True
        for key in list(self._changed):
            self.job_changed(key)

    def record(self, namespace: str, pod: str, report: Report) -> bool:
        """Keeps `report` unless the pod said something later already; True if kept."""
        key = (namespace, pod)
        held = self._reports.get(key)
        if held is not None and not report.supersedes(held):
            return False
        self._reports[key] = report
        return True

    def get(self, namespace: str, pod: str) -> Report | None:
        return self._reports.get((namespace, pod))

    def forget(self, namespace: str, pod: str, uid: str) -> None:
        """The pod is gone: its reports go with it (a new pod of that name reports anew)."""
        held = self._reports.get((namespace, pod))
        if held is not None and held.uid == uid:
            del self._reports[(namespace, pod)]

    def apply(self, view: PodView) -> PodView:
        return with_report(view, self._reports.get((view.namespace, view.name)))

    def job_changed(self, key: str) -> None:
        """Wakes the streams of GangJob `key` (namespace/name)."""
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    def changed(self, key: str) -> asyncio.Event:
        event = self._changed.get(key)
        if event is None:
            event = self._changed[key] = asyncio.Event()
        return event


class TokenAuthenticator:
    """Checks a token by TokenReview (audience `gangjob.io/arrival`), cached by its hash.

    `review` posts a TokenReview and returns the answer (`controller.k8s` does it)."""

    def __init__(
        self,
        review: Callable[[JsonDict], Awaitable[JsonDict]],
        *,
        audience: str = ARRIVAL_AUDIENCE,
        cache_seconds: float = TOKEN_CACHE_SECONDS,
        concurrency: int = 32,
    ) -> None:
        self._review = review
        self.audience = audience
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Identity]] = {}
        # A gang of thousands starts together: its first reports queue here, not at the server.
        self._slots = asyncio.Semaphore(concurrency)
        self.reviews = 0

    async def authenticate(self, token: str) -> Identity:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        async with self._slots:
            self.reviews += 1
            answer = await self._review(
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token, "audiences": [self.audience]},
                }
            )
        identity = identity_of(answer, self.audience)
        if len(self._cache) > 100_000:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        ttl = self._cache_seconds
        expires = token_expiry(token)
        if expires is not None:
            ttl = min(ttl, expires - time.time())
        self._cache[digest] = (now + ttl, identity)
        return identity


def token_expiry(token: str) -> float | None:
    """The `exp` claim (Unix time) of a JWT, read without checking its signature: only to
    bound how long a TokenReview's verdict is kept. None if the token does not say."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def identity_of(review: JsonDict, audience: str) -> Identity:
    """The pod a reviewed token is bound to; `Unauthorized` saying why if none."""
    status = review.get("status") or {}
    if not status.get("authenticated"):
        raise Unauthorized(status.get("error") or "token not authenticated")
    if audience not in (status.get("audiences") or [audience]):
        raise Unauthorized(f"token not issued for the audience {audience}")
    user = status.get("user") or {}
    username = user.get("username") or ""
    extra = user.get("extra") or {}
    pod, uid = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
    if not username.startswith(SA_PREFIX) or len(pod) != 1 or len(uid) != 1:
        raise Unauthorized("not a service-account token bound to a pod")
    namespace = username[len(SA_PREFIX) :].split(":", 1)[0]
    return Identity(namespace, pod[0], uid[0])


def state_line(job: JsonDict) -> bytes:
    """A GangJob's protocol state as one line of the stream (watch-event shaped, so that the
    agent reads it with the parser of its watch)."""
    status = job.get("status") or {}
    obj = {
        "metadata": {"name": (job.get("metadata") or {}).get("name", "")},
        "status": {k: status.get(k) for k in ("epoch", "barrierEpoch", "phase")},
    }
    return json.dumps({"type": "STATE", "object": obj}).encode() + b"\n"


def make_app(
    book: ArrivalBook,
    authenticate: Callable[[str], Awaitable[Identity]],
    job: Callable[[str], JsonDict | None],
    *,
    accepting: Callable[[], bool],
    on_report: Callable[[str], None],
    heartbeat: float = HEARTBEAT_SECONDS,
) -> web.Application:
    """The endpoint. `job(key)` reads the GangJob from the cache; `accepting()` is whether this
    replica leads with synced caches; `on_report(key)` queues the job for a pass."""
    # One line per version of each job, not one per stream: a job change wakes every stream of
    # its gang (thousands), and they all send the same bytes.
    lines: dict[str, tuple[str, bytes]] = {}

    def line_of(key: str, obj: JsonDict) -> bytes:
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        hit = lines.get(key)
        if hit is None or hit[0] != version or not version:
            hit = lines[key] = (version, state_line(obj))
        return hit[1]

    async def arrivals(request: web.Request) -> web.StreamResponse:
        if not accepting():
            return _error(503, "unavailable", "not leading (or caches not synced)")
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return _error(401, "unauthorized", "a bearer token is required")
        try:
            posted = parse_report(await request.json())
        except (ValueError, BadReport) as e:
            return _error(400, "invalid", f"not a report: {e}")
        try:
            who = await authenticate(auth[7:].strip())
        except Unauthorized as e:
            return _error(401, "unauthorized", str(e))
        except Exception as e:  # the apiserver did not answer the review: try again later
            log.warning("TokenReview failed: %s", e)
            return _error(503, "unavailable", "cannot check the token now")
        mine = Identity(posted.namespace, posted.pod, posted.report.uid)
        if who != mine:
            message = f"the token is bound to pod {who.namespace}/{who.pod} (uid {who.uid})"
            return _error(403, "forbidden", message)
        key = f"{posted.namespace}/{posted.job}"
        if job(key) is None:
            return _error(404, "unknown", f"gangjob {key} not found")
        metrics.ARRIVAL_REPORTS.labels("accepted").inc()
        if book.record(posted.namespace, posted.pod, posted.report):
            on_report(key)
        metrics.ARRIVAL_STREAMS.inc()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await _stream(request, response, posted, key)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the agent hung up: it moved on, its pod restarted, or it is gone
        finally:
            metrics.ARRIVAL_STREAMS.dec()
        return response

    async def _stream(
        request: web.Request, response: web.StreamResponse, posted: Posted, key: str
    ) -> None:
        """The job's state while the report holds; returns when it no longer does."""
        sent: bytes | None = None
        last_write = 0.0
        while not book.closing:
            waiter = book.changed(key)
            obj = job(key)
            if obj is None:
                lines.pop(key, None)
                break  # deleted: the agent sees its watch end, or its pod go
            line = line_of(key, obj)
            if line != sent or time.monotonic() - last_write >= heartbeat:
                await response.write(line)
                sent, last_write = line, time.monotonic()
            if (obj.get("status") or {}).get("phase") in TERMINAL:
                break
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError  # the agent hung up
            held = book.get(posted.namespace, posted.pod)
            if held is None or held.uid != posted.report.uid:
                break  # the pod is gone, or replaced
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), heartbeat)

    async def closing(_: web.Application) -> None:
        book.close()

    app = web.Application()
    app.router.add_post(ARRIVALS_PATH, arrivals)
    app.on_shutdown.append(closing)
    return app


def _error(status: int, result: str, message: str) -> web.Response:
    metrics.ARRIVAL_REPORTS.labels(result).inc()
    body = {"kind": "Status", "status": "Failure", "code": status, "message": message}
    return web.json_response(body, status=status)
