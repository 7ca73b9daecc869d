"""The HTTP transport to the apiserver: the authenticated session, timeouts, bounded retries and
the `rest_client_*` metrics.

`ApiClient.call_api` is kubernetes_asyncio's generic request path: it brings authentication
(client certificates, rotating bearer tokens) and TLS without any generated model class. Every
call carries a timeout; 429, 5xx and broken connections are retried with jittered backoff,
bounded in attempts and time.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

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

from controller.k8s.errors import ApiError, TransportError, error_from_response
from controller.k8s.kinds import JsonDict, ResourceKind
from controller.runtime import metrics

__all__ = [
    "USER_AGENT",
    "Query",
    "RetryPolicy",
    "Transport",
    "count_request",
    "in_cluster_api_client",
    "kubeconfig_api_client",
]

USER_AGENT = "gangjob-controller/0.1"

Query = list[tuple[str, str]]


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


async def kubeconfig_api_client(
    path: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    max_connections: int = 100,
) -> ApiClient:
    """A session for the cluster in `path` (default: $KUBECONFIG, then ~/.kube/config)."""
    config = _new_configuration()
    if path is None:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    await load_kube_config(
        config_file=str(path) if path is not None else None,
        context=context,
        client_configuration=config,
        persist_config=False,
    )
    return _api_client(config, max_connections)


def in_cluster_api_client(*, max_connections: int = 100) -> ApiClient:
    """A session from the pod's service account (the token file is re-read as it rotates)."""
    config = _new_configuration()
    load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    return _api_client(config, max_connections)


def _new_configuration() -> Configuration:
    # Configuration() would copy the process-wide default; we want a blank one of our own.
    config: Configuration = type.__call__(Configuration)
    return config


def _api_client(config: Configuration, max_connections: int) -> ApiClient:
    # Each open watch holds a pooled connection for minutes: the pool must outsize them.
    config.connection_pool_maxsize = max_connections
    api = ApiClient(configuration=config)
    api.user_agent = USER_AGENT
    return api


def count_request(status: int | None, method: str, kind: ResourceKind) -> None:
    """One `rest_client_requests_total` sample; no status is a transport failure."""
    code = "<error>" if status is None else str(status)
    metrics.REST_CLIENT_REQUESTS.labels(code, method, kind.resource).inc()


class Transport:
    """Requests over one `ApiClient` session, with timeouts, retries and metrics."""

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

    async def close(self) -> None:
        await self._api.close()

    async def call(
        self,
        method: str,
        kind: ResourceKind,
        path: str,
        *,
        query: Query | None = None,
        body: JsonDict | None = None,
        content_type: str = "application/json",
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        """One request and its JSON object answer; retried per the policy unless `retry` is
        False. Raises the typed `ApiError` of a refusal."""
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
        query: Query | None,
        body: JsonDict | None,
        content_type: str,
        request_timeout: float | None,
    ) -> JsonDict:
        start = time.perf_counter()
        seconds = request_timeout if request_timeout is not None else self.request_timeout
        resp = await self.open(
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
            count_request(None, method, kind)
            raise TransportError(f"{method} {path}: {error!r}") from error
        finally:
            resp.release()
        count_request(resp.status, method, kind)
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

    async def open(
        self,
        method: str,
        kind: ResourceKind,
        path: str,
        *,
        query: Query | None = None,
        body: JsonDict | None = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout,
        count: bool = True,
    ) -> aiohttp.ClientResponse:
        """The response, its body unread (a watch streams it): one attempt, no retry. The
        caller closes it. A failure to connect is counted unless `count` is False."""
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
                count_request(None, method, kind)
            raise TransportError(f"{method} {path}: {error!r}") from error
        return resp


def _is_retriable(error: BaseException) -> bool:
    return isinstance(error, ApiError) and error.retriable


def _tenacity_wait(policy: RetryPolicy) -> Any:
    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return policy.wait(state.attempt_number, error)

    return wait
