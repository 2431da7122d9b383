"""``rlweave bench fusion-schedule``: RLHFuse's fused actor–critic pipeline schedule over a sweep.

For every configuration of the issue's sweep (actor pp0 in {4, 8, 16}; critic pp1 in
{pp0/2, pp0}; m micro-batches for the actor and m per critic replica, m in {pp0, 2 pp0, 4 pp0};
forward costs actor:critic in {2:1, 2:2, 1:2}, backward twice the forward) it runs the search
(``rlweave fusion schedule``'s code path) and reports, beside the lower bound:

- makespan / lower bound of the searched schedule, and of FlexFusion's greedy list schedule;
- speed-up over separate 1F1B (the actor's 1F1B then the critic's: what a PPO trainer does);
- peak activation memory (sum over GPUs and models, micro-batch activations) beside 1F1B's;
- the search's wall seconds on this machine.

All makespans are **simulated** (list scheduling of the order with the given integer costs):
this benchmark measures the search, not a cluster. ``rlweave bench fusion-executor`` runs
schedules on real stages. The PNG: one configuration's searched schedule as a Gantt chart per
GPU above separate 1F1B's, on one time axis.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from rlweave.benchmarks import BenchResult

SWEEP_PP = (4, 8, 16)
COST_RATIOS = ((2, 1), (2, 2), (1, 2))
QUICK_PP = (4, 8)
PLOTTED = (8, 8, 8, 2, 2)  # (pp0, pp1, m, f0, f1) drawn in the PNG when swept


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="search budget per configuration (work calibrated to seconds)")
    parser.add_argument("--quick", action="store_true",
                        help="a small sweep: pp0 in {4, 8}, m = pp0, costs 2:2 and 1:2")


def sweep(quick: bool) -> list[tuple[int, int, int, int, int]]:
    if quick:
        return [(pp0, pp1, pp0, f0, f1) for pp0 in QUICK_PP for pp1 in (pp0 // 2, pp0)
                for f0, f1 in COST_RATIOS[1:]]
    return [(pp0, pp1, m, f0, f1) for pp0 in SWEEP_PP for pp1 in (pp0 // 2, pp0)
            for m in (pp0, 2 * pp0, 4 * pp0) for f0, f1 in COST_RATIOS]


def run(args: argparse.Namespace) -> BenchResult:
    from rich.console import Console
    from rich.progress import track

    from rlweave.plugins.stage_fusion.baselines import separate_1f1b
    from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
    from rlweave.plugins.stage_fusion.schedule import Evaluator
    from rlweave.plugins.stage_fusion.search import search

    configs, runs = sweep(args.quick), []
    plotted = PLOTTED if PLOTTED in configs else configs[0]
    gantt: dict[str, Any] = {}
    for pp0, pp1, m, f0, f1 in track(configs, description="fusion-schedule (simulated)",
                                     console=Console(stderr=True)):
        problem = FusedPipelineProblem.uniform(pp0, pp1, m, m, f0, f1)
        result = search(problem, seconds=args.seconds, seed=args.seed)
        # the same search held to separate 1F1B's activation memory (always feasible: 1F1B is)
        capped = search(problem, seconds=args.seconds, seed=args.seed, memory_cap=result.separate_1f1b_resident_peak)
        bound = result.lower_bound.value
        runs.append({"actor_pp": pp0, "critic_pp": pp1, "micro_batches": m, "actor_fwd": f0,
                     "critic_fwd": f1, "lower_bound": bound, "makespan": result.makespan,
                     "greedy": result.greedy, "separate_1f1b": result.separate_1f1b,
                     "ratio": result.makespan / bound, "greedy_ratio": result.greedy / bound,
                     "speedup": result.separate_1f1b / result.makespan,
                     "peak_memory": int(result.peak_memory.sum()),
                     "peak_memory_1f1b": int(Evaluator.peak_memory(separate_1f1b(problem)).sum()),
                     "resident_peak": result.resident_peak, "resident_peak_1f1b": result.separate_1f1b_resident_peak,
                     "capped_makespan": capped.makespan, "capped_speedup": result.separate_1f1b / capped.makespan,
                     "seconds": result.seconds, "capped_seconds": capped.seconds})
        if (pp0, pp1, m, f0, f1) == plotted:
            gantt = {"sizes": [pp0, pp1, m, m, f0, f1], "fused": result.schedule.to_json(),
                     "lower_bound": bound}
    return report(runs, gantt, args)


def report(runs: list[dict[str, Any]], gantt: dict[str, Any], args: argparse.Namespace) -> BenchResult:
    ratios, speedups = [r["ratio"] for r in runs], [r["speedup"] for r in runs]
    headline = {
        "configs": len(runs),
        "mean_makespan_over_lb": round(statistics.mean(ratios), 4),
        "max_makespan_over_lb": round(max(ratios), 4),
        "at_lower_bound": sum(r["makespan"] <= r["lower_bound"] for r in runs),
        "mean_greedy_over_lb": round(statistics.mean(r["greedy_ratio"] for r in runs), 4),
        "mean_speedup_vs_1f1b": round(statistics.mean(speedups), 3),
        "min_speedup_vs_1f1b": round(min(speedups), 3),
        "max_speedup_vs_1f1b": round(max(speedups), 3),
        "mean_speedup_within_1f1b_memory": round(statistics.mean(r["capped_speedup"] for r in runs), 3),
        "max_speedup_within_1f1b_memory": round(max(r["capped_speedup"] for r in runs), 3),
        "max_search_s": round(max(r["seconds"] for r in runs), 2),
        "goal_met": statistics.mean(ratios) <= 1.04 and max(ratios) <= 1.10
        and max(r["seconds"] for r in runs) <= 60,
    }
    rows = [["pp0", "pp1", "m", "f0:f1", "lower bound", "fused", "/LB", "greedy /LB",
             "1F1B", "speed-up", "peak mem (1F1B)", "most on a GPU (1F1B)", "speed-up within 1F1B's memory",
             "search s"]]
    for r in runs:
        rows.append([str(r["actor_pp"]), str(r["critic_pp"]), str(r["micro_batches"]),
                     f"{r['actor_fwd']}:{r['critic_fwd']}", f"{r['lower_bound']:g}", f"{r['makespan']:g}",
                     f"{r['ratio']:.3f}", f"{r['greedy_ratio']:.3f}", f"{r['separate_1f1b']:g}",
                     f"{r['speedup']:.3f}x", f"{r['peak_memory']} ({r['peak_memory_1f1b']})",
                     f"{r['resident_peak']} ({r['resident_peak_1f1b']})", f"{r['capped_speedup']:.3f}x",
                     f"{r['seconds']:.1f}"])
    regime = (f"SIMULATED makespans (list scheduling of each order, integer costs, backward = 2x "
              f"forward); search budget {args.seconds:g} (work calibrated to seconds) per "
              f"configuration, seed {args.seed}, one process on this machine; lower bound = "
              "max(critical path of each model, work per GPU + earliest start + shortest tail); 'within "
              "1F1B's memory': the same search capped at the most activations separate 1F1B holds on a GPU")
    print(f"[rlweave] fusion-schedule: mean makespan/LB {headline['mean_makespan_over_lb']}, "
          f"max {headline['max_makespan_over_lb']}, speed-up over separate 1F1B "
          f"{headline['mean_speedup_vs_1f1b']}x mean", file=sys.stderr)
    return BenchResult(headline, rows, regime, details={"runs": runs, "gantt": gantt})


def plot(result: BenchResult, path: Path) -> Path:
    from rlweave.plugins.stage_fusion.baselines import separate_1f1b
    from rlweave.plugins.stage_fusion.gantt import plot_fused_schedule
    from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
    from rlweave.plugins.stage_fusion.schedule import Evaluator, FusedPipelineSchedule

    gantt = result.details["gantt"]
    problem = FusedPipelineProblem.uniform(*gantt["sizes"])
    fused = FusedPipelineSchedule.from_json(gantt["fused"])
    separate = Evaluator(problem).expand(separate_1f1b(problem))
    return plot_fused_schedule(problem, [("fused (searched)", fused), ("separate 1F1B", separate)],
                               path, lower_bound=gantt["lower_bound"])


def demo_part(console: Any, out: Path) -> bool:
    """A ``rlweave demo`` part: search one configuration, print the figures, draw the Gantt
    chart beside separate 1F1B; its check is that the fused order beats 1F1B and respects the
    lower bound."""
    from rlweave.plugins.stage_fusion.baselines import separate_1f1b
    from rlweave.plugins.stage_fusion.gantt import plot_fused_schedule
    from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
    from rlweave.plugins.stage_fusion.schedule import Evaluator
    from rlweave.plugins.stage_fusion.search import search

    pp0, pp1, m, f0, f1 = PLOTTED
    problem = FusedPipelineProblem.uniform(pp0, pp1, m, m, f0, f1)
    result = search(problem, seconds=5.0)
    png = plot_fused_schedule(problem, [("fused (searched)", result.schedule),
                                        ("separate 1F1B", Evaluator(problem).expand(separate_1f1b(problem)))],
                              out / "fusion-schedule.png", lower_bound=result.lower_bound.value)
    console.print(f"actor pp={pp0}, critic pp={pp1}, {m} micro-batches each (simulated): fused "
                  f"makespan {result.makespan:g}, lower bound {result.lower_bound.value:g}, separate "
                  f"1F1B {result.separate_1f1b:g} ({result.separate_1f1b / result.makespan:.2f}x); wrote {png}")
    return result.lower_bound.value <= result.makespan < result.separate_1f1b
