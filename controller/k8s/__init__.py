"""The controller's only door to the Kubernetes API (the one module importing kubernetes_asyncio).

Objects travel as raw JSON dicts: the generated model classes cost several times more per
object, and the hot path handles thousands of pods. Every call carries a timeout; 429, 5xx and
broken connections are retried (bounded, jittered); other failures surface as the typed
`ApiError` hierarchy below. Watches resume from the last resourceVersion they saw and raise
`Gone` when the apiserver no longer has it, which tells the caller to list again.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple, Self

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_incluster_config, load_kube_config
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
)

from controller.runtime import metrics

__all__ = [
    "CORE_EVENTS",
    "CRDS",
    "EVENTS",
    "GANGJOBS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "SERVICES",
    "TOKENREVIEWS",
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "JsonDict",
    "Kube",
    "NotFound",
    "ObjectList",
    "ResourceKind",
    "RetryPolicy",
    "TransportError",
    "WatchEvent",
]

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "gangjob-controller/0.1"


# -- resource kinds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the API: enough to build its URLs, nothing more."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """The metrics label: `pods`, `leases.coordination.k8s.io`, ..."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            if namespace is None and name is not None:
                raise ValueError(f"{self.resource} is namespaced: a namespace is required")
            if namespace is not None:
                base += f"/namespaces/{namespace}"
        elif namespace is not None:
            raise ValueError(f"{self.resource} is cluster-scoped: no namespace")
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


PODS = ResourceKind("", "v1", "pods", "Pod")
SERVICES = ResourceKind("", "v1", "services", "Service")
NODES = ResourceKind("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = ResourceKind("", "v1", "namespaces", "Namespace", namespaced=False)
CORE_EVENTS = ResourceKind("", "v1", "events", "Event")
EVENTS = ResourceKind("events.k8s.io", "v1", "events", "Event")
LEASES = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease")
GANGJOBS = ResourceKind("gangjob.io", "v1alpha1", "gangjobs", "GangJob")
CRDS = ResourceKind(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
TOKENREVIEWS = ResourceKind("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)


# -- errors -------------------------------------------------------------------------------------


class ApiError(Exception):
    """A request the apiserver refused (or that never reached it: `TransportError`)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: JsonDict | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        self.retry_after = retry_after

    @property
    def retriable(self) -> bool:
        return self.status == 429 or self.status >= 500


class TransportError(ApiError):
    """The connection failed or timed out: no HTTP status (client-go reports `<error>`)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "TransportError", message)

    @property
    def retriable(self) -> bool:
        return True


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 with reason Conflict: a stale resourceVersion or a failed delete precondition.

    Callers requeue: re-read the object and decide again."""


class AlreadyExists(ApiError):
    pass


class Invalid(ApiError):
    """422: the apiserver rejected the object; `message` names the field and the rule."""

    @property
    def causes(self) -> list[JsonDict]:
        details = (self.body or {}).get("details") or {}
        causes = details.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]


class Forbidden(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion asked for is compacted away: list again, then watch."""


def error_from_response(
    status: int, data: bytes, headers: Mapping[str, str] | None = None
) -> ApiError:
    """The typed error for a non-2xx response, read from its `Status` body when it has one."""
    body: JsonDict | None = None
    reason = ""
    message = ""
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        body = parsed
        reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or "")
    else:
        # A proxy or load balancer in front of the apiserver answers with HTML or plain text.
        message = data[:200].decode("utf-8", "replace").strip()
    retry_after = _retry_after((headers or {}).get("Retry-After"), body)
    return _typed_error(status, reason, message, body, retry_after)


def _typed_error(
    status: int, reason: str, message: str, body: JsonDict | None, retry_after: float | None
) -> ApiError:
    cls: type[ApiError] = ApiError
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 410:
        cls = Gone
    elif status == 422:
        cls = Invalid
    elif status == 403:
        cls = Forbidden
    return cls(status, reason or "Unknown", message, body, retry_after)


def _retry_after(header: str | None, body: JsonDict | None) -> float | None:
    if header:
        try:
            return float(header)
        except ValueError:
            pass
    details = (body or {}).get("details")
    if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int):
        return float(details["retryAfterSeconds"])
    return None


# -- results -------------------------------------------------------------------------------------


class ObjectList(NamedTuple):
    """A list's items and the resourceVersion to start watching from."""

    items: list[JsonDict]
    resource_version: str


class WatchEvent(NamedTuple):
    """(type, object): ADDED | MODIFIED | DELETED | BOOKMARK; a bookmark's object carries only
    `metadata.resourceVersion`."""

    type: str
    object: JsonDict


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one call on 429/5xx/transport errors: bounded in attempts and time."""

    attempts: int = 5
    max_elapsed: float = 30.0
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 10.0

    def wait(self, attempt: int, error: BaseException | None) -> float:
        """Full-jitter exponential backoff, never shorter than the server's Retry-After."""
        ceiling = min(self.max_backoff, self.initial_backoff * 2 ** max(0, attempt - 1))
        delay = random.uniform(0, ceiling)
        if isinstance(error, ApiError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, self.max_retry_after))
        return delay


def _is_retriable(error: BaseException) -> bool:
    return isinstance(error, ApiError) and error.retriable


# -- the client ----------------------------------------------------------------------------------


class Kube:
    """Async access to the Kubernetes API over raw dicts. Use `async with`, or `close()`."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._api = api_client
        self.request_timeout = request_timeout
        self.retry_policy = retry or RetryPolicy()

    # construction / teardown

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 100,
    ) -> Self:
        """A client for the cluster in `path` (default: $KUBECONFIG, then ~/.kube/config)."""
        config = _new_configuration()
        if path is None:
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await load_kube_config(
            config_file=str(path) if path is not None else None,
            context=context,
            client_configuration=config,
            persist_config=False,
        )
        return cls._with_config(config, request_timeout, retry, max_connections)

    @classmethod
    def in_cluster(
        cls,
        *,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 100,
    ) -> Self:
        """A client from the pod's service account (the token file is re-read as it rotates)."""
        config = _new_configuration()
        load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        return cls._with_config(config, request_timeout, retry, max_connections)

    @classmethod
    async def connect(cls, kubeconfig: str | os.PathLike[str] | None = None, **kwargs: Any) -> Self:
        """An explicit kubeconfig, else in-cluster when running in a pod, else $KUBECONFIG."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**kwargs)
        return await cls.from_kubeconfig(kubeconfig, **kwargs)

    @classmethod
    def _with_config(
        cls,
        config: Configuration,
        request_timeout: float,
        retry: RetryPolicy | None,
        max_connections: int,
    ) -> Self:
        # Each open watch holds a pooled connection for minutes: the pool must outsize them.
        config.connection_pool_maxsize = max_connections
        api = ApiClient(configuration=config)
        api.user_agent = USER_AGENT
        return cls(api, request_timeout=request_timeout, retry=retry)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # verbs

    async def get(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        return await self._call(
            "GET", kind, kind.path(namespace, name), request_timeout=request_timeout, retry=retry
        )

    async def list(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        request_timeout: float | None = None,
    ) -> ObjectList:
        """Every object (paged), and the list's resourceVersion. `Gone` if a page expired."""
        items: list[JsonDict] = []
        resource_version = ""
        token: str | None = None
        while True:
            query = _selectors(label_selector, field_selector)
            query.append(("limit", str(page_size)))
            if token:
                query.append(("continue", token))
            page = await self._call(
                "GET", kind, kind.path(namespace), query=query, request_timeout=request_timeout
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not resource_version:
                # Every page is served from the first page's snapshot.
                resource_version = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                return ObjectList(items, resource_version)

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        if namespace is None and kind.namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace")
        return await self._call(
            "POST",
            kind,
            kind.path(namespace),
            body=obj,
            request_timeout=request_timeout,
            retry=retry,
        )

    async def replace(
        self,
        kind: ResourceKind,
        name: str,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        """PUT: `Conflict` when `obj.metadata.resourceVersion` is stale."""
        return await self._call(
            "PUT",
            kind,
            kind.path(namespace, name),
            body=obj,
            request_timeout=request_timeout,
            retry=retry,
        )

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: JsonDict,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        """JSON merge-patch (RFC 7386). Put `metadata.resourceVersion` in `patch` to make it
        conditional: the apiserver then answers `Conflict` if the object moved on."""
        return await self._call(
            "PATCH",
            kind,
            kind.path(namespace, name, subresource),
            body=patch,
            content_type=MERGE_PATCH,
            request_timeout=request_timeout,
            retry=retry,
        )

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        patch: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        """Merge-patch the status subresource (the main resource ignores status changes)."""
        return await self.patch(
            kind,
            name,
            patch,
            namespace,
            subresource="status",
            request_timeout=request_timeout,
            retry=retry,
        )

    async def delete(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        """Delete; with `uid`/`resource_version` only that incarnation (`Conflict` otherwise).

        Returns the object (now carrying a deletionTimestamp) or the apiserver's Status."""
        options: JsonDict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        return await self._call(
            "DELETE",
            kind,
            kind.path(namespace, name),
            body=options,
            request_timeout=request_timeout,
            retry=retry,
        )

    # watch

    async def watch(
        self,
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

        Raises `Gone` when that resourceVersion is no longer served: list again. Raises the
        last error after `max_failures` broken streams in a row without an event between.
        Bookmarks are asked for and passed on. `inactivity_timeout` should exceed the
        apiserver's bookmark period (about a minute), so only a dead stream trips it.
        Close it with `contextlib.aclosing` (or by exhausting it) to release the connection.
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
            stream = self._watch_once(
                kind, kind.path(namespace), query, timeout_seconds, inactivity_timeout
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
                delay = self.retry_policy.wait(failures, error)
                log.warning(
                    "watch %s broke (%s); resuming from %s in %.2fs",
                    kind.resource,
                    error,
                    rv,
                    delay,
                )
                await asyncio.sleep(delay)
            # A clean end is the server-side timeout: resume at once from the last version seen.

    async def _watch_once(
        self,
        kind: ResourceKind,
        path: str,
        query: builtins.list[tuple[str, str]],
        timeout_seconds: int,
        inactivity_timeout: float,
    ) -> AsyncGenerator[WatchEvent, None]:
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.request_timeout,
            sock_connect=self.request_timeout,
            sock_read=inactivity_timeout,
        )
        resp = await self._open("GET", kind, path, query=query, client_timeout=timeout, count=False)
        try:
            _count(resp.status, "WATCH", kind)
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

    # transport

    async def _call(
        self,
        method: str,
        kind: ResourceKind,
        path: str,
        *,
        query: builtins.list[tuple[str, str]] | None = None,
        body: JsonDict | None = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        policy = self.retry_policy
        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.attempts if retry else 1)
            | stop_after_delay(policy.max_elapsed),
            wait=_tenacity_wait(policy),
            retry=retry_if_exception(_is_retriable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._call_once(
                    method, kind, path, query, body, content_type, request_timeout
                )
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _call_once(
        self,
        method: str,
        kind: ResourceKind,
        path: str,
        query: builtins.list[tuple[str, str]] | None,
        body: JsonDict | None,
        content_type: str,
        request_timeout: float | None,
    ) -> JsonDict:
        start = time.perf_counter()
        seconds = request_timeout if request_timeout is not None else self.request_timeout
        resp = await self._open(
            method,
            kind,
            path,
            query=query,
            body=body,
            content_type=content_type,
            client_timeout=aiohttp.ClientTimeout(total=seconds),
        )
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            _count(None, method, kind)
            raise TransportError(f"{method} {path}: {error!r}") from error
        finally:
            resp.release()
        _count(resp.status, method, kind)
        metrics.REST_CLIENT_DURATION.labels(method, kind.resource).observe(
            time.perf_counter() - start
        )
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, data, resp.headers)
        if not data:
            return {}
        result = json.loads(data)
        if not isinstance(result, dict):
            raise ApiError(resp.status, "BadResponse", f"not a JSON object: {data[:200]!r}")
        return result

    async def _open(
        self,
        method: str,
        kind: ResourceKind,
        path: str,
        *,
        query: builtins.list[tuple[str, str]] | None = None,
        body: JsonDict | None = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout,
        count: bool = True,
    ) -> aiohttp.ClientResponse:
        # ApiClient.call_api is the generated client's generic path: it brings authentication
        # (client certificates, rotating bearer tokens) and TLS without any model class.
        # Content-Type is always explicit, so a dict is never sent as the JSON-patch default.
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            if count:
                _count(None, method, kind)
            raise TransportError(f"{method} {path}: {error!r}") from error
        return resp


def _new_configuration() -> Configuration:
    # Configuration() would copy the process-wide default; we want a blank one of our own.
    config: Configuration = type.__call__(Configuration)
    return config


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query: builtins.list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _count(status: int | None, method: str, kind: ResourceKind) -> None:
    code = "<error>" if status is None else str(status)
    metrics.REST_CLIENT_REQUESTS.labels(code, method, kind.resource).inc()


def _parse_watch_line(line: bytes) -> WatchEvent | None:
    """One watch event; a non-event (HTML from a proxy, an ERROR Status) becomes an ApiError."""
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
            obj, etype = raw, "ERROR"
        else:
            raise ApiError(502, "BadWatchEvent", repr(raw)[:200])
    if etype == "ERROR":
        code = obj.get("code")
        status = code if isinstance(code, int) else 500
        # "too old resource version" arrives as an ERROR event with code 410 on an HTTP 200.
        raise _typed_error(
            status,
            str(obj.get("reason") or "Unknown"),
            str(obj.get("message") or ""),
            obj,
            _retry_after(None, obj),
        )
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        log.warning("ignoring watch event of unknown type %r", etype)
        return None
    return WatchEvent(etype, obj)


def _tenacity_wait(policy: RetryPolicy) -> Any:
    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return policy.wait(state.attempt_number, error)

    return wait


def selector(labels: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    """An equality label selector: `a=b,c=d`."""
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return ",".join(f"{k}={v}" for k, v in pairs)
