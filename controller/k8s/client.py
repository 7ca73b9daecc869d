"""`Kube`: the verbs the controller uses on any kind, over raw dicts.

get/list/watch, create, replace (PUT, conditional on the body's resourceVersion), JSON merge
patch of an object or its status, delete with preconditions, and a container's log. Timeouts,
retries and metrics are the transport's; list and watch are `controller.k8s.watch`'s, the log
`controller.k8s.logs`'s.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import Any, Self

from kubernetes_asyncio.client import ApiClient

from controller.k8s.errors import NotFound
from controller.k8s.kinds import JsonDict, ResourceKind
from controller.k8s.logs import pod_log
from controller.k8s.transforms import Transform
from controller.k8s.transport import (
    RetryPolicy,
    Transport,
    in_cluster_api_client,
    kubeconfig_api_client,
)
from controller.k8s.verbs import ObjectApi
from controller.k8s.watch import ObjectList, WatchEvent, list_objects, watch_events

__all__ = ["MERGE_PATCH", "Kube"]

MERGE_PATCH = "application/merge-patch+json"


class Kube(ObjectApi):
    """Async access to the Kubernetes API over raw dicts. Use `async with`, or `close()`."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.transport = Transport(api_client, request_timeout=request_timeout, retry=retry)

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
        api = await kubeconfig_api_client(path, context=context, max_connections=max_connections)
        return cls(api, request_timeout=request_timeout, retry=retry)

    @classmethod
    def in_cluster(
        cls,
        *,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 100,
    ) -> Self:
        """A client from the pod's service account (the token file is re-read as it rotates)."""
        api = in_cluster_api_client(max_connections=max_connections)
        return cls(api, request_timeout=request_timeout, retry=retry)

    @classmethod
    async def connect(cls, kubeconfig: str | os.PathLike[str] | None = None, **kwargs: Any) -> Self:
        """An explicit kubeconfig, else in-cluster when running in a pod, else $KUBECONFIG."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**kwargs)
        return await cls.from_kubeconfig(kubeconfig, **kwargs)

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # reading

    async def served(self, kind: ResourceKind, *, request_timeout: float | None = None) -> bool:
        """Whether the apiserver serves `kind` (its group version's discovery lists it): an
        alpha API is there only when its feature gate and runtime config are on."""
        base = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
        try:
            found = await self.transport.call("GET", kind, base, request_timeout=request_timeout)
        except NotFound:
            return False
        return any(r.get("name") == kind.plural for r in found.get("resources") or [])

    async def get(
        self,
        kind: ResourceKind,
        name: str,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
    ) -> JsonDict:
        return await self.transport.call(
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
        transform: Transform | None = None,
    ) -> ObjectList:
        """Every object (paged), each through `transform` as its page arrives, and the list's
        resourceVersion. `Gone` if a page expired."""
        return await list_objects(
            self.transport,
            kind,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=page_size,
            request_timeout=request_timeout,
            transform=transform,
        )

    def watch(
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
        """Events from `resource_version` on (`controller.k8s.watch.watch_events`): `Gone`
        means list again. Close it with `contextlib.aclosing` to release the connection."""
        return watch_events(
            self.transport,
            kind,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            inactivity_timeout=inactivity_timeout,
            max_failures=max_failures,
        )

    def pod_log(
        self, name: str, namespace: str, container: str, *, follow: bool = False
    ) -> AsyncIterator[str]:
        """The lines of a container's log (`controller.k8s.logs.pod_log`)."""
        return pod_log(self.transport, name, namespace, container, follow=follow)

    # writing

    async def create(
        self,
        kind: ResourceKind,
        obj: JsonDict,
        namespace: str | None = None,
        *,
        request_timeout: float | None = None,
        retry: bool = True,
        dry_run: bool = False,
    ) -> JsonDict:
        """Creates `obj`; with `dry_run`, the apiserver admits, defaults and validates it and
        answers what it would store, storing nothing."""
        if namespace is None and kind.namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace")
        return await self.transport.call(
            "POST",
            kind,
            kind.path(namespace) + ("?dryRun=All" if dry_run else ""),
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
        return await self.transport.call(
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
        return await self.transport.call(
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
        return await self.transport.call(
            "DELETE",
            kind,
            kind.path(namespace, name),
            body=options,
            request_timeout=request_timeout,
            retry=retry,
        )
