"""Arrival reported to the controller directly, the pod annotation kept as the durable fallback
(docs/design.md section 3.4).

One POST per arrival to the controller's `/v1/arrivals`: the controller records the report in
memory and answers with a stream of the GangJob's state (`status.epoch`, `barrierEpoch`,
`phase`), one JSON line per change, for as long as the report holds. A restarted agent thus
needs no apiserver request at all: no annotation write, no read of its pod, no new watch. The
apiserver sees O(1) writes per gang restart beyond the kubelet's own.

The report lives in the controller's memory only, so the agent keeps it alive: when the stream
breaks (controller restarted, leadership moved) the agent sends it again. If the controller
cannot be reached for `Config.direct_fallback_seconds`, or refuses the agent's token, the
agent writes the annotation instead, exactly as without this channel, and watches the apiserver.
A controller that answers 429 is reachable, only busy: the agent waits as told and reports again,
however long that takes.

Beside the arrival, `ProgressChannel` POSTs the trainer's progress summaries to `/v1/progress`
with the same token (docs/progress.md), best effort and never by annotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from agent.apiclient import ApiError, ClientError, JsonDict, Pipe
from agent.arrival import Arrival
from agent.config import Config
from agent.progress import Summary
from agent.protocol import Backoff, JobState
from api.constants import ARRIVALS_PATH, PROGRESS_PATH

STREAM_INACTIVITY_SECONDS = 90.0
"""The controller writes the state line again every 30 s; this long silent is a dead stream."""
BUSY_RETRY_MAX_SECONDS = 30.0
"""A 429's `Retry-After` is followed up to this long."""
SUPERSEDED_GRACE_SECONDS = 5.0
"""A report superseded by the agent's next one keeps its stream until the controller ends it
(at a chunk's boundary, so that the connection is kept for a later request), this long at
most."""


class Streamer(Protocol):
    def stream(
        self,
        method: str,
        target: str,
        body: JsonDict | None = None,
        *,
        inactivity_timeout: float = 90.0,
        token: str | None = None,
        pipe: Pipe | None = None,
        behind: Pipe | None = None,
    ) -> AsyncIterator[JsonDict]: ...


class ControllerClient(Streamer, Protocol):
    """What the agent needs of its client to the controller: the arrival stream and a POST."""

    async def post(self, path: str, body: JsonDict, *, token: str | None = None) -> JsonDict: ...


class Refused(Exception):
    """The controller will not take reports from this agent (its token or identity)."""


def report_body(
    config: Config, epoch: int, exit: tuple[int, int] | None, incarnation: str
) -> JsonDict:
    """The JSON the agent POSTs: who it is (pod name and UID, and this agent's incarnation),
    where it arrived, and in the same report a trainer exit as (epoch, code)."""
    return {
        "namespace": config.namespace,
        "job": config.job_name,
        "pod": config.pod_name,
        "uid": config.pod_uid,
        "incarnation": incarnation,
        "epoch": epoch,
        "exit": list(exit) if exit is not None else None,
    }


def progress_body(config: Config, epoch: int, summary: Summary) -> JsonDict:
    """The JSON the agent POSTs to `/v1/progress`: who it is (as in its arrival report), the
    epoch its trainer runs at, and the summary of its progress there (docs/progress.md)."""
    return {
        "namespace": config.namespace,
        "job": config.job_name,
        "pod": config.pod_name,
        "uid": config.pod_uid,
        "epoch": epoch,
        "progress": {
            "step": summary.step,
            "checkpoint": summary.checkpoint,
            "computeSeconds": summary.compute,
            **_compute_window(summary),
            "stepsPerSecond": summary.steps_per_second,
            "idleSeconds": round(summary.idle_seconds, 3),
            "stalled": summary.stalled,
            "malformed": summary.malformed,
            "trainer": None
            if summary.trainer_state is None
            else {"state": summary.trainer_state, "cpuSeconds": summary.trainer_cpu_seconds},
        },
    }


def _compute_window(summary: Summary) -> JsonDict:
    window = summary.compute_window
    if window is None:
        return {}
    return {
        "computeMedianSeconds": window.median,
        "computeSamples": window.samples,
        "computeWindowSeconds": window.seconds,
    }


class ProgressChannel:
    """Progress summaries to the controller, one POST each, with the arrival token. Best effort:
    a summary the controller does not take is not retried (the next one says more), and the
    annotation fallback carries no progress."""

    def __init__(
        self, client: ControllerClient, config: Config, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self._client = client
        self._config = config
        self._log = log
        self._failing = False

    async def send(self, epoch: int, summary: Summary) -> bool:
        try:
            token = _token(self._config)
            await self._client.post(
                PROGRESS_PATH, progress_body(self._config, epoch, summary), token=token
            )
        except (ClientError, Refused) as e:
            # Said once per outage: while the endpoint is down every period fails alike.
            log = self._log.debug if self._failing else self._log.info
            log("progress not sent (%s): it pauses until the controller takes it", e)
            self._failing = True
            return False
        if self._failing:
            self._log.info("progress reaches the controller again")
            self._failing = False
        return True


def _token(config: Config) -> str:
    try:
        token = Path(config.arrival_token_file).read_text().strip()
    except OSError as e:
        raise Refused(f"no token for the controller ({e})") from None
    if not token:
        raise Refused(f"{config.arrival_token_file} is empty")
    return token


class DirectArrival:
    """`Arrival` through the controller. `arrive()` returns once the controller accepted the
    report (or, failing that, once the annotation is written); the report is then held in the
    background until the next `arrive()` or `close()`."""

    def __init__(
        self,
        client: Streamer,
        config: Config,
        fallback: Arrival,
        on_state: Callable[[JobState], None],
        on_fallback: Callable[[], None],
        log: logging.LoggerAdapter[logging.Logger],
        job_gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """`job_gone()` asks the apiserver whether the GangJob still exists (a 404 from the
        controller is checked there before the agent stops reporting)."""
        self._client = client
        self._config = config
        self._fallback = fallback
        self._on_state = on_state
        self._on_fallback = on_fallback
        self._log = log
        self._job_gone = job_gone
        self._hold: asyncio.Task[None] | None = None
        # The held report's stream's connection, on which the next report may be sent ahead
        # of that stream's end (the controller then ends the stream: apiclient.Pipe).
        self._pipe: Pipe | None = None
        # Superseded holds whose streams the controller is ending (their connections kept).
        self._ending: set[asyncio.Task[None]] = set()
        self._streaming: set[asyncio.Task[None]] = set()
        # Drawn when the agent starts, never kept across a restart: a report from another
        # incarnation than the pod's previous one proves to the controller that the pod's
        # containers restarted in between (docs/design.md section 3.5).
        self.incarnation = secrets.token_hex(8)

    async def arrive(self, epoch: int, exit: tuple[int, int] | None = None) -> None:
        older, self._hold = self._hold, None
        pipe, self._pipe = self._pipe, None
        behind = None
        if older is not None and older in self._streaming:
            behind = pipe
            # Its stream ends once the controller has this report (it ends a pod's older
            # stream cleanly), and this report goes on that stream's connection, behind it,
            # where the controller takes one so (else on a kept one): reading the stream to
            # its end keeps the connection, so that a Process gang's restart costs no new
            # connection (nor TLS handshake) per agent.
            self._ending.add(older)
            older.add_done_callback(self._ending.discard)
            asyncio.get_running_loop().call_later(SUPERSEDED_GRACE_SECONDS, older.cancel)
        elif older is not None:
            await _cancel(older)  # retrying or falling back: nothing to keep
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[None] = loop.create_future()
        self._hold = asyncio.create_task(self._run(epoch, exit, accepted, behind))
        # On `accepted` itself, and never cancel it: a cancelled future is done, and a report
        # that neither channel took would look accepted (the trainer's exit then lost).
        await asyncio.wait({accepted, self._hold}, return_when=asyncio.FIRST_COMPLETED)
        if accepted.done() and not accepted.cancelled():
            return
        self._hold.result()  # ended before accepting: raises what the fallback raised

    async def close(self) -> None:
        """Stops holding the report (the controller forgets it once the pod moves on)."""
        hold, self._hold = self._hold, None
        for task in [*self._ending, *([hold] if hold is not None else [])]:
            await _cancel(task)

    async def _run(
        self,
        epoch: int,
        exit: tuple[int, int] | None,
        accepted: asyncio.Future[None],
        behind: Pipe | None = None,
    ) -> None:
        body = report_body(self._config, epoch, exit, self.incarnation)
        backoff = Backoff(self._config.backoff_initial, min(2.0, self._config.backoff_max))
        last: JobState | None = None
        failing_since: float | None = None  # the first failure since the last line read
        me = asyncio.current_task()
        while True:
            pipe = Pipe()
            if self._hold is me:
                self._pipe = pipe
            try:
                stream = self._client.stream(
                    "POST",
                    ARRIVALS_PATH,
                    body,
                    token=_token(self._config),
                    inactivity_timeout=STREAM_INACTIVITY_SECONDS,
                    pipe=pipe,
                    behind=behind,
                )
                behind = None  # a report sent again goes on a connection of its own
                async for event in stream:
                    last = JobState.from_object(_object(event))
                    assert me is not None
                    self._streaming.add(me)
                    if not accepted.done():
                        accepted.set_result(None)
                    if self._hold is me:  # a superseded report's lines are old news
                        self._on_state(last)
                    backoff.reset()
                    failing_since = None
                if (last is not None and last.finished) or self._hold is not me:
                    return  # the controller ended it: the job is over, or a report superseded
                failure = "the controller ended the stream"
            except Refused as e:
                self._log.error("arrival report refused (%s): arriving by annotation", e)
                return await self._fall_back(epoch, exit, accepted)
            except ApiError as e:
                if e.status in (401, 403):
                    self._log.error("the controller refused the arrival report: %s", e)
                    return await self._fall_back(epoch, exit, accepted)
                if e.status == 404 and self._job_gone is not None and await self._job_gone():
                    # Deleted: the pod is garbage now. Neither a report nor the annotation
                    # fallback (a pod write per worker) helps anyone.
                    self._log.warning("gangjob deleted: no more arrival reports")
                    if not accepted.done():
                        accepted.set_result(None)
                    return
                if e.status == 429:
                    # The controller is up and busy: waiting is the cure. Arriving by
                    # annotation instead would only move the load onto the apiserver.
                    delay = min(e.retry_after or backoff.next(), BUSY_RETRY_MAX_SECONDS)
                    self._log.info("controller busy (%s); report again in %.1fs", e, delay)
                    await asyncio.sleep(delay)
                    continue
                failure = str(e)
            except ClientError as e:
                failure = str(e)
            finally:
                if me is not None:
                    self._streaming.discard(me)
            if self._hold is not me:
                return  # superseded: the next report is held now
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= self._config.direct_fallback_seconds:
                self._log.warning(
                    "controller out of reach for %.0fs (%s): arriving by annotation",
                    now - failing_since,
                    failure,
                )
                return await self._fall_back(epoch, exit, accepted)
            delay = backoff.next()
            self._log.info("arrival report at epoch %d: %s; again in %.1fs", epoch, failure, delay)
            await asyncio.sleep(delay)

    async def _fall_back(
        self, epoch: int, exit: tuple[int, int] | None, accepted: asyncio.Future[None]
    ) -> None:
        self._on_fallback()  # the apiserver watch first: the barrier may open any moment
        backoff = Backoff(self._config.backoff_initial, self._config.backoff_max)
        while True:
            try:
                await self._fallback.arrive(epoch, exit)
                break
            except ClientError as e:
                if isinstance(e, ApiError) and e.status in (404, 409) and accepted.done():
                    # The pod is gone, or another of its name took its place (the write is
                    # conditional on our UID): nobody is left to report for.
                    self._log.warning("own pod gone (%s): no more arrival reports", e)
                    return
                if not accepted.done():
                    raise  # the agent's own retry takes it from here
                delay = backoff.next()
                self._log.warning("arrival annotation failed (%s); again in %.1fs", e, delay)
                await asyncio.sleep(delay)
        if not accepted.done():
            accepted.set_result(None)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _object(event: dict[str, Any]) -> dict[str, Any]:
    obj = event.get("object")
    return obj if isinstance(obj, dict) else {}
