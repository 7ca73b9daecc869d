"""Where the CPU went during a restart: CPU seconds of this process (the simulated kubelets and
agents, and the observer), the controller, each process of the cluster and the peer's
controller, sampled while a repetition runs and read over the restart's own span."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import resource
import time
from collections.abc import AsyncIterator, Mapping

from benchmarks.common import cpu_seconds
from benchmarks.scale.settings import POLL

BENCH = "bench"
"""This process: thousands of simulated kubelets and real agents, and the observer's polls."""


def own_cpu() -> float:
    """User + system CPU seconds of this process, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuSampler:
    """Every `POLL` seconds, the CPU seconds so far of this process and of `pids` (by name);
    `spent` interpolates them at the edges of a span."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.times: list[float] = []
        self.cpu: list[dict[str, float]] = []

    def sample(self) -> None:
        now = time.monotonic()
        cpu = {BENCH: own_cpu()}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError, ValueError, IndexError):  # it ended meanwhile
                cpu[name] = cpu_seconds(pid)
        self.times.append(now)
        self.cpu.append(cpu)

    def at(self, name: str, t: float) -> float | None:
        """`name`'s CPU seconds at `t`, interpolated between the samples around it."""
        i = bisect.bisect_left(self.times, t)
        lo, hi = max(0, i - 1), min(len(self.times) - 1, i)
        a, b = self.cpu[lo].get(name), self.cpu[hi].get(name)
        if a is None or b is None:
            return None
        span = self.times[hi] - self.times[lo]
        share = (t - self.times[lo]) / span if span > 0 else 0.0
        return a + (b - a) * min(1.0, max(0.0, share))

    def spent(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """CPU seconds of each process within `windows` (monotonic start, end)."""
        out: dict[str, float] = {}
        if not self.times:
            return out
        for name in (BENCH, *self.pids):
            total = 0.0
            for start, end in windows:
                a, b = self.at(name, start), self.at(name, end)
                if a is None or b is None:
                    break
                total += b - a
            else:
                out[name] = round(total, 2)
        return out

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, pids: Mapping[str, int]) -> AsyncIterator[CpuSampler]:
        """A sampler that samples until the block ends, once more at its end."""
        sampler = cls(pids)

        async def loop() -> None:
            while True:
                sampler.sample()
                await asyncio.sleep(POLL)

        task = asyncio.create_task(loop())
        try:
            yield sampler
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            sampler.sample()
