"""The pinned `helm` (helm.sh/helm/v3), built from the Go module proxy into the cache, and run
against a local cluster: what the tests of `charts/gangjob` render and install the chart with.

`ensure_built` builds it once, as `localcluster.outofcluster` builds JobSet and Kueue (the
module's own source, downloaded at the pinned version; `go install` would ask the proxy for the
version list). `helm(...)` runs it with the cluster's admin kubeconfig and with its cache,
config and data directories inside the cluster's state, so nothing of a user's own helm setup
is read or written.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from localcluster import build as buildmod
from localcluster.handle import ClusterHandle
from localcluster.versions import HELM_VERSION, cache_root

MODULE = "helm.sh/helm/v3"
COLD_BUILD_SECONDS = 520  # measured on 2 shared cores, Kubernetes' packages in Go's cache


class HelmError(RuntimeError):
    """helm could not be built, or a helm command failed; the message says why."""


def binary_path() -> Path:
    """``<cache>/helm/<version>/helm``, like the other components."""
    return cache_root() / "helm" / HELM_VERSION / "helm"


def ensure_built(out: TextIO = sys.stderr) -> Path:
    """Builds helm into the cache unless it is there; returns the binary."""
    if binary_path().exists():
        return binary_path()
    cache_root().mkdir(parents=True, exist_ok=True)
    with buildmod.build_lock("helm"):
        if binary_path().exists():  # built by somebody else while we waited
            return binary_path()
        go = buildmod.check_go()
        logpath = cache_root() / "build" / "helm-build.log"
        t0 = time.monotonic()
        with open(logpath, "a") as log:
            log.write(f"\n=== helm build started {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n")
            out.write(f"building helm {HELM_VERSION} (log: {logpath})\n")
            out.flush()
            info = buildmod.download(go, f"{MODULE}@{HELM_VERSION}", log)
            work = Path(tempfile.mkdtemp(prefix="helm-src-", dir=cache_root() / "build"))
            try:
                src = buildmod.writable_source(info, work / "src")
                commit = str((info.get("Origin") or {}).get("Hash") or "unknown")
                pkg = f"{MODULE}/internal/version"
                ldflags = (
                    f"-s -w -X {pkg}.version={HELM_VERSION} -X {pkg}.metadata="
                    f" -X {pkg}.gitCommit={commit} -X {pkg}.gitTreeState=clean"
                )
                target = work / "helm"
                cmd = [go, "build", "-v", "-trimpath", "-ldflags", ldflags]
                cmd += ["-o", str(target), "./cmd/helm"]
                with buildmod.Progress(out, "helm", COLD_BUILD_SECONDS) as prog:
                    buildmod.run_logged(cmd, src, log, prog)
                buildmod.install_binary(target, binary_path())
            finally:
                shutil.rmtree(work, ignore_errors=True)
        out.write(f"    helm: {time.monotonic() - t0:.0f}s -> {binary_path()}\n")
        return binary_path()


def helm(cluster: ClusterHandle | None, *args: str, timeout: float = 300) -> str:
    """Runs the pinned helm (built when missing) as `cluster`'s admin (None: no cluster, for
    `helm template`); raises with its output on failure. helm's own cache, config and data
    live under the cluster's directory (or a temporary one)."""
    exe = ensure_built()
    with contextlib.ExitStack() as stack:
        if cluster is not None:
            home = cluster.dir / "helm"
        else:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="helm-")))
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if cluster is not None:
            env["KUBECONFIG"] = str(cluster.kubeconfig)
        res = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout
        )
    if res.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res.stdout
