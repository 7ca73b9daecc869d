"""Waiting in tests: on a watch, with a deadline; never a sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from controller.k8s import PODS, JsonDict, Kube, NotFound, ResourceKind


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


async def wait_for_pods(
    kube: Kube,
    namespace: str,
    predicate: Callable[[list[JsonDict]], bool],
    timeout: float = 30.0,
    what: str = "",
    label_selector: str | None = None,
) -> list[JsonDict]:
    """Returns the namespace's pods once ``predicate`` holds for all of them together (a list,
    then a watch from its resourceVersion); fails the test after ``timeout``."""
    pods: dict[str, JsonDict] = {}

    async def run() -> list[JsonDict]:
        listed = await kube.list(PODS, namespace, label_selector=label_selector)
        pods.update({p["metadata"]["uid"]: p for p in listed.items})
        if predicate(list(pods.values())):
            return list(pods.values())
        stream = kube.watch(
            PODS,
            namespace,
            label_selector=label_selector,
            resource_version=listed.resource_version,
        )
        async with contextlib.aclosing(stream):
            async for ev in stream:
                uid = ev.object.get("metadata", {}).get("uid", "")
                if ev.type == "DELETED":
                    pods.pop(uid, None)
                elif ev.type in ("ADDED", "MODIFIED"):
                    pods[uid] = ev.object
                else:
                    continue
                if predicate(list(pods.values())):
                    return list(pods.values())
        raise AssertionError("watch ended")

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        seen = sorted(
            (p["metadata"]["name"], p.get("spec", {}).get("nodeName")) for p in pods.values()
        )
        raise AssertionError(
            f"pods of {namespace}: not {what or 'as expected'} after {timeout}s; last seen "
            f"(name, node): {seen}"
        ) from None
