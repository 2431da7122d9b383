"""SIMULATED ablation of ``rlweave bench agentic``, not part of the shipped plugin: adaptive
parallelism for the tail (Heddle's "how"), regrouping instances with more tensor parallelism once
only a few long trajectories remain. vLLM cannot reshard a live engine, and one CPU engine here
has no tensor-parallel profile, so the decision rule below runs in :mod:`.agentic_sim` only,
with an assumed speedup.

Early in a rollout many short trajectories want throughput, which many small instances give.
At the end a few long trajectories decide the makespan, and each is bound by per-token latency,
which tensor parallelism cuts. Switching costs a reconfiguration (weights resharded, or a
pre-provisioned standby group woken), and only the generation part of a trajectory speeds up,
never its tool calls. So switch when the tail fits in the merged group's slots and the slowest
trajectory's remaining time, with generation sped up plus the switch, is shorter than without.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlweave.plugins.agentic_rollout.placement import EngineCostModel, TrajectoryLoad


@dataclass(frozen=True)
class TailParallelism:
    """``merge`` instances become one with ``merge``x tensor parallelism, whose decode
    iterations are ``speedup``x faster, after ``switch_s`` of reconfiguration."""

    merge: int = 2
    speedup: float = 1.6
    switch_s: float = 5.0

    def __post_init__(self) -> None:
        if self.merge < 2 or self.speedup <= 1.0 or self.switch_s < 0:
            raise ValueError(f"tail parallelism needs merge >= 2, speedup > 1 and switch_s >= 0, "
                             f"got {self}")

    def merged_cost(self, cost: EngineCostModel) -> EngineCostModel:
        return EngineCostModel(cost.base_s / self.speedup, cost.per_seq_s / self.speedup,
                               cost.slots, cost.prefill_s_per_token / self.speedup)

    def should_switch(self, loads: Sequence[TrajectoryLoad], instances: int,
                      cost: EngineCostModel) -> bool:
        merged = instances // self.merge
        if not loads or merged < 1 or len(loads) > merged * cost.slots:
            return False
        batch = -(-len(loads) // merged)  # per merged instance, spread evenly
        fast = self.merged_cost(cost)
        now = max(t.remaining_tokens * cost.iteration_s(min(len(loads), cost.slots))
                  + t.remaining_tool_s for t in loads)
        then = self.switch_s + max(t.remaining_tokens * fast.iteration_s(batch)
                                   + t.remaining_tool_s for t in loads)
        return then < now
