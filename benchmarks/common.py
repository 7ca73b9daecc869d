"""What the benchmarks share: process accounting, progress lines, result files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

RESULTS = Path(__file__).resolve().parent / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Progress:
    """A line every `every` seconds while something long runs, so a user sees it move."""

    def __init__(self, label: str, every: float = 5.0) -> None:
        self.label, self.every = label, every
        self.start = self.last = time.monotonic()

    def tick(self, state: str | Callable[[], str]) -> None:
        """Prints `state` if a line is due; a callable is called only then (a state that
        counts thousands of agents costs the simulation's CPU at every poll otherwise)."""
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            text = state() if callable(state) else state
            print(f"  ... {self.label}: {text} ({now - self.start:.0f}s)", file=sys.stderr)


def write_json(name: str, data: Any, directory: Path = RESULTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


T = TypeVar("T")


async def until_terminated(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`, cancelled by SIGTERM as SIGINT cancels it: a benchmark stopped either way takes
    down the controllers and agents it started (and its cluster, unless `--keep`), instead of
    leaving a controller reconciling the next run's gangs."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
