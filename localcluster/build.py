"""Builds the pinned Kubernetes, etcd and KWOK binaries from the Go module proxy into the cache.

``k8s.io/kubernetes`` cannot be ``go install``-ed: its go.mod replaces the staging modules
(``k8s.io/api``, ``k8s.io/client-go``, ...) with local paths. A small generated *tools module*
requires it and replaces each staging module with its published version instead; etcd's server
is built from the same module through a three-line ``main``. KWOK has no replace directives and
is ``go install``-ed at its own pinned version. Only missing binaries are built; Go's module and
build caches stay warm between runs, so a rebuild after a cache wipe mostly links.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from localcluster.versions import (
    ETCD_VERSION,
    GO_MAJOR_MINOR,
    KUBERNETES_BINARIES,
    KUBERNETES_COMMIT,
    KUBERNETES_VERSION,
    KWOK_VERSION,
    STAGING_VERSION,
    Binary,
    all_binaries,
    cache_root,
    kwok_stages_path,
)

# Cold build times measured on 2 cores, to tell the user what to expect.
COLD_SECONDS = {
    "kube-apiserver": 900,
    "kubelet": 650,
    "kube-controller-manager": 80,
    "kubectl": 40,
    "etcd": 40,
    "kwok": 100,
    "kube-scheduler": 220,
    "kube-proxy": 120,
}

# The KWOK stages the simulated nodes and pods need (from KWOK's own repository).
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)

ETCD_MAIN = """\
// Command etcd runs a single etcd member: etcd's own main, built from its server module.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""

TOOLS_GO = (
    "//go:build tools\n\npackage tools\n\nimport (\n"
    + "".join(f'\t_ "k8s.io/kubernetes/cmd/{b}"\n' for b in KUBERNETES_BINARIES)
    + ")\n"
)


class BuildError(RuntimeError):
    """A build step failed; the message says which and where the log is."""


def missing() -> list[Binary]:
    return [b for b in all_binaries() if not b.path.exists()] + (
        [] if kwok_stages_path().exists() else [Binary("stages.yaml", "kwok", KWOK_VERSION)]
    )


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Go 1.27 would be fetched by a `toolchain` line otherwise; 1.26 is the one that works.
    env["GOTOOLCHAIN"] = "local"
    env["GOFLAGS"] = "-mod=mod"
    env["CGO_ENABLED"] = "0"
    return env


def check_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("`go` is not on PATH: Go 1.26 is needed to build Kubernetes")
    out = subprocess.run(
        [go, "env", "GOVERSION"], env=go_env(), capture_output=True, text=True, check=True
    ).stdout.strip()
    if not re.fullmatch(re.escape(GO_MAJOR_MINOR) + r"(\.\d+)?", out):
        raise BuildError(
            f"Go {out} found; {GO_MAJOR_MINOR}.x is required (Go 1.27's encoding/json v2 "
            "breaks the apiserver's OpenAPI handler)"
        )
    return go


def version_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    pairs = {
        "k8s.io/component-base/version.gitVersion": KUBERNETES_VERSION,
        "k8s.io/component-base/version.gitMajor": major,
        "k8s.io/component-base/version.gitMinor": minor,
        "k8s.io/component-base/version.gitCommit": KUBERNETES_COMMIT,
        "k8s.io/component-base/version.gitTreeState": "clean",
        "k8s.io/client-go/pkg/version.gitVersion": KUBERNETES_VERSION,
        "k8s.io/client-go/pkg/version.gitMajor": major,
        "k8s.io/client-go/pkg/version.gitMinor": minor,
    }
    return "-s -w " + " ".join(f"-X {k}={v}" for k, v in pairs.items())


class Progress:
    """Prints a status line every few seconds while a long step runs."""

    def __init__(self, out: TextIO, label: str, expect_s: int) -> None:
        self.out, self.label, self.expect_s = out, label, expect_s
        self.packages = 0
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(15.0):
            el = int(time.monotonic() - self.start)
            self.out.write(
                f"  ... {self.label}: {el}s elapsed, {self.packages} packages compiled"
                f" (cold build ~{self.expect_s}s)\n"
            )
            self.out.flush()


def run_logged(
    cmd: list[str],
    cwd: Path,
    log: TextIO,
    progress: Progress | None = None,
    extra_env: dict[str, str] | None = None,
) -> None:
    log.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
    log.flush()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=go_env() | (extra_env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        if progress is not None and not line.startswith(("go: ", "#")):
            progress.packages += 1
    log.flush()
    if proc.wait() != 0:
        raise BuildError(f"`{' '.join(cmd[:3])} ...` failed; see {log.name}")


def download(go: str, module: str, log: TextIO) -> dict[str, Any]:
    """Downloads `module` (``<path>@<version>``) through the proxy; returns what
    ``go mod download -json`` says of it (``Dir``: its read-only source, ``GoMod``, ``Origin``)."""
    out = subprocess.run(
        [go, "mod", "download", "-json", module],
        env=go_env(),
        capture_output=True,
        text=True,
        cwd=cache_root(),
    )
    log.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise BuildError(f"cannot download {module} from the Go module proxy: {out.stderr.strip()}")
    info: dict[str, Any] = json.loads(out.stdout)
    return info


def writable_source(info: Mapping[str, Any], dest: Path) -> Path:
    """A writable copy of a downloaded module's source at `dest` (the module cache is
    read-only; a build there may update go.sum, and a patch must write): `dest`."""
    shutil.copytree(info["Dir"], dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return dest


def _module_dir(go: str, module: str, log: TextIO) -> tuple[Path, Path]:
    """Downloads a module through the proxy; returns (source dir, go.mod path)."""
    info = download(go, module, log)
    return Path(info["Dir"]), Path(info["GoMod"])


def tools_module(go: str, log: TextIO) -> Path:
    """Writes (once) the tools module that builds Kubernetes and etcd; returns its dir."""
    mod = cache_root() / "build" / f"k8stools-{KUBERNETES_VERSION}"
    if (mod / "go.sum").exists() and (mod / "etcd" / "main.go").exists():
        return mod
    _, gomod = _module_dir(go, f"k8s.io/kubernetes@{KUBERNETES_VERSION}", log)
    staging = sorted(
        set(re.findall(r"^\s+(k8s\.io/[\w.-]+) => \./staging/", gomod.read_text(), re.M))
    )
    if not staging:
        raise BuildError(f"no staging replaces found in {gomod}")
    (mod / "etcd").mkdir(parents=True, exist_ok=True)
    (mod / "go.mod").write_text(
        "module gangjob.local/k8stools\n\ngo 1.26.0\n\nrequire (\n"
        f"\tk8s.io/kubernetes {KUBERNETES_VERSION}\n"
        f"\tgo.etcd.io/etcd/server/v3 {ETCD_VERSION}\n)\n\nreplace (\n"
        + "".join(f"\t{m} => {m} {STAGING_VERSION}\n" for m in staging)
        + ")\n"
    )
    (mod / "tools.go").write_text(TOOLS_GO)
    (mod / "etcd" / "main.go").write_text(ETCD_MAIN)
    run_logged([go, "mod", "tidy"], mod, log)
    return mod


def install_binary(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)  # atomic: a half-written binary is never taken for a cached one


@contextmanager
def build_lock(component: str = "") -> Iterator[None]:
    """One build at a time per cache (tests and a user's `make` may start together). A
    `component` built apart (JobSet, Kueue, helm) has a lock of its own: a Kubernetes build holds
    the cache's for half an hour, and the builds share nothing but Go's caches, which are safe to
    use concurrently."""
    (cache_root() / "build").mkdir(parents=True, exist_ok=True)
    name = f".{component}.lock" if component else ".lock"
    with open(cache_root() / "build" / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(out: TextIO = sys.stderr, force: bool = False) -> list[str]:
    """Builds every missing binary. Returns the names built (empty when all were cached)."""
    with build_lock():
        todo = all_binaries() if force else [b for b in all_binaries() if not b.path.exists()]
        stages_missing = force or not kwok_stages_path().exists()
        if not todo and not stages_missing:
            return []
        go = check_go()
        logpath = cache_root() / "build" / "build.log"
        built: list[str] = []
        with open(logpath, "a") as log:
            log.write(f"\n=== build started {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n")
            out.write(f"building {len(todo)} binaries into {cache_root()} (log: {logpath})\n")
            staging_out = cache_root() / "build" / "out"
            staging_out.mkdir(parents=True, exist_ok=True)
            k8s = [b for b in todo if b.component in ("kubernetes", "etcd")]
            mod = tools_module(go, log) if k8s else None
            for i, b in enumerate(todo, 1):
                t0 = time.monotonic()
                out.write(f"[{i}/{len(todo)}] {b.name} {b.version}\n")
                out.flush()
                target = staging_out / b.name
                with Progress(out, b.name, COLD_SECONDS.get(b.name, 60)) as prog:
                    if b.component == "kubernetes":
                        assert mod is not None
                        cmd = [go, "build", "-v", "-ldflags", version_ldflags()]
                        cmd += ["-o", str(target), f"k8s.io/kubernetes/cmd/{b.name}"]
                        run_logged(cmd, mod, log, prog)
                    elif b.component == "etcd":
                        assert mod is not None
                        cmd = [go, "build", "-v", "-ldflags", "-s -w", "-o", str(target), "./etcd"]
                        run_logged(cmd, mod, log, prog)
                    else:
                        gobin = cache_root() / "build" / "gobin"
                        cmd = [go, "install", "-v", "-ldflags", "-s -w"]
                        cmd.append(f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}")
                        run_logged(cmd, cache_root(), log, prog, {"GOBIN": str(gobin)})
                        target = gobin / "kwok"
                install_binary(target, b.path)
                built.append(b.name)
                out.write(f"    {b.name}: {time.monotonic() - t0:.0f}s -> {b.path}\n")
            if stages_missing:
                src, _ = _module_dir(go, f"sigs.k8s.io/kwok@{KWOK_VERSION}", log)
                docs = [(src / f).read_text().strip() for f in KWOK_STAGE_FILES]
                kwok_stages_path().parent.mkdir(parents=True, exist_ok=True)
                kwok_stages_path().write_text("\n---\n".join(docs) + "\n")
        return built
