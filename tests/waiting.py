"""Waiting in tests: on a watch, with a deadline; never a sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from controller.k8s import JsonDict, Kube, NotFound, ResourceKind


async def wait_for(
    kube: Kube,
    kind: ResourceKind,
    name: str,
    namespace: str | None,
    predicate: Callable[[JsonDict], bool],
    timeout: float = 30.0,
    what: str = "",
) -> JsonDict:
    """Returns the object once ``predicate`` holds for it; fails the test after ``timeout``.

    Reads the object, then watches it from that resourceVersion, so no change is missed
    between the read and the watch.
    """
    last: JsonDict = {}

    async def run() -> JsonDict:
        nonlocal last
        rv: str | None = None
        try:
            last = await kube.get(kind, name, namespace)
            if predicate(last):
                return last
            rv = last["metadata"]["resourceVersion"]
        except NotFound:
            pass
        stream = kube.watch(
            kind, namespace, field_selector=f"metadata.name={name}", resource_version=rv
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type in ("ADDED", "MODIFIED"):
                    last = ev.object
                    if predicate(last):
                        return last
        raise AssertionError("watch ended")

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        state = last.get("status", last) if last else "(never seen)"
        raise AssertionError(
            f"{kind.kind} {namespace}/{name}: not {what or 'as expected'} after {timeout}s; "
            f"last seen: {state}"
        ) from None


async def wait_gone(
    kube: Kube, kind: ResourceKind, name: str, namespace: str | None, timeout: float = 30.0
) -> None:
    """Returns once the object no longer exists."""

    async def run() -> None:
        try:
            obj = await kube.get(kind, name, namespace)
        except NotFound:
            return
        stream = kube.watch(
            kind,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=obj["metadata"]["resourceVersion"],
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                if ev.type == "DELETED":
                    return

    try:
        await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(
            f"{kind.kind} {namespace}/{name} still there after {timeout}s"
        ) from None
