"""Lower bound on the makespan of any fused schedule (FlexFusion's ``get-lower-bound.py``).

The largest of:

1. each model's critical path: on stage ``s``, nothing of that model starts before the forwards
   of stages ``< s`` (``sum fwd[:s]``), the stage does all its micro-batches' work, and its last
   backward is followed by the backwards of stages ``< s`` (``sum bwd[:s]``); the largest over
   stages is ``(m + pp - 1) * (fwd + bwd)`` for uniform costs, 1F1B's makespan;
2. the total work over the GPUs;
3. per GPU, its work plus the earliest moment either model can start there plus the shortest
   tail either model leaves after its last task there.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.plugins.stage_fusion.problem import ACTOR, CRITIC, FusedPipelineProblem


@dataclass(frozen=True)
class LowerBound:
    value: float
    critical_path: dict[str, float]
    total_work_per_gpu: float
    per_gpu: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "critical_path": self.critical_path,
                "total_work_per_gpu": self.total_work_per_gpu, "per_gpu": list(self.per_gpu)}


def lower_bound(problem: FusedPipelineProblem) -> LowerBound:
    critical = {}
    head: dict[str, list[float]] = {}  # per GPU: earliest start of the model there
    tail: dict[str, list[float]] = {}  # per GPU: backward time that must follow its last task
    work: dict[str, list[float]] = {}
    for model in (ACTOR, CRITIC):
        costs = problem.costs(model)
        mb = problem.actor_mb if model == ACTOR else problem.critic_mb  # per pipeline replica
        stage_of = [g if model == ACTOR else problem.critic_stage(g) for g in range(problem.gpus)]
        head[model] = [sum(costs.fwd[:s]) for s in stage_of]
        tail[model] = [sum(costs.bwd[:s]) for s in stage_of]
        work[model] = [mb * (costs.fwd[s] + costs.bwd[s]) for s in stage_of]
        critical[model] = max(h + w + t for h, w, t in zip(head[model], work[model], tail[model]))
    gpu_work = [work[ACTOR][g] + work[CRITIC][g] for g in range(problem.gpus)]
    total = sum(gpu_work) / problem.gpus
    per_gpu = tuple(gpu_work[g] + min(head[ACTOR][g], head[CRITIC][g])
                    + min(tail[ACTOR][g], tail[CRITIC][g]) for g in range(problem.gpus))
    return LowerBound(max(*critical.values(), total, *per_gpu), critical, total, per_gpu)
