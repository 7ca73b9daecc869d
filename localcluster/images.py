"""Container images built on this machine without a registry or a Docker engine.

An image is one layer made from host files (a static busybox, or a Python interpreter with the
libraries it links), packed as an OCI image layout in a tar archive, and imported into the
node's containerd with ``ctr images import``. Pods use them with ``imagePullPolicy: Never`` or
``IfNotPresent``; the kubelet's image GC is switched off because nothing can be pulled again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.versions import cache_root

BUSYBOX = "/bin/busybox"  # Debian's busybox-static

# The pause container: PID 1 of every pod sandbox. A shell that sleeps forever and exits on
# SIGTERM (PID 1 ignores signals it has no handler for, so a bare `sleep` would not).
PAUSE_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


@dataclass
class ImageSpec:
    """What goes into an image: files (image path -> host path or bytes), links, config."""

    name: str  # e.g. localhost/busybox:dev
    files: dict[str, Path | bytes] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/local/bin:/usr/bin:/bin"])
    workdir: str = "/"
    user: str = ""
    modes: dict[str, int] = field(default_factory=dict)
    """Permission bits of files given as bytes (0o644 otherwise): an executable script."""


def busybox_applets() -> list[str]:
    out = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout
    return [a for a in out.split() if a and a != "busybox"]


def busybox_image(name: str = "localhost/busybox:dev") -> ImageSpec:
    spec = ImageSpec(name=name, cmd=["/bin/sh"])
    spec.files["bin/busybox"] = Path(BUSYBOX)
    for applet in busybox_applets():
        spec.symlinks[f"bin/{applet}"] = "busybox"
    spec.dirs += ["tmp", "etc", "proc", "sys", "dev", "var", "root"]
    spec.files["etc/passwd"] = (
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
    )
    spec.files["etc/group"] = b"root:x:0:\nnogroup:x:65534:\n"
    return spec


def pause_image(name: str = "localhost/pause:dev") -> ImageSpec:
    spec = busybox_image(name)
    spec.cmd = []
    spec.entrypoint = PAUSE_CMD
    return spec


PYTHON = Path("/usr/bin/python3.11")  # Debian's interpreter: its stdlib lives in /usr/lib
PYTHON_LIB = Path("/usr/lib/python3.11")
# Parts of the standard library no agent or trainer needs; leaving them out halves the image.
PYTHON_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data",
    "__pycache__", "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu",
}  # fmt: skip


def python_image(name: str, extra: dict[str, Path | bytes] | None = None) -> ImageSpec:
    """busybox plus Debian's python3.11 with its standard library and the libraries it loads."""
    spec = busybox_image(name)
    libs: set[Path] = set(shared_libs(PYTHON))
    for path in PYTHON_LIB.rglob("*"):
        rel = path.relative_to(PYTHON_LIB)
        if any(part in PYTHON_SKIP for part in rel.parts) or not path.is_file():
            continue
        if path.suffix == ".so":
            if rel.name.startswith(("_test", "xx")):
                continue
            libs.update(shared_libs(path))
        spec.files[str(Path("usr/lib/python3.11") / rel)] = path
    for lib in libs:
        spec.files[str(lib).lstrip("/")] = lib.resolve()
    spec.files["usr/bin/python3.11"] = PYTHON
    spec.symlinks["usr/bin/python3"] = "python3.11"
    spec.symlinks["usr/bin/python"] = "python3.11"
    spec.files.update(extra or {})
    spec.cmd = ["/usr/bin/python3"]
    return spec


def shared_libs(binary: Path) -> list[Path]:
    """The shared libraries ``binary`` loads, from ldd (the interpreter included)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def _layer(spec: ImageSpec) -> bytes:
    """A gzip'ed tar of the image's files; deterministic (fixed mtimes, sorted entries)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen: set[str] = set()

        def add_dir(path: str) -> None:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in seen:
                    seen.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
                    tar.addfile(ti)

        for d in sorted(spec.dirs):
            add_dir(d)
        for path in sorted(spec.files):
            add_dir(os.path.dirname(path))
            src = spec.files[path]
            ti = tarfile.TarInfo(path.strip("/"))
            ti.mtime = 0
            if isinstance(src, bytes):
                data, ti.mode = src, spec.modes.get(path, 0o644)
            else:
                data = src.read_bytes()
                ti.mode = src.stat().st_mode & 0o777
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        for path in sorted(spec.symlinks):
            add_dir(os.path.dirname(path))
            ti = tarfile.TarInfo(path.strip("/"))
            ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, spec.symlinks[path], 0o777, 0
            tar.addfile(ti)
    return buf.getvalue()


def _blob(layout: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    ti = tarfile.TarInfo(f"blobs/sha256/{digest}")
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
    layout.addfile(ti, io.BytesIO(data))
    return f"sha256:{digest}"


def fingerprint(spec: ImageSpec) -> str:
    """Changes whenever a file of the image (or its config) would: to skip needless rebuilds."""
    h = hashlib.sha256()
    h.update(json.dumps([spec.name, spec.symlinks, spec.dirs, spec.cmd, spec.entrypoint,
                         spec.env, spec.workdir, spec.user], sort_keys=True).encode())  # fmt: skip
    if spec.modes:  # only then: the other images keep the fingerprints their archives have
        h.update(json.dumps(spec.modes, sort_keys=True).encode())
    for path in sorted(spec.files):
        src = spec.files[path]
        if isinstance(src, bytes):
            h.update(path.encode() + hashlib.sha256(src).digest())
        else:
            st = src.stat()
            h.update(f"{path}:{src}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def archive_path(spec: ImageSpec) -> Path:
    """Where ``spec``'s archive is cached: ``cache_root()/images/<name with / and : as _>.tar``."""
    return cache_root() / "images" / (spec.name.replace("/", "_").replace(":", "_") + ".tar")


def write_oci_archive(spec: ImageSpec, dest: Path) -> Path:
    """Writes ``spec`` as an OCI image layout tar that ``ctr images import`` accepts.

    Skipped when ``dest`` was written from the same files already (see `fingerprint`)."""
    stamp = dest.with_suffix(".fingerprint")
    fp = fingerprint(spec)
    if dest.exists() and stamp.exists() and stamp.read_text() == fp:
        return dest
    raw = _layer(spec)
    # Level 1: the archive only crosses this machine, and level 9 takes seconds per image.
    gz = gzip.compress(raw, compresslevel=1, mtime=0)
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": spec.env, "WorkingDir": spec.workdir},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
    }
    if spec.cmd:
        config["config"]["Cmd"] = spec.cmd
    if spec.entrypoint:
        config["config"]["Entrypoint"] = spec.entrypoint
    if spec.user:
        config["config"]["User"] = spec.user
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: two clusters coming up at once write the same archive side by side.
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    with tarfile.open(tmp, "w") as layout:
        cfg = json.dumps(config, sort_keys=True).encode()
        cfg_digest = _blob(layout, cfg)
        layer_digest = _blob(layout, gz)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": cfg_digest,
                    "size": len(cfg),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest,
                        "size": len(gz),
                    }
                ],
            },
            sort_keys=True,
        ).encode()
        man_digest = _blob(layout, manifest)
        tag = spec.name.rsplit(":", 1)[1]
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": man_digest,
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index, sort_keys=True).encode()),
        ):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            layout.addfile(ti, io.BytesIO(data))
    tmp.replace(dest)
    stamp.write_text(fp)
    return dest
