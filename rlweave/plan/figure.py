"""The plan as one PNG: a bar per plugin and per composable set (its step over verl's default),
its lower bound marked, every bar labelled SIMULATED or MODELLED, the rows without a prediction
named. matplotlib comes with the bench extra and is imported only here, when asked to draw."""

from __future__ import annotations

from pathlib import Path

from rlweave.plan.plugins import PluginPlan


def draw_plan(plan: PluginPlan, path: str | Path) -> Path:
    """Write the plan's bars to ``path``; raises ``RuntimeError`` naming the bench extra when
    matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        from rlweave.cli import BENCH_EXTRA

        raise RuntimeError(f"--png needs matplotlib, which comes with the bench extra: {BENCH_EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(plan.rows)[::-1]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.6))
    for y, r in enumerate(rows):
        if r.ratio is None:
            ax.text(0.02, y, f"no prediction: {r.note[:70]}", va="center", fontsize=7, color="0.4")
            continue
        ax.barh(y, r.ratio, color="tab:blue" if r.label == "SIMULATED" else "tab:orange", height=0.6)
        ax.plot([r.bound_ratio] * 2, [y - 0.35, y + 0.35], color="k", lw=2)
        ax.text(r.ratio + 0.01, y, f"{r.ratio:.2f} ({r.label})", va="center", fontsize=7)
    ax.axvline(1.0, color="0.5", ls=":", lw=1)
    ax.set_yticks(range(len(rows)), [r.name for r in rows], fontsize=7)
    ax.set_xlim(0, max([1.2, *(r.ratio + 0.25 for r in rows if r.ratio is not None)]))
    ax.set_xlabel("predicted step / verl's default step (below 1: faster); black tick: lower bound")
    ax.set_title(f"rlweave plan on {plan.baseline.cluster.gpus} GPUs: verl's default step "
                 f"{plan.baseline.step.step_s:.1f} s (SIMULATED + MODELLED, not measured)", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
