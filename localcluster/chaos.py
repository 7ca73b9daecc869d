"""Failures on the real node, from the host: kill a worker's training process as the kernel's
OOM killer or a crash would, with SIGKILL from outside the container (its PID 1 ignores
signals sent from inside)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from localcluster.handle import ClusterHandle
from localcluster.node import containerd_sock


class ChaosError(RuntimeError):
    """The process to kill was not found; the message says where it was looked for."""


def container_pid(cluster: ClusterHandle, pod: dict[str, Any], container: str) -> int:
    """The host PID of ``container``'s init process in ``pod`` (a pod object with status)."""
    statuses = pod.get("status", {}).get("containerStatuses", [])
    cid = next((s.get("containerID", "") for s in statuses if s["name"] == container), "")
    if not cid.startswith("containerd://"):
        raise ChaosError(f"{pod['metadata']['name']}/{container}: no running container ({cid!r})")
    res = subprocess.run(
        ["ctr", "--address", str(containerd_sock(cluster)), "--namespace", "k8s.io",
         "tasks", "ls"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    for line in res.stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid.removeprefix("containerd://"):
            return int(fields[1])
    raise ChaosError(f"{pod['metadata']['name']}/{container}: task {cid} not running")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (host PIDs), parents before children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return out


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces; '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_trainer(
    cluster: ClusterHandle,
    pod: dict[str, Any],
    match: str = "train.py",
    container: str = "trainer",
    sig: signal.Signals = signal.SIGKILL,
) -> int:
    """Sends ``sig`` to the first process of ``container`` whose command line contains
    ``match`` and no descendant that does: the container's init in Pod mode, the agent's child
    in Process mode. Returns its host PID."""
    root = container_pid(cluster, pod, container)
    matching = [pid for pid in descendants(root) if match in cmdline(pid)]
    # The innermost match: in Process mode the agent's own command line names the trainer's.
    for pid in matching:
        if not any(match in cmdline(d) for d in descendants(pid)[1:]):
            os.kill(pid, sig)
            return pid
    raise ChaosError(f"{pod['metadata']['name']}/{container}: no process matching {match!r}")
