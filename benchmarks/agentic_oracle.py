"""The oracle of ``rlweave bench agentic``: rlweave's orchestrator told each trajectory's true
remaining work instead of predicting it (a benchmark construct, never rlweave's result), and the
informed orchestrator, told what a perfect model of the workload knows but not its draws: the
ceiling of prediction, between the two.

It takes the same decisions as the shipped plugin (priority = remaining serial time, presorted
placement, migration) from the workload's truth, so the gap between it and rlweave is what
prediction costs. The simulator drives it directly; on the real engines it replaces the plugin's
orchestrator inside its own request balancer actor (:class:`OracleLoadBalancer`), the one
process where the oracle mode's decisions are taken.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlweave.benchmarks.agentic_workload import Trajectory, TrajectoryParameters
from rlweave.plugins.agentic_rollout.orchestrator import OrchestratorSettings, TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel, TrajectoryLoad
from rlweave.types import TrajectoryInfo


def true_remaining(t: Trajectory, turns_done: int) -> tuple[int, float]:
    """Decode tokens and tool seconds a trajectory still has before its turn ``turns_done``."""
    return sum(t.turn_tokens[turns_done:]), sum(t.tool_s[turns_done:])


class OracleOrchestrator(TrajectoryOrchestrator):
    """``truth`` maps the ids the orchestrator is told (trace ids, or verl's request ids) to the
    trajectories they are."""

    def __init__(self, cost: EngineCostModel, truth: Mapping[str, Trajectory],
                 settings: OrchestratorSettings | None = None) -> None:
        # The truth needs no skill shown: it always decides.
        super().__init__(cost, replace(settings or OrchestratorSettings(), skill_z=None))
        self.truth = dict(truth)

    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        t = self.truth[trajectory.trajectory_id]
        tokens, tool_s = true_remaining(t, trajectory.turns_done)
        return TrajectoryLoad(trajectory.trajectory_id, tokens, tool_s)


def _shallow_mass(p: TrajectoryParameters) -> dict[int, float]:
    """The generator's law of a sample's total turns when it is not deep: memoryless
    (geometric) or a rounded log-normal, clipped to [1, 32] and to the shape's shallow cap."""
    s, cap = p.shape, min(p.shape.max_shallow_turns, 32)
    if s.stop_chance:
        stop = min(s.stop_chance / p.difficulty, 1.0)
        mass = {k: (1 - stop) ** (k - 1) * stop for k in range(1, cap)}
        return {**mass, cap: (1 - stop) ** (cap - 1)}
    mu, sigma = math.log(s.median_turns * p.difficulty), s.turns_sigma
    cdf = lambda x: 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))  # noqa: E731
    return {k: (1.0 if k == cap else cdf(k + 0.5)) - (0.0 if k == 1 else cdf(k - 0.5))
            for k in range(1, cap + 1)}


def turn_mass(p: TrajectoryParameters) -> dict[int, float]:
    """The law of a sample's total turns before any draw: its prompt's chance of a deep sample
    (uniform over the deep range) mixed with the shallow law."""
    mass = {k: (1.0 - p.deep_chance) * m for k, m in _shallow_mass(p).items()} \
        if p.deep_chance < 1.0 else {}
    lo, hi = p.shape.deep_turns
    for k in range(lo, hi + 1):
        mass[k] = mass.get(k, 0.0) + p.deep_chance / (hi - lo + 1)
    return mass


def expected_remaining_turns(p: TrajectoryParameters, done: int) -> float:
    """E[total turns - done | total > done] under the generator's turn law (:func:`turn_mass`);
    at least one turn. Surviving past the shallow totals moves the weight onto deep."""
    alive = {k: m for k, m in turn_mass(p).items() if k > done and m > 0}
    weight = sum(alive.values())
    if weight <= 0:
        return 1.0
    return max(sum(k * m for k, m in alive.items()) / weight - done, 1.0)


class InformedOrchestrator(TrajectoryOrchestrator):
    """rlweave's orchestrator told each trajectory's generative parameters (its prompt's
    difficulty, its verbosity, its prompt's tool speed, its sandbox's speed distribution, its
    chance of being deep) but none of its draws: turns are expected given the turns survived,
    and the sandbox's speed is inferred from the tool calls made so far as a Bayesian knowing
    the prior would. The ceiling of prediction on a synthetic shape (an index policy on the true
    law's expected remaining time, not a proven optimum); a benchmark construct, simulated only."""

    def __init__(self, cost: EngineCostModel, truth: Mapping[str, Trajectory],
                 parameters: Mapping[str, TrajectoryParameters]) -> None:
        super().__init__(cost, OrchestratorSettings(skill_z=None))
        self.truth, self.parameters = dict(truth), dict(parameters)

    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        t, p = self.truth[trajectory.trajectory_id], self.parameters[trajectory.trajectory_id]
        s, done = p.shape, trajectory.turns_done
        turns = expected_remaining_turns(p, done)
        tokens = s.median_tokens * p.verbosity * math.exp(s.tokens_sigma ** 2 / 2)
        seen = [math.log(x / s.tool_median_s) for x in t.tool_s[:done]]
        spread, noise = s.trajectory_tool_sigma ** 2, s.tool_sigma ** 2
        post_var = 1.0 / (len(seen) / noise + 1.0 / spread) if spread else 0.0
        post_mean = post_var * sum(seen) / noise if spread else 0.0
        tool = s.tool_median_s * math.exp(post_mean + post_var / 2 + noise / 2)
        return TrajectoryLoad(trajectory.trajectory_id, turns * tokens, max(turns - 1.0, 0.0) * tool)


def oracle_for(cost: EngineCostModel, trajectories: Sequence[Trajectory]) -> OracleOrchestrator:
    return OracleOrchestrator(cost, {t.id: t for t in trajectories})


def _oracle_balancer_class() -> type:
    from rlweave.adapters.verl.router import RlweaveLoadBalancer

    class OracleLoadBalancer(RlweaveLoadBalancer):
        """rlweave's balancer whose process decides with the oracle: the agentic_rollout
        plugin's orchestrator here (configured like rlweave's, from the environment) is swapped
        for an :class:`OracleOrchestrator` with the same cost model and settings."""

        def __init__(self, servers: dict[str, Any], truth: dict[str, Trajectory]) -> None:
            super().__init__(servers)
            from rlweave.plugins.agentic_rollout import plugin

            shipped = plugin.orchestrator
            if shipped is None:
                raise RuntimeError("the oracle balancer needs the agentic_rollout plugin enabled "
                                   "in its process (RLWEAVE__AGENTIC_ROLLOUT__ENABLE=true)")
            plugin.orchestrator = OracleOrchestrator(shipped.cost, truth, shipped.settings)

    return OracleLoadBalancer
