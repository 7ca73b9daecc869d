"""The PNG of `benchmarks.scale`: restart time against gang size, one line per mode.

Drawn with matplotlib, the optional `bench` extra (`pip install -e '.[bench]'`, which
`make bench` does); without it the plot is skipped with a note and the JSON and markdown stand.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def plot_lines(
    path: Path,
    title: str,
    series: dict[str, list[tuple[int, float, float]]],
    goals: list[tuple[str, dict[int, float]]] | None = None,
) -> Path | None:
    """`series`: label -> [(N, median, p90)]; a line through the medians, p90 as error bars.
    Returns the path written, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no PNG", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    for label, points in series.items():
        if not points:
            continue
        pts = sorted(points)
        xs = [p[0] for p in pts]
        med = [p[1] for p in pts]
        up = [max(0.0, p[2] - p[1]) for p in pts]
        ax.errorbar(xs, med, yerr=[[0.0] * len(pts), up], marker="o", capsize=3, label=label)
    for label, values in goals or []:
        if values:
            pts2 = sorted(values.items())
            kw: dict[str, Any] = {"linestyle": ":", "color": "grey", "label": label}
            ax.plot([p[0] for p in pts2], [p[1] for p in pts2], **kw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("gang size N (workers)")
    ax.set_ylabel("seconds (median, bar to p90)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
