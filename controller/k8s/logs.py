"""A container's log as a stream of lines (`GET pods/<name>/log`), for the command line."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from controller.k8s.errors import TransportError, error_from_response
from controller.k8s.kinds import PODS
from controller.k8s.transport import Transport


async def pod_log(
    transport: Transport,
    name: str,
    namespace: str,
    container: str,
    *,
    follow: bool = False,
    idle_timeout: float = 3600.0,
) -> AsyncIterator[str]:
    """The lines of the container's current instance, from its start, each with its newline (a
    last one without is cut short: the kubelet ends a stream it cannot go on with its error
    message); with `follow`, until it ends (the stream closes when the container terminates).
    Raises the typed `ApiError` of a refusal, e.g. `BadRequest` while the container waits."""
    query = [("container", container)]
    if follow:
        query.append(("follow", "true"))
    resp = await transport.open(
        "GET",
        PODS,
        PODS.path(namespace, name, "log"),
        query=query,
        client_timeout=aiohttp.ClientTimeout(total=None, sock_read=idle_timeout),
    )
    try:
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, await resp.read(), resp.headers)
        try:
            async for raw in resp.content:
                yield raw.decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as error:
            raise TransportError(f"GET {name}/log: {error!r}") from error
    finally:
        resp.release()
