"""The oracle of ``rlweave bench agentic``: rlweave's orchestrator told each trajectory's true
remaining work instead of predicting it (a benchmark construct, never rlweave's result).

It takes the same decisions as the shipped plugin (priority = remaining serial time, presorted
placement, migration) from the workload's truth, so the gap between it and rlweave is what
prediction costs. The simulator drives it directly; on the real engines it replaces the plugin's
orchestrator inside its own request balancer actor (:class:`OracleLoadBalancer`), the one
process where the oracle mode's decisions are taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlweave.benchmarks.agentic_workload import Trajectory
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
        super().__init__(cost, settings or OrchestratorSettings())
        self.truth = dict(truth)

    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        t = self.truth[trajectory.trajectory_id]
        tokens, tool_s = true_remaining(t, trajectory.turns_done)
        return TrajectoryLoad(trajectory.trajectory_id, tokens, tool_s)


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
