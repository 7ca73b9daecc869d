"""The inotify instances a cluster holds, against the per-user limit. Each kube-apiserver and
kube-controller-manager watches its certificate files (6 and 5 instances), a kubelet 6 and
containerd 1: a `sim` cluster holds about 11, a `node` cluster about 18, of the 128 a user may
have by default (`fs.inotify.max_user_instances`). Several clusters up at once exhaust them,
and a component that cannot get one fails at start with a bare "too many open files": `up`
says so first, with the numbers and the way out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from localcluster.handle import ClusterError

LIMIT_FILE: Final = Path("/proc/sys/fs/inotify/max_user_instances")
NEEDED: Final[dict[str, int]] = {"sim": 12, "node": 20}
"""Instances a cluster of each profile takes, measured (above) with a little to spare."""
_INOTIFY_FD: Final = "anon_inode:inotify"


def in_use(uid: int | None = None, proc: Path = Path("/proc")) -> int:
    """The inotify instances the processes of `uid` (default: this one's) hold now."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if pid_dir.stat().st_uid != uid:
                continue
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for fd in fds:
            try:
                count += os.readlink(fd) == _INOTIFY_FD
            except OSError:
                continue
    return count


def limit() -> int:
    return int(LIMIT_FILE.read_text())


def shortage(profile: str, used: int, allowed: int) -> str | None:
    """Why a cluster of `profile` would not get the inotify instances it needs, or None."""
    needed = NEEDED[profile]
    if allowed - used >= needed:
        return None
    return (
        f"a {profile} cluster needs about {needed} inotify instances and this user has "
        f"{allowed - used} left ({used} of fs.inotify.max_user_instances={allowed} in use, "
        f"other local clusters among them): stop one (`localcluster status`, `localcluster "
        f"down --name <name>`), or raise the limit: sysctl -w fs.inotify.max_user_instances=512"
    )


def check(profile: str) -> None:
    """Raises ClusterError if a cluster of `profile` would run out of inotify instances."""
    problem = shortage(profile, in_use(), limit())
    if problem is not None:
        raise ClusterError(problem)
