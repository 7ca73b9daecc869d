"""Prometheus and promtool, for the tests of GangJob's alerts and of its metrics scraped for real:
Debian's `prometheus` package, downloaded with apt (`apt-get download`: no install, no service
started) and unpacked into the cache, like the other components (`<cache>/prometheus/<version>/`).

The Go module proxy could build them too, but Prometheus' module is some hundreds of packages
(every cloud's service discovery) and its UI is not in it; Debian's binaries are the same code,
built. `ensure_built` is a no-op once the cache has them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from localcluster import build as buildmod
from localcluster.versions import cache_root

PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")


class PrometheusError(RuntimeError):
    """The package could not be had; the message says why."""


def cached() -> Path | None:
    """The newest cached version's directory, if any holds both binaries."""
    root = cache_root() / "prometheus"
    found = [d for d in root.glob("*") if all((d / b).is_file() for b in BINARIES)]
    return max(found, key=lambda d: d.name) if found else None


def _download(work: Path, log: TextIO) -> Path:
    def attempt() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["apt-get", "download", PACKAGE], cwd=work, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    res = attempt()
    if res.returncode != 0 and os.geteuid() == 0:
        # A fresh machine has no package lists yet.
        log.write(res.stderr)
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        res = attempt()
    log.write(res.stdout + res.stderr)
    debs = list(work.glob(f"{PACKAGE}_*.deb"))
    if res.returncode != 0 or not debs:
        raise PrometheusError(f"apt-get download {PACKAGE} failed:\n{res.stderr}")
    return debs[0]


def ensure_built(out: TextIO = sys.stderr) -> Path:
    """Unpacks Debian's prometheus into the cache unless it is there; returns its directory."""
    if (found := cached()) is not None:
        return found
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise PrometheusError("prometheus and promtool come from Debian's package: need apt")
    (cache_root() / "build").mkdir(parents=True, exist_ok=True)
    with buildmod.build_lock("prometheus"):
        if (found := cached()) is not None:
            return found
        logpath = cache_root() / "build" / "prometheus-download.log"
        out.write(f"fetching Debian's {PACKAGE} package (log: {logpath})\n")
        with open(logpath, "a") as log, tempfile.TemporaryDirectory(prefix="prom-") as tmp:
            work = Path(tmp)
            deb = _download(work, log)
            version = deb.name.split("_")[1].replace("%2b", "+")
            subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "x")], check=True)
            target = cache_root() / "prometheus" / version
            target.mkdir(parents=True, exist_ok=True)
            for name in BINARIES:
                buildmod.install_binary(work / "x" / "usr" / "bin" / name, target / name)
        out.write(f"    prometheus {version} -> {target}\n")
        return target


def promtool() -> Path:
    return ensure_built() / "promtool"


def prometheus() -> Path:
    return ensure_built() / "prometheus"
