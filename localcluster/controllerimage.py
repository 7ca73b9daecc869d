"""The controller image `localhost/gangjob-controller:dev`, built without Docker from the same
source as `Dockerfile.controller`.

The Dockerfile is the one description of the image: what of the checkout goes in (its `COPY`
lines; `pip wheel .` packs the packages pyproject.toml names), the user, the environment and the
entrypoint of its final stage. `controller_image` reads those from it, and pyproject.toml's
dependencies and console script, and builds the same thing on Debian's Python 3.11
(`localcluster.images.python_image`):

- the dependencies, installed once from wheels into the cache (keyed by their requirement list)
  with bytecode compiled ahead, into the image's ``/usr/local/lib/python3.11/dist-packages``
  (on Debian's default `sys.path`, as pip's install puts them on the slim image's);
- the project's packages from this checkout, beside them;
- ``/usr/local/bin/gangjob-controller``, the console script pip would write.

tests/unit/test_controller_image.py checks that what is read here is what the Dockerfile says.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from localcluster import images
from localcluster.versions import cache_root

CONTROLLER_IMAGE = "localhost/gangjob-controller:dev"
REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile.controller"
PYPROJECT = REPO / "pyproject.toml"
SITE_IN_IMAGE = "usr/local/lib/python3.11/dist-packages"
BIN_IN_IMAGE = "usr/local/bin"


class ControllerImageError(RuntimeError):
    """The controller image could not be built; the message says why."""


@dataclass(frozen=True)
class Recipe:
    """What Dockerfile.controller and pyproject.toml say the image holds."""

    copied: tuple[str, ...]
    """The checkout's paths the build stage copies (`COPY <src> ...`), in order."""
    packages: tuple[str, ...]
    """The packages `pip wheel .` packs (pyproject's wheel target)."""
    dependencies: tuple[str, ...]
    scripts: dict[str, str]
    """Console scripts: name -> ``module:function``."""
    user: str
    env: tuple[str, ...]
    """``NAME=value`` of the final stage's `ENV`, in order."""
    entrypoint: tuple[str, ...]
    ports: tuple[int, ...]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def read_recipe(dockerfile: Path = DOCKERFILE, pyproject: Path = PYPROJECT) -> Recipe:
    """Reads the image's recipe from the Dockerfile (its last stage for the runtime settings)
    and pyproject.toml."""
    instr = _instructions(dockerfile.read_text())
    stages = [i for i, (word, _) in enumerate(instr) if word == "FROM"]
    if len(stages) < 2:
        raise ControllerImageError(f"{dockerfile}: expected a build stage and a final stage")
    final = instr[stages[-1] :]
    copied: list[str] = []
    for word, args in instr[: stages[-1]]:
        if word == "COPY" and not args.startswith("--from"):
            copied += [s.rstrip("/") for s in args.split()[:-1]]
    user = next((a for w, a in final if w == "USER"), "")
    env: list[str] = []
    for word, args in final:
        if word == "ENV":
            env += args.split()
    entry = next((a for w, a in final if w == "ENTRYPOINT"), "[]")
    ports = [int(p) for w, a in final if w == "EXPOSE" for p in a.split()]
    project = tomllib.loads(pyproject.read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    return Recipe(
        copied=tuple(copied),
        packages=tuple(wheel["packages"]),
        dependencies=tuple(project["project"]["dependencies"]),
        scripts=dict(project["project"]["scripts"]),
        user=user,
        env=tuple(env),
        entrypoint=tuple(json.loads(entry)),
        ports=tuple(ports),
    )


# ---- the dependencies, once, into the cache --------------------------------------------------
def site_packages(recipe: Recipe) -> Path:
    key = hashlib.sha256("\n".join(recipe.dependencies).encode()).hexdigest()[:8]
    return cache_root() / "controller" / f"deps-{key}" / "site-packages"


def ensure_dependencies(recipe: Recipe, out: TextIO = sys.stderr) -> Path:
    """pyproject.toml's dependencies installed from wheels (`pip install --target`), bytecode
    compiled for the image's interpreter; built once per requirement list. One build at a
    time: a second caller waits for the first one's."""
    dest = site_packages(recipe)
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return dest
        t0 = time.monotonic()
        out.write(f"installing the controller's dependencies into {dest} (once)\n")
        work = Path(tempfile.mkdtemp(prefix="site-", dir=dest.parent))
        try:
            pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
            _run([*pip, "install", "--only-binary=:all:", "--target", str(work),
                  *recipe.dependencies])  # fmt: skip
            for cache in list(work.rglob("__pycache__")):
                shutil.rmtree(cache)
            # Unchecked hashes: the image gives every file mtime 0, so a timestamp check would
            # find every .pyc stale, and the root filesystem is read-only.
            _run([str(images.PYTHON), "-m", "compileall", "-q", "-j0",
                  "--invalidation-mode", "unchecked-hash", str(work)])  # fmt: skip
            (work / ".complete").write_text("\n".join(recipe.dependencies) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            work.rename(dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        out.write(f"  controller dependencies ready in {time.monotonic() - t0:.0f}s\n")
        return dest


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ControllerImageError(f"`{' '.join(cmd[:6])} ...` failed:\n{res.stderr[-3000:]}")


# ---- the image ------------------------------------------------------------------------------
def console_script(target: str) -> bytes:
    """What pip writes for a `[project.scripts]` entry."""
    module, _, func = target.partition(":")
    return (
        f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\n"
        f"if __name__ == '__main__':\n    sys.exit({func}())\n"
    ).encode()


def project_files(recipe: Recipe) -> dict[str, Path | bytes]:
    """The image's files from this checkout: the packages and the console scripts."""
    files: dict[str, Path | bytes] = {}
    for package in recipe.packages:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files[f"{SITE_IN_IMAGE}/{path.relative_to(REPO)}"] = path
    for name, target in recipe.scripts.items():
        files[f"{BIN_IN_IMAGE}/{name}"] = console_script(target)
    return files


def controller_image(out: TextIO = sys.stderr) -> images.ImageSpec:
    """The image: Debian's Python, the dependencies, this checkout's packages."""
    recipe = read_recipe()
    site = ensure_dependencies(recipe, out)
    extra: dict[str, Path | bytes] = {}
    libs: set[Path] = set()
    for path in site.rglob("*"):
        if not path.is_file() or path.name == ".complete":
            continue
        extra[f"{SITE_IN_IMAGE}/{path.relative_to(site)}"] = path
        if path.suffix == ".so":
            libs.update(p for p in images.shared_libs(path) if site not in p.parents)
    extra.update(project_files(recipe))
    spec = images.python_image(CONTROLLER_IMAGE, extra)
    for so in libs:
        spec.files.setdefault(str(so).lstrip("/"), so.resolve())
    spec.modes = {f"{BIN_IN_IMAGE}/{name}": 0o755 for name in recipe.scripts}
    spec.env = ["PATH=/usr/local/bin:/usr/bin:/bin", *recipe.env]
    spec.user = recipe.user
    spec.entrypoint = list(recipe.entrypoint)
    spec.cmd = []
    return spec


def main(argv: list[str] | None = None) -> None:
    """`python -m localcluster.controllerimage`: build the image archive into the cache."""
    del argv
    t0 = time.monotonic()
    spec = controller_image()
    archive = images.write_oci_archive(spec, images.archive_path(spec))
    print(f"{archive} {archive.stat().st_size >> 20} MB in {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
