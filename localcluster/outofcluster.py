"""The out-of-cluster runner of the Go controllers localcluster adds to a cluster (JobSet, Kueue):
building one from its Go module into the cache with the manifests it ships
(`Addon.ensure_built`), server-side applying its CRDs (`Addon.apply_crds`), and running it as a
process of its own against the cluster's admin kubeconfig until its readyz answers (`workdir`,
`start` -> `AddonProcess`). `localcluster.jobset` and `localcluster.kueue` keep what differs:
configuration, certificates, flags, objects.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TextIO

import yaml

from localcluster import build as buildmod
from localcluster.addons import admin_request, crd_established
from localcluster.handle import ClusterHandle
from localcluster.procs import Proc, launch, stop, tail
from localcluster.versions import cache_root

JsonDict = dict[str, Any]

CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass(frozen=True)
class Addon:
    """An add-on controller built from the source of a Go module at a pinned version, cached in
    ``<cache>/<component>/<version>/``: the binary, ``crds/`` and the `manifests`."""

    component: str
    """Its directory in the cache; it names its build lock, build log and field manager too."""
    binary: str
    module: str
    version: str
    package: str
    """The main package, relative to the module's root (``.``, ``./cmd/kueue``)."""
    cold_build_seconds: int
    """What a build takes on 2 cores with an empty Go build cache, to tell the user."""
    error: type[Exception]
    """What its failures raise: the module's own error, whose message says where to look."""
    manifests: Mapping[str, str] = field(default_factory=dict)
    """Files kept beside the binary besides the CRDs: name in the cache -> path in the source."""
    patch: Callable[[Path], None] | None = None
    """A change to the writable copy of the source before it is built."""

    @property
    def field_manager(self) -> str:
        return f"localcluster-{self.component}"

    def cache_dir(self) -> Path:
        return cache_root() / self.component / self.version

    def binary_path(self) -> Path:
        return self.cache_dir() / self.binary

    def crd_dir(self) -> Path:
        return self.cache_dir() / "crds"

    def is_built(self) -> bool:
        return (
            self.binary_path().exists()
            and all((self.cache_dir() / name).exists() for name in self.manifests)
            and any(self.crd_dir().glob("*.yaml"))
        )

    def ensure_built(self, out: TextIO = sys.stderr, force: bool = False) -> Path:
        """Builds it into the cache unless it is there; returns the binary.

        `go install <module>@<version>` fails: it asks the module proxy for the module's version
        list (for deprecation notices), which the proxy refuses (403). Downloading the pinned
        version works, and its source is needed anyway for the manifests: the binary is built
        inside the module's own source. The module cache is read-only, so that is a writable
        copy (`-mod=mod` may update its go.sum), which `patch` may change first.
        """
        if not force and self.is_built():
            return self.binary_path()
        cache_root().mkdir(parents=True, exist_ok=True)
        with buildmod.build_lock(self.component):
            if not force and self.is_built():  # built by somebody else while we waited
                return self.binary_path()
            go = buildmod.check_go()
            logpath = cache_root() / "build" / f"{self.component}-build.log"
            t0 = time.monotonic()
            with open(logpath, "a") as log:
                log.write(
                    f"\n=== {self.component} build started "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n"
                )
                out.write(f"building {self.binary} {self.version} (log: {logpath})\n")
                out.flush()
                info = buildmod.download(go, f"{self.module}@{self.version}", log)
                work = Path(
                    tempfile.mkdtemp(prefix=f"{self.component}-src-", dir=cache_root() / "build")
                )
                try:
                    self._build(go, info, work, log, out)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            out.write(f"    {self.binary}: {time.monotonic() - t0:.0f}s -> {self.binary_path()}\n")
            return self.binary_path()

    def _build(self, go: str, info: JsonDict, work: Path, log: TextIO, out: TextIO) -> None:
        src = buildmod.writable_source(info, work / "src")
        if self.patch is not None:
            self.patch(src)
        commit = str((info.get("Origin") or {}).get("Hash") or "unknown")
        ldflags = (
            f"-s -w -X {self.module}/pkg/version.GitVersion={self.version}"
            f" -X {self.module}/pkg/version.GitCommit={commit}"
        )
        target = work / self.binary
        cmd = [go, "build", "-v", "-ldflags", ldflags, "-o", str(target), self.package]
        with buildmod.Progress(out, self.binary, self.cold_build_seconds) as prog:
            buildmod.run_logged(cmd, src, log, prog)
        crds = sorted((src / "config" / "components" / "crd" / "bases").glob("*.yaml"))
        missing = [path for path in self.manifests.values() if not (src / path).exists()]
        if not crds or missing:
            raise self.error(
                f"{self.module}@{self.version} lacks its manifests: "
                + ", ".join(missing or ["config/components/crd/bases/*.yaml"])
            )
        # The manifests first: `is_built` takes the binary's presence for a finished build.
        self.crd_dir().mkdir(parents=True, exist_ok=True)
        for crd in crds:
            shutil.copyfile(crd, self.crd_dir() / crd.name)
        for name, path in self.manifests.items():
            shutil.copyfile(src / path, self.cache_dir() / name)
        buildmod.install_binary(target, self.binary_path())

    def apply(self, cluster: ClusterHandle, path: str, doc: JsonDict) -> JsonDict:
        """Server-side applies `doc` at the API `path` as this controller's field manager."""
        return admin_request(
            cluster,
            "PATCH",
            f"{path}?fieldManager={self.field_manager}&force=true",
            doc,
            content_type="application/apply-patch+yaml",
            timeout=60.0,
        )

    def apply_crds(self, cluster: ClusterHandle, timeout: float = 60.0) -> list[str]:
        """Server-side applies its CRDs and waits until they are Established; returns their
        names. Server-side because a CRD (JobSet's is 800 kB) can be larger than the
        last-applied annotation of a client-side apply may be."""
        if not self.is_built():
            raise self.error(f"{self.binary} is not built: call ensure_built() first")
        names: list[str] = []
        for manifest in sorted(self.crd_dir().glob("*.yaml")):
            for doc in yaml.safe_load_all(manifest.read_text()):
                if doc:
                    # JSON is YAML: the apply-patch body can be the parsed document.
                    self.apply(cluster, f"{CRDS_PATH}/{doc['metadata']['name']}", doc)
                    names.append(doc["metadata"]["name"])
        deadline = time.monotonic() + timeout
        for name in names:
            while not crd_established(admin_request(cluster, "GET", f"{CRDS_PATH}/{name}")):
                if time.monotonic() > deadline:
                    raise self.error(f"CRD {name} not Established after {timeout:.0f}s")
                time.sleep(0.2)
        return names


# ---- the controller process -----------------------------------------------------------------


@contextlib.contextmanager
def workdir(cluster: ClusterHandle, addon: Addon) -> Iterator[Path]:
    """``<cluster>/<binary>-*/`` with an empty ``certs/``, for the controller's configuration and
    certificates; removed again if the block raises (once the controller runs,
    `AddonProcess.stop` removes it)."""
    path = Path(tempfile.mkdtemp(prefix=f"{addon.binary}-", dir=cluster.dir))
    try:
        (path / "certs").mkdir()
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def start(
    addon: Addon,
    cluster: ClusterHandle,
    work: Path,
    config: JsonDict,
    *,
    health_port: int,
    flags: Sequence[str] = (),
    log_level: str = "info",
    env: Mapping[str, str] | None = None,
    on_stop: Callable[[], None] | None = None,
    ready_timeout: float = 60.0,
    out: TextIO = sys.stderr,
) -> AddonProcess:
    """Writes `config` (its controller-runtime ``Configuration``, which serves readyz on
    `health_port`) to ``<work>/config.yaml`` and starts the controller with it against the
    cluster's admin kubeconfig, `flags` after those, zap's console logging at `log_level` into
    ``<cluster>/logs/<binary>.log``; returns once it is ready (`AddonProcess.wait_ready`).
    The process is not recorded in the cluster's state: `Cluster.down` stops only what `up`
    started."""
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cmd = [
        str(addon.binary_path()),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--config={config_path}",
        *flags,
        # zap's development logging is at debug level, which at benchmark scale costs the
        # controller more than its work.
        "--zap-devel=false",
        f"--zap-log-level={log_level}",
        "--zap-encoder=console",
    ]
    log = cluster.logs / f"{addon.binary}.log"
    out.write(f"starting {addon.binary} {addon.version} (log: {log})\n")
    proc = launch(addon.binary, cmd, log, env=dict(env) if env else None, cwd=work)
    running = AddonProcess(addon, proc, work, log, health_port, on_stop)
    running.wait_ready(ready_timeout)
    return running


@dataclass
class AddonProcess:
    """An add-on controller `start` started. `stop()` ends it and removes its work directory."""

    addon: Addon
    proc: Proc
    workdir: Path
    """Its configuration and certificates; removed by `stop()`."""
    log: Path
    health_port: int
    on_stop: Callable[[], None] | None = None
    """What to undo in the cluster before the process ends (Kueue's webhook configurations)."""
    _stopped: bool = field(default=False, init=False, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def ready(self) -> bool:
        """Its readyz: the manager runs and its webhook server listens."""
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout: float) -> None:
        """Returns once it is ready; stops it and raises, with its log's last lines, if it
        exits or is not ready within `timeout` seconds."""
        name, deadline = self.addon.binary, time.monotonic() + timeout
        try:
            while not self.ready():
                if not self.alive():
                    raise self.addon.error(
                        f"{name} exited; last lines of {self.log}:\n{tail(self.log)}"
                    )
                if time.monotonic() > deadline:
                    raise self.addon.error(
                        f"{name} not ready after {timeout:.0f}s; last lines of "
                        f"{self.log}:\n{tail(self.log)}"
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> bool:
        """`on_stop`, then SIGTERM (then SIGKILL after `timeout`) to this process only, by PID
        and start time, and waits for it to end. Returns whether it was still running."""
        if not self._stopped and self.on_stop is not None:
            self.on_stop()
        was_running = stop(self.proc, timeout)
        if not self._stopped:
            self._stopped = True
            shutil.rmtree(self.workdir, ignore_errors=True)
        return was_running

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
