"""Small helpers for what localcluster adds to a cluster (`localcluster.outofcluster`, JobSet,
Kueue, the tools): an admin request to the cluster's apiserver, whether a CRD is established, and
free loopback ports for the servers of a controller run out of cluster."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import urllib.request
from typing import Any

from localcluster.handle import ClusterHandle

JsonDict = dict[str, Any]


def admin_request(
    cluster: ClusterHandle,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> JsonDict:
    """One admin request (JSON in, JSON out); `ClusterHandle.api` sends no apply patches."""
    ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
    ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cluster.server + path, data=data, method=method)
    req.add_header("Content-Type", content_type)
    req.add_header("Accept", "application/json")
    with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
        out: JsonDict = json.loads(resp.read())
    return out


def crd_established(crd: JsonDict) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports nobody listens on now (the controller binds them a moment
    later). Held open together, so the kernel cannot hand out the same one twice."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
