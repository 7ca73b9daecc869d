"""Pinned versions of everything the local cluster is built from, and where their binaries live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.2"
# k8s.io/kubernetes replaces its staging modules with local paths; the tools module that builds
# it replaces them with the published v0.X.Y of the same release instead.
STAGING_VERSION = "v0.36.2"
KUBERNETES_COMMIT = "24e2b02af5543d7910c2bb074c7264df5a8f0467"
ETCD_VERSION = "v3.6.8"  # the etcd server that k8s.io/kubernetes v1.36.2 itself requires
KWOK_VERSION = "v0.8.0"
JOBSET_VERSION = "v0.12.0"  # the scale benchmark's peer (localcluster.jobset)
HELM_VERSION = "v3.20.0"  # renders and installs charts/gangjob in tests (localcluster.helm)
KUEUE_VERSION = "v0.15.0"  # GangJob quota (localcluster.kueue); proxy refuses v0.17.7, v0.20.0
GO_MAJOR_MINOR = "go1.26"  # Go 1.27 switches encoding/json to v2, which breaks /openapi/v3

KUBERNETES_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "kube-proxy",  # the node profile's ClusterIP Services (localcluster.proxy)
)


@dataclass(frozen=True)
class Binary:
    """One cached executable: which component it belongs to, and at which version."""

    name: str
    component: str
    version: str

    @property
    def path(self) -> Path:
        return cache_root() / self.component / self.version / self.name


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/gangjob``: outside the repository, kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gangjob"


def state_root() -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/gangjob``: the running clusters' files."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gangjob"


def all_binaries() -> list[Binary]:
    bins = [Binary(n, "kubernetes", KUBERNETES_VERSION) for n in KUBERNETES_BINARIES]
    bins.append(Binary("etcd", "etcd", ETCD_VERSION))
    bins.append(Binary("kwok", "kwok", KWOK_VERSION))
    return bins


def binary(name: str) -> Binary:
    for b in all_binaries():
        if b.name == name:
            return b
    raise KeyError(name)


def kwok_stages_path() -> Path:
    """KWOK's own stage definitions, copied from its module at build time."""
    return cache_root() / "kwok" / KWOK_VERSION / "stages.yaml"
