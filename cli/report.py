"""`gangjob report JOB`: the job's timeline (cli.timeline) drawn as a PNG or SVG with matplotlib,
the optional `report` extra: the step (or epoch) over time, each restart's downtime shaded and
labelled with its class and duration, the time spent computing lost steps again shaded after it."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from cli.timeline import ReportError, Timeline, timeline
from gangjob.client import AsyncClient

DOWNTIME_COLOR = "#d62728"
RECOMPUTE_COLOR = "#ff7f0e"


def draw(t: Timeline, path: Path) -> Path:
    """Writes the picture of `t` to `path` (its suffix picks PNG or SVG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ReportError("the picture needs matplotlib: pip install 'gangjob[report]'") from e

    def secs(at: datetime) -> float:
        return (at - t.start).total_seconds()

    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    xs = [secs(at) for at, _ in t.points]
    ys = [v for _, v in t.points]
    ax.plot(xs, ys, color="#1f77b4", linewidth=2, label=t.quantity)
    top = max(ys, default=1) or 1
    for i, r in enumerate(t.restarts):
        end = r.resumed or t.end
        ax.axvspan(secs(r.onset), secs(end), color=DOWNTIME_COLOR, alpha=0.18,
                   label="failure -> resumed" if i == 0 else None)  # fmt: skip
        if r.resumed is not None and r.lost_seconds:
            label = "lost steps computed again" if i == 0 else None
            ax.axvspan(secs(r.resumed), secs(r.resumed) + r.lost_seconds, color=RECOMPUTE_COLOR,
                       alpha=0.25, label=label)  # fmt: skip
        ax.axvline(secs(r.detected), color=DOWNTIME_COLOR, linestyle="--", linewidth=1)
        ax.annotate(f"epoch {r.epoch}: {r.label}", xy=(secs(r.detected), top),
                    xytext=(4, -12 - 12 * (i % 3)), textcoords="offset points",
                    fontsize=8, color=DOWNTIME_COLOR)  # fmt: skip
    goodput = "" if t.goodput is None else f", goodput {100 * t.goodput:.1f}%"
    ax.set_title(f"GangJob {t.name}: {t.phase}, {len(t.restarts)} restarts{goodput}")
    ax.set_xlabel(f"seconds since {t.start.strftime('%Y-%m-%d %H:%M:%S')}Z")
    ax.set_ylabel(t.quantity)
    ax.set_xlim(0, max(secs(t.end), 1))
    ax.set_ylim(0, top * 1.15 + (1 if t.quantity == "epoch" else 0))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


async def report(client: AsyncClient, args: argparse.Namespace, out: TextIO) -> int:
    obj = await client.get_raw(args.job)
    path: Path = args.output or Path(f"{args.job}-timeline.png")
    if path.suffix not in (".png", ".svg"):
        raise ReportError(f"--output {path}: a .png or .svg file")
    draw(timeline(obj, datetime.now(UTC)), path)
    print(path, file=out)
    return 0
