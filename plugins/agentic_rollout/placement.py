"""Trajectory-aware placement: presorted partition of trajectories over engine instances.

Sort the active trajectories by predicted remaining time and cut the sorted list into one
contiguous run per instance, minimising the largest instance cost. Sorting is what makes
contiguous runs enough: the long trajectories end up together on an instance with few
neighbours (small batches, no queueing), the short ones packed densely elsewhere.

The instance cost is an interference model calibrated on the engine: one decode iteration takes
``iteration_s(B) = base_s + per_seq_s * B`` for a batch of ``B`` (at most ``slots``); an
instance holding trajectories ``S`` finishes no sooner than its longest member running in a
batch of ``min(|S|, slots)``, and no sooner than its total tokens at full-batch throughput.
Because that cost only grows when a run is extended, the optimal cut is found exactly by a
binary search on the answer with a greedy feasibility check (O(N log N) instead of the
O(K N^2) dynamic program).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EngineCostModel:
    """Per-iteration time of one engine instance, measured on the running engine."""

    base_s: float
    per_seq_s: float
    slots: int
    prefill_s_per_token: float = 0.0

    def iteration_s(self, batch: int) -> float:
        return self.base_s + self.per_seq_s * min(max(batch, 1), self.slots)

    @classmethod
    def fit(cls, batch_sizes: Sequence[int], iteration_s: Sequence[float], slots: int,
            prefill_s_per_token: float = 0.0) -> EngineCostModel:
        """Least-squares line through measured (batch size, iteration time) points."""
        b = np.asarray(batch_sizes, dtype=float)
        t = np.asarray(iteration_s, dtype=float)
        if len(set(b)) < 2:
            return cls(float(t.mean()), 0.0, slots, prefill_s_per_token)
        per_seq, base = np.polyfit(b, t, 1)
        return cls(max(float(base), 0.0), max(float(per_seq), 0.0), slots, prefill_s_per_token)


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
        step = self.model.iteration_s(n)
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


def presorted_partition(loads: Sequence[TrajectoryLoad], instances: int,
                        model: EngineCostModel) -> list[list[TrajectoryLoad]]:
    """Split ``loads`` (any order) into ``instances`` runs of the longest-first order, minimising
    the largest :func:`instance_cost`. Runs may be empty when there are few trajectories."""
    if instances < 1:
        raise ValueError(f"placement needs at least one instance, got {instances}")
    order = sorted(loads, key=lambda t: -(t.remaining_tokens + t.remaining_tool_s))

    def cut(limit: float) -> list[list[TrajectoryLoad]] | None:
        runs: list[list[TrajectoryLoad]] = [[]]
        run = _RunCost(model)
        for t in order:
            if runs[-1] and run.cost_with(t) > limit:
                runs.append([])
                run = _RunCost(model)
                if len(runs) > instances:
                    return None
            runs[-1].append(t)
            run.add(t)
        return runs + [[] for _ in range(instances - len(runs))]

    # Candidate answers: the cost of each single trajectory bounds the optimum from below,
    # the cost of everything on one instance from above; bisect between them.
    lo = max((instance_cost([t], model) for t in order), default=0.0)
    hi = instance_cost(order, model)
    best = cut(hi)
    assert best is not None
    for _ in range(40):
        if hi - lo <= 1e-2 * max(hi, 1e-9):  # 1% of the makespan is below the model's error
            break
        mid = (lo + hi) / 2
        runs = cut(mid)
        if runs is None:
            lo = mid
        else:
            best, hi = runs, mid
    return best


def assign_runs(runs: Sequence[Sequence[TrajectoryLoad]], instance_ids: Sequence[str],
                current: dict[str, str]) -> dict[str, str]:
    """Map each run onto an instance, keeping as many trajectories where they are as possible
    (each kept one is a migration saved); returns trajectory id -> instance id."""
    free = list(instance_ids)
    plan: dict[str, str] = {}
    # Largest overlap first: greedy matching, exact enough for a handful of instances per run.
    scored = sorted(
        ((sum(current.get(t.trajectory_id) == iid for t in run), r, iid)
         for r, run in enumerate(runs) for iid in instance_ids),
        reverse=True,
    )
    placed: set[int] = set()
    for _, r, iid in scored:
        if r in placed or iid not in free:
            continue
        placed.add(r)
        free.remove(iid)
        for t in runs[r]:
            plan[t.trajectory_id] = iid
    return plan
