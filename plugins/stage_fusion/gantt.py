"""Gantt charts of pipeline schedules: one row per GPU, actor and critic in two colours.

Forwards are drawn lighter than backwards and labelled with their micro-batch when there is
room; white gaps are bubbles. :func:`plot_fused_schedule` is what the demo and the
``fusion-schedule`` benchmark call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlweave.plugins.stage_fusion.problem import ACTOR, FORWARD, FusedPipelineProblem
from rlweave.plugins.stage_fusion.schedule import FusedPipelineSchedule, simulate

COLOURS = {(ACTOR, "F"): "#9ecae1", (ACTOR, "B"): "#2171b5",
           ("critic", "F"): "#fdae6b", ("critic", "B"): "#d94801"}


def draw_schedule(ax: Any, problem: FusedPipelineProblem, schedule: FusedPipelineSchedule,
                  title: str, horizon: float | None = None) -> None:
    """Draw ``schedule`` on a matplotlib axis (GPU 0 at the top)."""
    sim = simulate(problem, schedule)
    for g, order in enumerate(schedule.orders):
        for task, start, end in zip(order, sim.start[g], sim.end[g]):
            ax.barh(g, end - start, left=start, height=0.8, color=COLOURS[(task.model, task.phase)],
                    edgecolor="white", linewidth=0.3)
            if end - start >= 0.02 * (horizon or sim.makespan) and problem.gpus <= 16:
                ax.text((start + end) / 2, g, str(task.micro_batch), ha="center", va="center",
                        fontsize=5, color="black" if task.phase == FORWARD else "white")
    ax.set_ylim(problem.gpus - 0.5, -0.5)
    ax.set_xlim(0, horizon or sim.makespan)
    ax.set_yticks(range(problem.gpus))
    ax.set_ylabel("GPU")
    ax.set_title(f"{title}: makespan {sim.makespan:g}", fontsize=9, loc="left")


def plot_fused_schedule(problem: FusedPipelineProblem,
                        panels: Sequence[tuple[str, FusedPipelineSchedule]], path: str | Path,
                        lower_bound: float | None = None) -> Path:
    """One Gantt panel per ``(title, schedule)`` on a common time axis; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    horizon = max(simulate(problem, s).makespan for _, s in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.2 + 0.28 * problem.gpus * len(panels)),
                             sharex=True, squeeze=False)
    for ax, (title, schedule) in zip(axes[:, 0], panels):
        draw_schedule(ax, problem, schedule, title, horizon)
        if lower_bound is not None:
            ax.axvline(lower_bound, color="black", linestyle=":", linewidth=1)
    axes[-1, 0].set_xlabel("time" + ("  (dotted: lower bound)" if lower_bound is not None else ""))
    fig.legend(handles=[Patch(color=c, label=f"{m} {'forward' if p == 'F' else 'backward'}")
                        for (m, p), c in COLOURS.items()], loc="upper right", ncol=4, fontsize=7)
    fig.suptitle(f"actor pp={problem.actor_pp} ({problem.actor_mb} micro-batches), critic "
                 f"pp={problem.critic_pp} x{problem.replicas} ({problem.critic_mb} each)",
                 fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
