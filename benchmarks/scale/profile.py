"""Sampling stacks over each measured restart: this process's (`--py-spy DIR`: which of its CPU
is the simulation's (the simulated kubelets, the stand-in trainers, the observer's polls) and
which the real agents'), or the controller's (`--py-spy-controller DIR`: where its own cost of
a restart goes). py-spy attaches from outside and samples without stopping the process
(`--nonblocking`), so the restart it samples runs as it would unsampled, less the core py-spy
takes; the timings of a sampled run are not the benchmark's numbers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

RATE = 200
"""Samples a second."""
ATTACH_S = 1.0
"""py-spy's time to attach and take its first samples, before the restart is injected."""


@contextlib.asynccontextmanager
async def profiled(out: Path | None, pid: int | None = None) -> AsyncIterator[None]:
    """py-spy records process `pid` (None: this one) into `out` (collapsed stacks, one
    `frames count` per line) while the block runs; nothing when `out` is None."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        spy, "record", "--pid", str(pid or os.getpid()), "--rate", str(RATE), "--nonblocking",
        "--format", "raw", "--output", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(ATTACH_S)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        await proc.wait()
        print(f"  py-spy: {out}", file=sys.stderr)
