"""Hook implementations of the agentic_rollout plugin (Heddle): one orchestrator per process.

Under verl the process that matters is the request balancer actor: rlweave's agent loops report
their trajectories to it and ask it for each turn's priority, and it places every turn, so one
orchestrator sees the whole rollout. Its learned history is what :func:`rlweave_rollout_state`
hands to the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.agentic_rollout.orchestrator import OrchestratorSettings, TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.plugins.agentic_rollout.predictor import SerialTimePredictor
from rlweave.types import (
    InstanceLoad,
    Need,
    PluginNeed,
    TrajectoryEvent,
    TrajectoryEventKind,
    TrajectoryInfo,
)

SECTION = "agentic_rollout"
orchestrator: TrajectoryOrchestrator | None = None


def _orchestrator() -> TrajectoryOrchestrator:
    if orchestrator is None:
        raise RuntimeError("the agentic_rollout plugin was registered without rlweave_configure")
    return orchestrator


def build_orchestrator(config: RlweaveConfig) -> TrajectoryOrchestrator:
    """The orchestrator the ``agentic_rollout`` section configures."""
    c = config.agentic_rollout
    cost = EngineCostModel(c.iteration_base_ms / 1e3, c.iteration_per_seq_ms / 1e3, c.slots,
                           c.prefill_us_per_token / 1e6)
    predictor = SerialTimePredictor(prior_tool_s=c.prior_tool_ms / 1e3, decay=c.history_decay,
                                    history=c.history)
    return TrajectoryOrchestrator(cost, OrchestratorSettings(c.replan_s, c.migrate_fraction, c.skill_z),
                                  predictor)


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global orchestrator
    orchestrator = build_orchestrator(config)


# Engines that serve by the turn's priority, and a rollout that reports each turn (tool time,
# group, task); each framework's adapter says which of its settings give them.
NEEDS = (
    PluginNeed(Need.ENGINE_PRIORITIES, SECTION, "each turn is served by its trajectory's predicted remaining time"),
    PluginNeed(Need.TURN_REPORTS, SECTION, "the predictor learns from each turn's report"),
)


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


@hookimpl
def rlweave_request_priority(trajectory: TrajectoryInfo) -> int | None:
    return _orchestrator().priority(trajectory)


@hookimpl
def rlweave_choose_instance(trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad]) -> str | None:
    return _orchestrator().choose_instance(trajectory, instances, time.time())


@hookimpl
def rlweave_trajectory_event(event: TrajectoryEvent) -> None:
    o, t = _orchestrator(), event.trajectory
    match event.kind:
        case TrajectoryEventKind.START:
            o.started(t)
        case TrajectoryEventKind.TURN_START:
            o.turn_started(t, event.time_s)
        case TrajectoryEventKind.TURN_END:
            o.turn_ended(t, event.time_s)
        case TrajectoryEventKind.FINISH:
            o.finished(t)


@hookimpl
def rlweave_rollout_state() -> dict[str, Any]:
    return {SECTION: _orchestrator().state_dict()}


@hookimpl
def rlweave_restore_rollout_state(state: dict[str, Any]) -> None:
    if SECTION in state:
        _orchestrator().load_state_dict(state[SECTION])
