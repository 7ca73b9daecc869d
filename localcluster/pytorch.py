"""The trainer image `localhost/gangjob-pytorch:dev`: Python 3, a CPU-only PyTorch, the sample.

PyPI's only Linux x86_64 `torch` wheel is the CUDA build: its `libtorch.so` and
`libtorch_python.so` link `libtorch_cuda.so` (900 MB), which links cuBLAS, cuDNN, NCCL, cuFFT
and more from the nvidia-* wheels (several GB). Nothing of that runs on a CPU. So the CUDA half
is left out and replaced by *stub* libraries, built here with gcc from the very symbols the kept
libraries import: every function returns an error (C APIs: "no device") or zero (torch's own
C++ CUDA code: zero devices), every data symbol is zeroed memory of its size. No static
initializer of the real CUDA libraries runs, so PyTorch's CUDA hooks stay unregistered and
`torch.cuda.is_available()` is False, exactly as in the CPU build; gloo, autograd, optimizers
and checkpoints live in `libtorch_cpu.so`, which is kept whole.

The site-packages are built once into the cache (``cache_root()/pytorch/``), never the repo,
then checked by running the image's own interpreter on them (a one-rank gloo all-reduce).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from localcluster import images
from localcluster.procs import free_port
from localcluster.versions import cache_root

PYTORCH_IMAGE = "localhost/gangjob-pytorch:dev"
TORCH_VERSION = "2.5.1"
# torch's own dependencies at the versions 2.5.1 asks for; the nvidia-* and triton are not
# installed (see the module docstring). networkx and jinja2 are only imported by the compiler
# stack (torch.compile), which the sample does not use.
REQUIREMENTS = [
    f"torch=={TORCH_VERSION}",
    "filelock==3.16.1",
    "typing-extensions==4.12.2",
    "sympy==1.13.1",
    "mpmath==1.3.0",
    "fsspec==2024.10.0",
    # Not a dependency of torch, but torch warns "Failed to initialize NumPy" at import
    # without it, and every training program reaches for it (torch.from_numpy, data loading).
    "numpy==2.1.3",
]
SITE_IN_IMAGE = "opt/gangjob/site-packages"
SAMPLE_IN_IMAGE = "opt/gangjob/ddp"
REPO = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "manifests" / "samples" / "ddp"

# Libraries of the wheel that only the CUDA build uses: not copied. The first four are
# NEEDED by kept libraries and get stubs; the others are only ever dlopen'ed for CUDA work.
STUBBED = {
    "libtorch_cuda.so": "",
    "libc10_cuda.so": "",
    "libcudart.so.12": "libcudart.so.12",
    "libcupti.so.12": "libcupti.so.12",
    "libcudnn.so.9": "libcudnn.so.9",
}
DROPPED = [
    "libtorch_cuda.so",
    "libc10_cuda.so",
    "libtorch_cuda_linalg.so",
    "libcusparseLt-294d6944.so.0",
    "libcaffe2_nvrtc.so",
]
# Parts of the package no training job imports: C++ headers, CMake files, test data, the
# protobuf compiler (torch/bin/torch_shm_manager is needed: `import torch` checks for it).
PRUNED = [
    "torch/include",
    "torch/share",
    "torch/bin/protoc",
    "torch/bin/protoc-3.13.0.0",
    "torch/testing/_internal/data",
]
# cudaErrorNoDevice: what the real runtime answers on a machine without a GPU.
C_API_ERROR = 100
SCRATCH_BYTES = 1 << 16
TYPE_INFO_VTABLE = "_ZTVN10__cxxabiv117__class_type_infoE"


class PytorchBuildError(RuntimeError):
    """The CPU PyTorch could not be installed or does not work; the message says why."""


def site_packages() -> Path:
    # Keyed by the requirement set, so that a changed list builds anew instead of reusing a
    # cached tree that lacks a package.
    key = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:8]
    return cache_root() / "pytorch" / f"torch-{TORCH_VERSION}-cpu-{key}" / "site-packages"


def _run(cmd: list[str], **kw: object) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise PytorchBuildError(f"`{' '.join(cmd)}` failed ({res.returncode}):\n{res.stderr}")
    return str(res.stdout)


def ensure_site_packages(out: TextIO = sys.stderr) -> Path:
    """The CPU-only site-packages (torch and its deps), built on first use into the cache. One
    build at a time (a demo and the e2e tests may ask together): a second caller waits for the
    first one's and uses it."""
    dest = site_packages()
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return dest
        return _build_site_packages(dest, out)


def _build_site_packages(dest: Path, out: TextIO) -> Path:
    t0 = time.monotonic()
    out.write(f"building a CPU-only PyTorch {TORCH_VERSION} into {dest} (once)\n")
    work = Path(tempfile.mkdtemp(prefix="site-", dir=dest.parent))
    try:
        # The wheels stay in the cache: a rebuild (a new stub rule, say) downloads nothing.
        wheels = dest.parent.parent / "wheels"
        pip = [sys.executable, "-m", "pip", "--quiet"]
        _run(
            [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *REQUIREMENTS]
        )
        _run(
            [*pip, "install", "--no-deps", "--no-index", "--find-links", str(wheels),
             "--target", str(work), *REQUIREMENTS]
        )  # fmt: skip
        lib = work / "torch" / "lib"
        kept = [p for p in [*work.rglob("*.so"), *work.rglob("*.so.*")] if p.name not in DROPPED]
        real = [name for name in STUBBED if (lib / name).exists()]
        exports = {name: _dynsyms(lib / name, defined=True) for name in real}
        for name in DROPPED:
            (lib / name).unlink()
        build_stubs(lib, kept, exports)
        for rel in PRUNED:
            if (work / rel).is_dir():
                shutil.rmtree(work / rel)
            else:
                (work / rel).unlink(missing_ok=True)
        for cache in list(work.rglob("__pycache__")):
            shutil.rmtree(cache)
        # Bytecode made ahead: a worker's container starts from the image's files at every
        # restart, and compiling torch's modules costs seconds each time. Unchecked hashes,
        # because the image gives every file mtime 0 and a timestamp check would fail.
        _run(
            [str(images.PYTHON), "-m", "compileall", "-q", "-j0",
             "--invalidation-mode", "unchecked-hash", str(work)]
        )  # fmt: skip
        check(work)
        (work / ".complete").write_text(TORCH_VERSION + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.write(f"  CPU PyTorch ready in {time.monotonic() - t0:.0f}s ({_size_mb(dest)} MB)\n")
    return dest


def _size_mb(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) >> 20


_NM_LINE = re.compile(r"^\s*(?:[0-9a-f]+\s+)?(?:([0-9a-f]+)\s+)?([A-Za-z])\s+(\S+)$")


def _dynsyms(path: Path, defined: bool) -> dict[str, tuple[str, int]]:
    """A library's dynamic symbols: name (with @version for imports) -> (nm type, size)."""
    flag = "--defined-only" if defined else "--undefined-only"
    syms: dict[str, tuple[str, int]] = {}
    for line in _run(["nm", "-D", "-S", flag, str(path)]).splitlines():
        m = _NM_LINE.match(line)
        if m:
            size, kind, name = m.groups()
            syms[name] = (kind, int(size, 16) if size else 0)
    return syms


def build_stubs(
    lib: Path, kept: list[Path], exports: dict[str, dict[str, tuple[str, int]]]
) -> None:
    """Writes into ``lib`` a stub for each of `STUBBED`, exporting what ``kept`` imports from it.

    A C API import names its library in its symbol version (``cudaMalloc@libcudart.so.12``);
    torch's own C++ libraries are unversioned, so their imports are found in the real
    library's ``exports`` (read with nm before it was removed, never loaded)."""
    wanted: set[str] = set()
    for path in kept:
        wanted.update(_dynsyms(path, defined=False))
    for soname, version in STUBBED.items():
        funcs: list[str] = []
        objects: list[tuple[str, int]] = []
        if version:
            funcs = sorted(s.split("@")[0] for s in wanted if s.endswith("@" + version))
        else:
            for sym, (kind, size) in sorted(exports.get(soname, {}).items()):
                if sym not in wanted:
                    continue
                if kind in "TtWwi":
                    funcs.append(sym)
                else:
                    objects.append((sym, max(size, 16)))
        _compile_stub(lib / soname, soname, version, funcs, objects)


def _compile_stub(
    dest: Path, soname: str, version: str, funcs: list[str], objects: list[tuple[str, int]]
) -> None:
    # A C API stub answers an error code. A torch C++ stub answers the address of zeroed
    # scratch memory: some of them return a reference to a static that a kept static
    # initializer writes to (c10d::get_gil_checker() does), and the scratch's alignment makes
    # a bool or small-int answer (e.g. c10::cuda::device_count()) read as 0.
    ret = f"  movl ${C_API_ERROR}, %eax" if version else "  leaq scratch(%rip), %rax"
    asm = [".text"]
    for f in funcs:
        asm += [f".globl {f}", f".type {f},@function", f"{f}:", ret, "  ret"]
    asm += [".bss", ".balign 4096", "scratch:", f"  .zero {SCRATCH_BYTES}", ".data"]
    names: list[tuple[str, str]] = []
    for o, size in objects:
        asm += [f".globl {o}", f".type {o},@object", f".size {o},{size}", ".balign 16", f"{o}:"]
        if o.startswith("_ZTI"):
            # A std::type_info that pybind11 can read the name of when it registers a class
            # of the CUDA build (torch.cuda's bindings do, at import).
            asm += [f"  .quad {TYPE_INFO_VTABLE}+16", f"  .quad .Lname_{o}", f"  .zero {size - 16}"]
            names.append((o, o[4:]))
        elif o.startswith("_ZTS"):
            asm += [f'  .asciz "{o[4:]}"', f"  .zero {max(size - len(o) + 3, 0)}"]
        else:
            asm.append(f"  .zero {size}")
    asm.append(".section .rodata")
    for o, name in names:
        asm += [f".Lname_{o}:", f'  .asciz "{name}"']
    asm.append('.section .note.GNU-stack,"",@progbits')
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "stub.s"
        src.write_text("\n".join(asm) + "\n")
        cmd = ["gcc", "-shared", "-nostdlib", "-o", str(dest), str(src), f"-Wl,-soname,{soname}"]
        if not version:
            cmd.append("-lstdc++")  # the type_info vtable
        if version:
            script = Path(tmp) / "version.map"
            script.write_text(f"{version} {{ global: *; }};\n")
            cmd.append(f"-Wl,--version-script={script}")
        _run(cmd)


CHECK = """
import os, numpy, torch, torch.distributed as dist
assert not torch.cuda.is_available()
assert torch.from_numpy(numpy.ones(3)).sum().item() == 3
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(os.environ["PORT"]),
                        rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
dist.destroy_process_group()
print("ok", torch.__version__, t.sum().item())
"""


def check(site: Path) -> None:
    """Runs the image's own interpreter on ``site``: imports torch and numpy, one gloo
    all-reduce."""
    env = {"PYTHONPATH": str(site), "PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
    got = _run([str(images.PYTHON), "-c", CHECK], env=env, timeout=120)
    if not got.startswith("ok"):
        raise PytorchBuildError(f"CPU PyTorch check printed {got!r}")


def trainer_image(out: TextIO = sys.stderr) -> images.ImageSpec:
    """Python 3.11, the CPU PyTorch and the sample program (manifests/samples/ddp)."""
    site = ensure_site_packages(out)
    extra: dict[str, Path | bytes] = {}
    libs: set[Path] = set()
    for path in site.rglob("*"):
        if not path.is_file() or path.name == ".complete":
            continue
        if path.parent == site / "bin":
            extra[f"usr/local/bin/{path.name}"] = image_script(path)
            continue
        extra[f"{SITE_IN_IMAGE}/{path.relative_to(site)}"] = path
        if ".so" in path.suffixes or path.suffix == ".so":
            libs.update(p for p in images.shared_libs(path) if site not in p.parents)
    for src in sorted(SAMPLE_DIR.glob("*.py")):
        extra[f"{SAMPLE_IN_IMAGE}/{src.name}"] = src
    spec = images.python_image(PYTORCH_IMAGE, extra)
    for name in extra:
        if name.startswith("usr/local/bin/"):
            spec.modes[name] = 0o755
    spec.files.update(stdlib_bytecode(spec))
    for so in libs:
        spec.files.setdefault(str(so).lstrip("/"), so.resolve())
    spec.env = [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        f"PYTHONPATH=/{SITE_IN_IMAGE}",
        "PYTHONUNBUFFERED=1",
        # Two cores on the node: one intra-op thread per worker keeps the gang from fighting.
        "OMP_NUM_THREADS=1",
    ]
    spec.cmd = ["/usr/bin/python3", f"/{SAMPLE_IN_IMAGE}/train.py"]
    return spec


def image_script(path: Path) -> bytes:
    """A console script of the site-packages (`torchrun`), for the image's PATH: pip wrote the
    interpreter that installed it (this host's) into its shebang; the image's is python3."""
    text = path.read_bytes()
    if text.startswith(b"#!"):
        text = b"#!/usr/bin/python3" + text[text.index(b"\n") :]
    return text


def stdlib_bytecode(spec: images.ImageSpec) -> dict[str, Path | bytes]:
    """Unchecked-hash .pyc files for the standard library modules of ``spec`` (python_image
    leaves Debian's timestamp-checked ones out: with mtime 0 in the image they would be
    stale), compiled once into the cache."""
    cache = cache_root() / "pytorch" / "stdlib-pyc"
    prefix = "usr/lib/python3.11/"
    out: dict[str, Path | bytes] = {}
    for path, src in list(spec.files.items()):
        if not (path.startswith(prefix) and path.endswith(".py") and isinstance(src, Path)):
            continue
        rel = Path(path)
        target = f"{rel.parent}/__pycache__/{rel.stem}.{sys.implementation.cache_tag}.pyc"
        pyc = cache / target
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            try:
                py_compile.compile(
                    str(src), cfile=str(pyc), dfile="/" + path, doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )  # fmt: skip
            except py_compile.PyCompileError:
                continue  # a module of another Python version's syntax: never imported
        out[target] = pyc
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m localcluster.pytorch`: build the site-packages and the image archive."""
    argparse.ArgumentParser(
        prog="python -m localcluster.pytorch",
        description=f"Build the trainer image {PYTORCH_IMAGE} into the cache (the first time: a "
        "900 MB PyTorch download and a few minutes). `localcluster trainer-image` also imports "
        "it into a node-profile cluster.",
    ).parse_args(argv)
    t0 = time.monotonic()
    spec = trainer_image()
    archive = images.write_oci_archive(spec, images.archive_path(spec))
    print(f"{archive} {archive.stat().st_size >> 20} MB in {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    os.umask(0o022)
    main()
