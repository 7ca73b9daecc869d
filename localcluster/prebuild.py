"""What a test run needs built, done before its first test starts: a cold build takes minutes
(helm about 9, Kueue about 10 on two cores; Prometheus is a download), and inside a test it
would run under pytest's per-test timeout and be charged to that test. Any test on a cluster
(tests/integration, tests/e2e) needs the pinned Kubernetes binaries; a few test files need an
add-on too."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, TextIO

from localcluster import build, helm, jobset, kueue, prometheus

KUBERNETES: Final = "kubernetes"
CLUSTER_TIERS: Final = frozenset({"integration", "e2e"})
"""The test directories whose tests run on a local cluster."""
ADDONS: Final[dict[str, str]] = {
    "test_chart.py": "helm",
    "test_kueue.py": "kueue",
    "test_jobset_peer.py": "jobset",
    "test_monitoring.py": "prometheus",
    "test_in_cluster.py": "prometheus",
}
"""Test file -> the add-on it runs."""
BUILDS: Final[dict[str, Callable[[TextIO], object]]] = {
    KUBERNETES: build.build,
    "helm": helm.ensure_built,
    "kueue": kueue.MANAGER.ensure_built,
    "jobset": jobset.CONTROLLER.ensure_built,
    "prometheus": prometheus.ensure_built,
}
"""What builds each component (each a no-op once it is in the cache)."""


def needed(paths: Iterable[Path]) -> list[str]:
    """The components the tests in `paths` need, Kubernetes first."""
    paths = list(paths)
    out: list[str] = []
    if any(CLUSTER_TIERS & set(p.parts) for p in paths):
        out.append(KUBERNETES)
    out += sorted({ADDONS[p.name] for p in paths if p.name in ADDONS})
    return out


def build_for(paths: Iterable[Path], out: TextIO = sys.stderr) -> None:
    """Builds what the tests in `paths` need and the cache lacks."""
    for component in needed(paths):
        BUILDS[component](out)
