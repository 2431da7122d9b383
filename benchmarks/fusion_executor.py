"""``rlweave bench fusion-executor``: a fused actor–critic schedule run on real pipeline stages.

Two gloo processes, one core each (a rank stands for a device), hold a tiny Llama actor split
into ``pp0 = 2`` stages and a value-head critic split into ``--critic-pp`` stages (reversed,
``2 / critic_pp`` replicas), and train one step on the same micro-batches two ways, through the
same executor (:mod:`rlweave.adapters.torch_pipeline`):

- **separate 1F1B**: the actor's 1F1B, then the critic's (what a PPO trainer does today);
- **fused**: the order ``rlweave fusion schedule``'s search finds for the costs measured here.

How: a few warm-up steps of each order measure every task's duration on its stage; both ranks
gather them and run the same deterministic search on those costs, so they hold the same fused
order. Then the two orders alternate for ``--repeats`` rounds (this machine's speed drifts), each
step timed from a barrier to a barrier. The simulator's prediction of both makespans uses the
median task durations of the measured rounds themselves. Reported: median step time of each
(with the spread), the speed-up, the predicted speed-up and makespans, and the lower bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from rlweave.benchmarks import BenchResult

ACTOR_PP = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--critic-pp", type=int, choices=(1, 2), default=2,
                        help="critic stages (2: one reversed replica; 1: two replicas)")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="micro-batches of the actor, and of each critic replica")
    parser.add_argument("--repeats", type=int, default=6, help="timed rounds (each: both orders)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each order first")
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--layers-per-stage", type=int, default=2)


def run(args: argparse.Namespace) -> BenchResult:
    from rlweave.adapters.torch_pipeline.launch import run_world

    print(f"[rlweave] fusion-executor: {ACTOR_PP} gloo ranks, one core each, "
          f"{args.repeats} interleaved rounds", file=sys.stderr)
    settings = {k: getattr(args, k) for k in ("critic_pp", "micro_batches", "repeats", "warmup",
                                               "batch", "seq", "layers_per_stage", "seed")}
    ranks = run_world(ACTOR_PP, rank_body, settings, cores=[0, 1], timeout_s=900)
    return report(ranks, settings)


def _problem(settings: dict[str, Any], costs: dict[str, list[list[float]]] | None = None) -> Any:
    """The fused problem of this run; with ``costs`` (per model [fwd per stage, bwd per stage])."""
    from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, StageCosts

    m, pp1 = settings["micro_batches"], settings["critic_pp"]
    if costs is None:
        return FusedPipelineProblem.uniform(ACTOR_PP, pp1, m, m, 1, 1)
    return FusedPipelineProblem(ACTOR_PP, pp1, m, m, StageCosts(*map(tuple, costs["actor"])),
                                StageCosts(*map(tuple, costs["critic"])))


def _costs(spans: list[list[tuple]], settings: dict[str, Any]) -> dict[str, list[list[float]]]:
    """Median duration of each (model, stage, phase) over every rank's spans."""
    durations: dict[tuple[str, int, str], list[float]] = {}
    for rank_spans in spans:
        for (model, _, stage, phase), start, end in rank_spans:
            durations.setdefault((model, stage, phase), []).append(end - start)
    return {model: [[statistics.median(durations[model, s, phase]) for s in range(stages)]
                    for phase in ("F", "B")]
            for model, stages in (("actor", ACTOR_PP), ("critic", settings["critic_pp"]))}


def rank_body(rank: int, world: int, settings: dict[str, Any]) -> dict[str, Any]:
    """One rank: build the stages, measure, search the fused order, time both orders."""
    import time

    import torch.distributed as dist

    from rlweave.adapters.torch_pipeline.executor import FusedPipelineExecutor
    from rlweave.adapters.torch_pipeline.placement import Placement
    from rlweave.adapters.torch_pipeline.stages import HIDDEN, Stage, TinyModel, make_batches
    from rlweave.plugins.stage_fusion.baselines import separate_1f1b
    from rlweave.plugins.stage_fusion.schedule import Evaluator
    from rlweave.plugins.stage_fusion.search import search

    pp1, m, per = settings["critic_pp"], settings["micro_batches"], settings["layers_per_stage"]
    replicas = world // pp1
    actor_model = TinyModel(world * per, value_head=False, seed=1)
    critic_model = TinyModel(pp1 * per, value_head=True, seed=2)
    executor = FusedPipelineExecutor(
        Placement(world, pp1, m, m), Stage(actor_model, rank, world),
        Stage(critic_model, pp1 - 1 - rank % pp1, pp1), (settings["batch"], settings["seq"], HIDDEN))
    batches = {"actor": make_batches(m, settings["batch"], settings["seq"], 10),
               "critic": make_batches(m * replicas, settings["batch"], settings["seq"], 20)}
    problem = _problem(settings)
    orders = {"separate_1f1b": Evaluator(problem).expand(separate_1f1b(problem)).to_json()}

    def step(name: str) -> tuple[float, list]:
        for model in (actor_model, critic_model):
            model.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        trace = executor.step(orders[name], batches)
        dist.barrier()
        return time.perf_counter() - t0, trace.spans

    warm = [step("separate_1f1b")[1] for _ in range(settings["warmup"])]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, [s for spans in warm for s in spans])
    measured = _problem(settings, _costs([g for g in gathered], settings))
    # the same deterministic search on the same gathered costs gives every rank the same order
    orders["fused"] = search(measured, seconds=2.0, seed=settings["seed"]).schedule.to_json()
    for _ in range(settings["warmup"]):
        step("fused")
    times: dict[str, list[float]] = {"separate_1f1b": [], "fused": []}
    spans: list[tuple] = []
    for r in range(settings["repeats"]):
        for name in (("fused", "separate_1f1b") if r % 2 else ("separate_1f1b", "fused")):
            seconds, rank_spans = step(name)
            times[name].append(seconds)
            spans += rank_spans
    return {"times": times, "spans": spans, "orders": orders}


def report(ranks: list[dict[str, Any]], settings: dict[str, Any]) -> BenchResult:
    from rlweave.plugins.stage_fusion.bounds import lower_bound
    from rlweave.plugins.stage_fusion.schedule import FusedPipelineSchedule, simulate

    costs = _costs([r["spans"] for r in ranks], settings)
    problem = _problem(settings, costs)
    times = ranks[0]["times"]  # barrier to barrier: the same on every rank
    measured = {name: statistics.median(t) for name, t in times.items()}
    predicted = {name: simulate(problem, FusedPipelineSchedule.from_json(order)).makespan
                 for name, order in ranks[0]["orders"].items()}
    bound = lower_bound(problem).value
    speedups = [s / f for s, f in zip(times["separate_1f1b"], times["fused"])]
    headline = {
        "fused_step_s": round(measured["fused"], 4),
        "separate_1f1b_step_s": round(measured["separate_1f1b"], 4),
        "speedup": round(measured["separate_1f1b"] / measured["fused"], 3),
        "speedup_per_round": [round(s, 3) for s in speedups],
        "predicted_speedup": round(predicted["separate_1f1b"] / predicted["fused"], 3),
        "prediction_error_fused": round(abs(predicted["fused"] - measured["fused"]) / measured["fused"], 3),
        "prediction_error_separate": round(abs(predicted["separate_1f1b"] - measured["separate_1f1b"])
                                           / measured["separate_1f1b"], 3),
        "lower_bound_speedup": round(measured["separate_1f1b"] / bound, 3),
    }
    rows = [["order", "measured step s (median)", "min - max", "simulated s", "lower bound s"]]
    for name in ("separate_1f1b", "fused"):
        rows.append([name, f"{measured[name]:.4f}", f"{min(times[name]):.4f} - {max(times[name]):.4f}",
                     f"{predicted[name]:.4f}", f"{bound:.4f}"])
    regime = (f"measured: {ACTOR_PP} gloo CPU processes pinned one core each (uncontended, under "
              f"the measurement lock), actor {ACTOR_PP} stages x {settings['layers_per_stage']} "
              f"Llama layers, critic {settings['critic_pp']} stages x{ACTOR_PP // settings['critic_pp']} "
              f"replicas, {settings['micro_batches']} micro-batches of {settings['batch']}x"
              f"{settings['seq']} tokens each; {settings['repeats']} interleaved rounds; simulated "
              "column: the simulator on the median task durations measured in these rounds")
    details = {"times": times, "costs": costs, "predicted": predicted, "lower_bound": bound,
               "settings": settings, "orders": ranks[0]["orders"],
               "spans": [[list(e), s, t] for e, s, t in ranks[0]["spans"]]}
    return BenchResult(headline, rows, regime, details=details)


def plot(result: BenchResult, path: Path) -> Path:
    from rlweave.plugins.stage_fusion.gantt import plot_fused_schedule
    from rlweave.plugins.stage_fusion.schedule import FusedPipelineSchedule

    problem = _problem(result.details["settings"], result.details["costs"])
    orders = result.details["orders"]
    panels = [(f"{name} (simulated on measured costs; measured {result.headline[key]:.3f} s)",
               FusedPipelineSchedule.from_json(orders[name]))
              for name, key in (("fused", "fused_step_s"), ("separate_1f1b", "separate_1f1b_step_s"))]
    return plot_fused_schedule(problem, panels, path, lower_bound=result.details["lower_bound"])
