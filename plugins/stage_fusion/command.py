"""``rlweave fusion schedule``: search a fused actor–critic pipeline schedule for given sizes."""

from __future__ import annotations

import argparse
import json

from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, ProblemError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actor-pp", type=int, required=True, help="actor pipeline stages (GPUs)")
    parser.add_argument("--critic-pp", type=int, required=True,
                        help="critic pipeline stages; must divide --actor-pp (k replicas)")
    parser.add_argument("--actor-mb", type=int, required=True, help="actor micro-batches")
    parser.add_argument("--critic-mb", type=int, required=True, help="critic micro-batches per replica")
    parser.add_argument("--actor-fwd", type=int, required=True,
                        help="actor forward time per stage (backward: twice that)")
    parser.add_argument("--critic-fwd", type=int, required=True,
                        help="critic forward time per stage (backward: twice that)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="search budget (work calibrated to seconds; stops early at the lower bound)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-cap", type=int, default=None,
                        help="the most micro-batch activations (both models together) a GPU may hold; "
                             "default: no cap (separate 1F1B holds up to the actor's stage count)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    """Print the schedule; :class:`ProblemError` for a bad configuration (the CLI's exit 2)."""
    from rlweave.plugins.stage_fusion.search import search

    problem = FusedPipelineProblem.uniform(args.actor_pp, args.critic_pp, args.actor_mb,
                                           args.critic_mb, args.actor_fwd, args.critic_fwd)
    if not args.seconds > 0:
        raise ProblemError(f"the search budget (--seconds) must be positive, got {args.seconds}.")
    result = search(problem, seconds=args.seconds, seed=args.seed, memory_cap=args.memory_cap)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    bound = result.lower_bound.value
    print(f"fused makespan {result.makespan:g} (lower bound {bound:g}, x{result.makespan / bound:.3f}); "
          f"separate 1F1B {result.separate_1f1b:g} ({result.separate_1f1b / result.makespan:.2f}x "
          f"slower); greedy {result.greedy:g}; at most {result.resident_peak} activations on a GPU "
          f"(1F1B: {result.separate_1f1b_resident_peak}); searched {result.seconds:.1f} s")
    for g, order in enumerate(result.schedule.orders):
        peak = result.peak_memory[g]
        print(f"GPU {g:2d} (peak actor {peak[0]}, critic {peak[1]}): "
              + " ".join(f"{t.model[0]}{t.phase}{t.micro_batch}" for t in order))
    return 0
