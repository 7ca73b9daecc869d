"""The trainer's log of one rank (`Client.logs`, `gangjob logs`), followed across in-place
restarts (a `Pod`-mode restart starts a new container, whose log follows the old one's) until the
job ends."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TextIO

from api.naming import pod_name
from api.v1alpha1 import parse_gangjob
from controller.k8s import GANGJOBS, PODS, ApiError, JsonDict, Kube, NotFound
from gangjob.model import TERMINAL


def trainer_instance(pod: JsonDict, container: str) -> tuple[str | None, bool]:
    """The trainer container's current instance (its containerID) and whether it runs."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return status.get("containerID") or None, "running" in (status.get("state") or {})
    return None, False


async def stream_logs(
    kube: Kube, ns: str, job_name: str, rank: int, follow: bool, out: TextIO
) -> None:
    """Writes the log of `job_name`'s worker of `rank` to `out`; with `follow`, until the job
    has ended and its last trainer instance stopped."""
    job = await kube.get(GANGJOBS, job_name, ns)
    container = parse_gangjob(job).spec.trainer_container_name
    name = pod_name(job_name, rank)
    printed: set[str] = set()
    while True:
        try:
            pod = await kube.get(PODS, name, ns)
        except NotFound:
            if printed:
                return  # the job ended and its pods went
            raise
        instance, running = trainer_instance(pod, container)
        if instance is not None and instance not in printed:
            printed.add(instance)
            await print_instance(kube, name, ns, container, follow, out)
            continue
        if not follow:
            return
        finished = await _finished(kube, ns, job_name)
        if not running and finished:
            return
        await _next_instance(kube, ns, job_name, name, container, printed, finished)


async def print_instance(
    kube: Kube, name: str, ns: str, container: str, follow: bool, out: TextIO
) -> None:
    """The log of the container's current instance. A kubelet that cannot go on following (the
    container was removed by a restart, no inotify left) ends the stream with its error, a last
    line without a newline: that goes to stderr, and what the instance logged is read once more
    without following, from where the stream stopped."""
    written, note = await _copy(kube, name, ns, container, follow, 0, out)
    if note is None:
        return
    print(f"gangjob logs: the kubelet: {note}", file=sys.stderr, flush=True)
    if follow:
        await _copy(kube, name, ns, container, False, written, out)


async def _copy(
    kube: Kube, name: str, ns: str, container: str, follow: bool, skip: int, out: TextIO
) -> tuple[int, str | None]:
    """Writes the lines after the first `skip`; (lines seen, a last line without newline)."""
    seen = 0
    with contextlib.suppress(ApiError):  # it ended or was replaced meanwhile
        async for line in kube.pod_log(name, ns, container, follow=follow):
            if not line.endswith("\n"):
                return seen, line
            seen += 1
            if seen > skip:
                out.write(line)
                out.flush()
    return seen, None


async def _finished(kube: Kube, ns: str, job: str) -> bool:
    try:
        found = await kube.get(GANGJOBS, job, ns)
    except NotFound:
        return True
    return (found.get("status") or {}).get("phase") in TERMINAL


async def _next_instance(
    kube: Kube,
    ns: str,
    job: str,
    name: str,
    container: str,
    printed: set[str],
    finished: bool,
) -> None:
    """Waits until the pod shows a trainer instance not yet printed or its trainer not running,
    or is deleted, or (unless it has already) the job ends. A finished job keeps its pods: the
    pod alone would never say that nothing more comes."""
    waits = [asyncio.create_task(_pod_moves(kube, ns, name, container, printed))]
    if not finished:
        waits.append(asyncio.create_task(_job_ends(kube, ns, job)))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    for task in waits:
        if task.done() and not task.cancelled():
            error = task.exception()
            if error is not None:
                raise error


async def _pod_moves(kube: Kube, ns: str, name: str, container: str, printed: set[str]) -> None:
    pod = await kube.get(PODS, name, ns)
    async with contextlib.aclosing(
        kube.watch(PODS, ns, field_selector=f"metadata.name={name}",
                   resource_version=pod["metadata"]["resourceVersion"], timeout_seconds=60)
    ) as events:  # fmt: skip
        async for event in events:
            if event.type == "DELETED":
                return
            instance, running = trainer_instance(event.object, container)
            if event.type == "MODIFIED" and (
                (instance is not None and instance not in printed) or not running
            ):
                return


async def _job_ends(kube: Kube, ns: str, job: str) -> None:
    try:
        found = await kube.get(GANGJOBS, job, ns)
    except NotFound:
        return
    if (found.get("status") or {}).get("phase") in TERMINAL:
        return
    async with contextlib.aclosing(
        kube.watch(GANGJOBS, ns, field_selector=f"metadata.name={job}",
                   resource_version=found["metadata"]["resourceVersion"], timeout_seconds=60)
    ) as events:  # fmt: skip
        async for event in events:
            if event.type == "DELETED":
                return
            if (event.object.get("status") or {}).get("phase") in TERMINAL:
                return
