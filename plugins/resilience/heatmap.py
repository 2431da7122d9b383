"""MegaScale's per-rank heat-map: how long each worker takes in each section, against the median
worker of its role, averaged over the steps of a run.

Input: the section spans rlweave's trace recorded from the heartbeats (``args.section`` set,
one span per worker, section and step). A cell is the worker's median section time divided by
the median of its role's workers: 1 is typical, 3 is three times the median (a straggler).
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def section_ratios(events: Sequence[dict[str, Any]], min_s: float = 0.0
                   ) -> tuple[list[str], list[str], list[list[float]], list[list[float]]]:
    """(workers, sections, ratio[worker][section], median seconds[worker][section]); NaN where
    a worker has no such section. Sections whose median is under ``min_s`` are left out."""
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("args", {}).get("section"):
            times[(e["worker"], e["name"])].append(e["dur"] / 1e6)
    workers = sorted({w for w, _ in times}, key=lambda w: (w.split(":")[0], w))
    median = {key: statistics.median(v) for key, v in times.items()}
    role = lambda w: w.split(":")[0] + ("/" + w.split("/", 1)[1] if "/" in w else "")  # noqa: E731
    reference = {}
    for (w, s), m in median.items():
        reference.setdefault((role(w), s), []).append(m)
    reference = {k: statistics.median(v) for k, v in reference.items()}
    sections = sorted({s for (_, s) in median if max(reference.get((role(w), s), 0) for w in workers) >= min_s})
    nan = float("nan")
    ratios = [[median[(w, s)] / reference[(role(w), s)] if (w, s) in median and reference[(role(w), s)] > 0
               else nan for s in sections] for w in workers]
    seconds = [[median.get((w, s), nan) for s in sections] for w in workers]
    return workers, sections, ratios, seconds


def write_straggler_heatmap(events: Sequence[dict[str, Any]], path: str | os.PathLike, title: str,
                            min_s: float = 0.01) -> Path:
    """The heat-map as a PNG: one row per worker, one column per section, coloured by the ratio
    to the median worker (capped at 3), each cell labelled with the ratio and the seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workers, sections, ratios, seconds = section_ratios(events, min_s)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * max(len(sections), 1), 1.2 + 0.45 * max(len(workers), 1)))
    if workers and sections:
        grid = np.array(ratios, dtype=float)
        image = ax.imshow(np.clip(grid, 0.0, 3.0), cmap="RdYlGn_r", vmin=0.5, vmax=3.0, aspect="auto")
        for i in range(len(workers)):
            for j in range(len(sections)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}x\n{seconds[i][j]:.2f}s", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(sections)), sections, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(workers)), workers, fontsize=8)
        fig.colorbar(image, ax=ax, label="median time / median worker of the role")
    else:
        ax.text(0.5, 0.5, "no section timings in the trace", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
