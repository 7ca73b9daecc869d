"""List and watch: paged lists, and watches that resume from the last resourceVersion seen.

A watch asks for bookmarks and passes them on, restarts after the server-side timeout or a
broken stream, and raises `Gone` when the apiserver no longer serves its resourceVersion, which
tells the caller to list again. A stream silent for longer than `inactivity_timeout` is taken
for dead. Non-events on the stream (an HTML page from a proxy, an ERROR Status) become
`ApiError`s, never objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import NamedTuple

import aiohttp

from controller.k8s.errors import ApiError, TransportError, error_from_response, error_from_status
from controller.k8s.kinds import JsonDict, ResourceKind
from controller.k8s.transforms import Transform
from controller.k8s.transport import Query, Transport, count_request

__all__ = ["ObjectList", "WatchEvent", "list_objects", "selector", "watch_events"]

log = logging.getLogger(__name__)

WATCH_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")


class ObjectList(NamedTuple):
    """A list's items and the resourceVersion to start watching from."""

    items: list[JsonDict]
    resource_version: str


class WatchEvent(NamedTuple):
    """(type, object): ADDED | MODIFIED | DELETED | BOOKMARK; a bookmark's object carries only
    `metadata.resourceVersion`."""

    type: str
    object: JsonDict


def selector(labels: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    """An equality label selector: `a=b,c=d`."""
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return ",".join(f"{k}={v}" for k, v in pairs)


def _selectors(label_selector: str | None, field_selector: str | None) -> Query:
    query: Query = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


async def list_objects(
    transport: Transport,
    kind: ResourceKind,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = 500,
    request_timeout: float | None = None,
    transform: Transform | None = None,
) -> ObjectList:
    """Every object (paged), and the list's resourceVersion. `Gone` if a page expired.

    `transform` is applied to each object as its page arrives: only one page of whole objects
    is held at a time (5000 whole pods would take ~300 MB, and their memory is not given back
    to the system once trimmed objects are interleaved with it)."""
    items: list[JsonDict] = []
    resource_version = ""
    token: str | None = None
    while True:
        query = _selectors(label_selector, field_selector)
        query.append(("limit", str(page_size)))
        if token:
            query.append(("continue", token))
        page = await transport.call(
            "GET", kind, kind.path(namespace), query=query, request_timeout=request_timeout
        )
        page_items = page.pop("items", None) or []
        items.extend(page_items if transform is None else map(transform, page_items))
        del page_items
        meta = page.get("metadata") or {}
        if not resource_version:
            # Every page is served from the first page's snapshot.
            resource_version = str(meta.get("resourceVersion") or "")
        token = meta.get("continue") or None
        if not token:
            return ObjectList(items, resource_version)


async def watch_events(
    transport: Transport,
    kind: ResourceKind,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    resource_version: str | None = None,
    timeout_seconds: int = 300,
    inactivity_timeout: float = 90.0,
    max_failures: int = 5,
) -> AsyncGenerator[WatchEvent, None]:
    """Events from `resource_version` on, across server-side timeouts and broken streams.

    Raises `Gone` when that resourceVersion is no longer served: list again. Raises the last
    error after `max_failures` broken streams in a row without an event between. Bookmarks
    are asked for and passed on. `inactivity_timeout` should exceed the apiserver's bookmark
    period (about a minute), so only a dead stream trips it. Close it with
    `contextlib.aclosing` (or by exhausting it) to release the connection.
    """
    rv = resource_version
    failures = 0
    while True:
        query = _selectors(label_selector, field_selector)
        query += [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if rv:
            query.append(("resourceVersion", rv))
        stream = _watch_once(
            transport, kind, kind.path(namespace), query, timeout_seconds, inactivity_timeout
        )
        try:
            async with contextlib.aclosing(stream):
                async for event in stream:
                    failures = 0
                    event_rv = (event.object.get("metadata") or {}).get("resourceVersion")
                    if event_rv:
                        rv = str(event_rv)
                    yield event
        except ApiError as error:
            if not error.retriable:
                raise
            failures += 1
            if failures >= max_failures:
                raise
            delay = transport.retry_policy.wait(failures, error)
            log.warning(
                "watch %s broke (%s); resuming from %s in %.2fs", kind.resource, error, rv, delay
            )
            await asyncio.sleep(delay)
        # A clean end is the server-side timeout: resume at once from the last version seen.


async def _watch_once(
    transport: Transport,
    kind: ResourceKind,
    path: str,
    query: Query,
    timeout_seconds: int,
    inactivity_timeout: float,
) -> AsyncGenerator[WatchEvent, None]:
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=transport.request_timeout,
        sock_connect=transport.request_timeout,
        sock_read=inactivity_timeout,
    )
    resp = await transport.open("GET", kind, path, query=query, client_timeout=timeout, count=False)
    try:
        count_request(resp.status, "WATCH", kind)
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, await resp.read(), resp.headers)
        while True:
            try:
                line = await resp.content.readline()
            except (aiohttp.ClientError, TimeoutError) as error:
                raise TransportError(f"watch stream: {error!r}") from error
            if not line:
                return
            if not line.strip():
                continue
            event = _parse_watch_line(line)
            if event is not None:
                yield event
    finally:
        resp.close()


def _parse_watch_line(line: bytes) -> WatchEvent | None:
    """One watch event; a non-event (HTML from a proxy, an ERROR Status) becomes an ApiError,
    an event of a type this client does not know is logged and skipped (None)."""
    try:
        raw = json.loads(line)
    except ValueError as error:
        raise ApiError(
            502, "BadWatchEvent", line[:200].decode("utf-8", "replace").strip()
        ) from error
    if not isinstance(raw, dict):
        raise ApiError(502, "BadWatchEvent", repr(raw)[:200])
    etype = raw.get("type")
    obj = raw.get("object")
    if not isinstance(etype, str) or not isinstance(obj, dict):
        if "code" in raw:  # a bare Status instead of an event
            raise error_from_status(raw)
        raise ApiError(502, "BadWatchEvent", repr(raw)[:200])
    if etype == "ERROR":
        raise error_from_status(obj)
    if etype not in WATCH_EVENT_TYPES:
        log.warning("ignoring watch event of unknown type %r", etype)
        return None
    return WatchEvent(etype, obj)
