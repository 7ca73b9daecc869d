"""One named local cluster as the code that runs it sees it: its ports, its files, the processes
it has started, and its apiserver as the admin.

Each cluster lives in ``${XDG_STATE_HOME:-~/.local/state}/gangjob/clusters/<name>/`` and owns a
block of 20 loopback ports chosen from its name, so that clusters of different names (the
user's ``sim``, the tests' ``test-sim``, a ``node`` profile) never share ports or state, and none
uses the ports of a usual cluster (6443, 2379, 10250, ...). ``cluster.json`` records what ``up``
started and changed, so that ``down`` stops exactly that and puts back what it changed.

Bringing a cluster up and down is `localcluster.cluster`'s; the profiles and tools below it
(`node`, `tools`, `chaos`) are given a `ClusterHandle`.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from localcluster.procs import Proc, launch, tail
from localcluster.versions import state_root

# Fixed slots for the well-known names; any other name hashes to one of the remaining slots.
WELL_KNOWN_SLOTS = {"sim": 0, "node": 1, "test-sim": 2, "test-node": 3}
PORT_BASE = 21000  # below Linux's ephemeral range (32768+) and clear of the usual k8s ports
PORTS_PER_SLOT = 20
SLOTS = 50


class ClusterError(RuntimeError):
    """Something about the local cluster failed; the message says what and where to look."""


def slot_of(name: str) -> int:
    if name in WELL_KNOWN_SLOTS:
        return WELL_KNOWN_SLOTS[name]
    n = len(WELL_KNOWN_SLOTS)
    return n + zlib.crc32(name.encode()) % (SLOTS - n)


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one cluster."""

    slot: int

    def _p(self, offset: int) -> int:
        return PORT_BASE + self.slot * PORTS_PER_SLOT + offset

    @property
    def etcd(self) -> int:
        return self._p(0)

    @property
    def etcd_peer(self) -> int:
        return self._p(1)

    @property
    def apiserver(self) -> int:
        return self._p(2)

    @property
    def controller_manager(self) -> int:
        return self._p(3)

    @property
    def scheduler(self) -> int:
        return self._p(4)

    @property
    def kwok(self) -> int:
        return self._p(5)

    @property
    def kubelet(self) -> int:
        return self._p(6)

    @property
    def kubelet_healthz(self) -> int:
        return self._p(7)

    @property
    def containerd_stream(self) -> int:
        return self._p(8)


class ClusterHandle:
    """One named local cluster: where it lives, what it started, its admin API."""

    def __init__(self, name: str) -> None:
        if not name or not all(c.isalnum() or c == "-" for c in name) or len(name) > 20:
            raise ClusterError(f"cluster name {name!r}: use up to 20 letters, digits or '-'")
        self.name = name
        self.dir = state_root() / "clusters" / name
        self.ports = Ports(slot_of(name))
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.state_file = self.dir / "cluster.json"

    # ---- recorded state -------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    def load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def save(self, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    def procs(self) -> list[Proc]:
        return [Proc.from_json(p) for p in self.load().get("processes", [])]

    def is_up(self) -> bool:
        state = self.load()
        procs = self.procs()
        return bool(state.get("ready")) and bool(procs) and all(p.alive() for p in procs)

    @property
    def service_cidr(self) -> str:
        """Each cluster has its own service range: the node profile routes it on this host."""
        return f"10.{200 + self.ports.slot}.0.0/16"

    @property
    def service_ip(self) -> str:
        """The `kubernetes` Service's cluster IP (the first of the range)."""
        return f"10.{200 + self.ports.slot}.0.1"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # ---- its processes ----------------------------------------------------------------------
    def launch(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        """Starts ``cmd`` with its log in ``logs/<name>.log`` and records it, so that ``down``
        stops it (newest first) and ``is_up`` expects it to run."""
        proc = launch(name, cmd, self.logs / f"{name}.log", env=env)
        state = self.load()
        state.setdefault("processes", []).append(proc.to_json())
        self.save(state)
        return proc

    def wait_for(
        self,
        what: str,
        ok: Callable[[], bool],
        timeout: float,
        component: str,
        out: TextIO | None = None,
    ) -> None:
        """Polls ``ok`` until it holds. Raises `ClusterError` with the last lines of the log as
        soon as a recorded process exits, or of ``component``'s log after ``timeout``."""
        deadline = time.monotonic() + timeout
        last_note = time.monotonic()
        while True:
            try:
                if ok():
                    return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            dead = [p for p in self.procs() if not p.alive()]
            if dead:
                raise ClusterError(
                    f"{dead[0].name} exited while waiting for {what}; last lines of "
                    f"{dead[0].log}:\n{tail(dead[0].log)}"
                )
            if time.monotonic() > deadline:
                log = self.logs / f"{component}.log"
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}; last lines of "
                    f"{log}:\n{tail(log)}"
                )
            if out is not None and time.monotonic() - last_note > 10:
                out.write(f"  ... still waiting for {what}\n")
                last_note = time.monotonic()
            time.sleep(0.25)

    # ---- talking to the apiserver without a client library --------------------------------
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One admin request to the apiserver; JSON in and out."""
        data = None if body is None else json.dumps(body).encode()
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", ctype)
        req.add_header("Accept", "application/json")
        with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def exists(self, path: str) -> bool:
        try:
            self.api("GET", path, timeout=3)
            return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def ready_nodes(self) -> int:
        nodes = self.api("GET", "/api/v1/nodes")["items"]
        return sum(
            1
            for n in nodes
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        )
