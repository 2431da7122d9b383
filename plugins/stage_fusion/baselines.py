"""Schedules to compare against, and the list scheduler the search starts from.

- :func:`separate_1f1b`: what a PPO trainer does today: the actor's 1F1B on all stages, then
  the critic replicas' 1F1B (each GPU starts the critic when it has finished the actor).
- :func:`greedy`: FlexFusion's greedy list schedule: repeatedly run the schedulable task that
  can start earliest (forward first on ties); a task of the smaller model may only take a GPU
  if it ends before the larger model could start there, so it fills bubbles and never delays
  the larger model.
"""

from __future__ import annotations

from collections.abc import Callable

from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
from rlweave.plugins.stage_fusion.schedule import Evaluator, Order


def one_f_one_b(stages: int, stage: int, micro_batches: int, kind: int) -> Order:
    """Megatron's non-interleaved 1F1B order of one stage: ``stages - stage - 1`` warm-up
    forwards, then one forward and one backward alternately, then the remaining backwards.
    ``kind`` is the compact kind of the forward (the backward is ``kind + 1``)."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [(kind, k) for k in range(warmup)]
    for k in range(micro_batches - warmup):
        order += [(kind, warmup + k), (kind + 1, k)]
    return order + [(kind + 1, k) for k in range(micro_batches - warmup, micro_batches)]


def separate_1f1b(problem: FusedPipelineProblem) -> list[Order]:
    evaluator = Evaluator(problem)
    return [one_f_one_b(problem.actor_pp, g, problem.actor_mb, 0)
            + one_f_one_b(problem.critic_pp, evaluator.stage[1][g], problem.critic_mb, 2)
            for g in range(problem.gpus)]


# pick(candidates, gpu_free) -> index; a candidate is (start, gpu, kind, k, duration)
Candidate = tuple[float, int, int, int, float]
Picker = Callable[[list[Candidate]], int]


def list_schedule(problem: FusedPipelineProblem, pick: Picker) -> list[Order]:
    """Build orders task by task: ``pick`` chooses among every task whose predecessor has run
    (each kind in micro-batch order on each GPU), with the time it could start."""
    ev = Evaluator(problem)
    gpus, counts = problem.gpus, (problem.actor_mb, problem.actor_mb, problem.critic_mb, problem.critic_mb)
    end = [[[-1.0] * counts[kind] for _ in range(gpus)] for kind in range(4)]
    nxt = [[0] * 4 for _ in range(gpus)]
    free = [0.0] * gpus
    orders: list[Order] = [[] for _ in range(gpus)]
    for _ in range(gpus * sum(counts)):
        candidates = []
        for g in range(gpus):
            for kind in range(4):
                k = nxt[g][kind]
                if k == counts[kind]:
                    continue
                j = kind >> 1
                if kind & 1:
                    pg = ev.bwd_pred[j][g]
                    ready = end[kind][pg][k] if pg >= 0 else end[kind - 1][g][k]
                else:
                    pg = ev.fwd_pred[j][g]
                    ready = end[kind][pg][k] if pg >= 0 else 0.0
                if ready >= 0:
                    candidates.append((max(ready, free[g]), g, kind, k, ev.duration[g][kind]))
        start, g, kind, k, duration = candidates[pick(candidates)]
        free[g] = end[kind][g][k] = start + duration
        nxt[g][kind] += 1
        orders[g].append((kind, k))
    return orders


def larger_model(problem: FusedPipelineProblem) -> int:
    """0 (actor) or 1 (critic): the model with more work per GPU."""
    actor = problem.actor_mb * (sum(problem.actor_costs.fwd) + sum(problem.actor_costs.bwd)) / problem.actor_pp
    critic = problem.critic_mb * (sum(problem.critic_costs.fwd) + sum(problem.critic_costs.bwd)) / problem.critic_pp
    return 0 if actor >= critic else 1


def greedy(problem: FusedPipelineProblem) -> list[Order]:
    large = larger_model(problem)

    def pick(candidates: list[Candidate]) -> int:
        large_start: dict[int, float] = {}
        for start, g, kind, _, _ in candidates:
            if kind >> 1 == large:
                large_start[g] = min(start, large_start.get(g, start))
        allowed = [i for i, (start, g, kind, _, duration) in enumerate(candidates)
                   if kind >> 1 == large or start + duration <= large_start.get(g, float("inf"))]
        return min(allowed, key=lambda i: (candidates[i][0], candidates[i][2] & 1,
                                           candidates[i][2] >> 1 != large))

    return list_schedule(problem, pick)
