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
    SettingRequirement,
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
    return TrajectoryOrchestrator(cost, OrchestratorSettings(c.replan_s, c.migrate_fraction),
                                  predictor)


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global orchestrator
    orchestrator = build_orchestrator(config)


# verl passes request priorities to vLLM natively and to SGLang through rlweave's
# verl_sglang_priority patch; both schedule by them only under the priority policy. Only
# rlweave's agent loops report trajectories (turns, tool time, group, task) to the plugin.
VERL_REQUIREMENTS = (
    SettingRequirement("actor_rollout_ref.rollout.name", ("vllm", "sglang"), None,
                       "each turn gets an engine priority, which verl passes only to vLLM and, with "
                       "rlweave's patch, SGLang", SECTION),
    SettingRequirement("actor_rollout_ref.rollout.scheduling_policy", ("priority",), "fcfs",
                       "the engines ignore request priorities under FCFS; for SGLang rlweave then turns "
                       "on its priority scheduling, lower values first", SECTION),
    SettingRequirement("actor_rollout_ref.rollout.agent.default_agent_loop",
                       ("rlweave_tool_agent", "rlweave_single_turn"), "single_turn_agent",
                       "rlweave's agent loops (verl's tool and single-turn loops with rlweave's "
                       "reports around each turn) tell the plugin what it predicts from", SECTION),
)


@hookimpl
def rlweave_framework_requirements(framework: str) -> Sequence[SettingRequirement]:
    return VERL_REQUIREMENTS if framework == "verl" else ()


@hookimpl
def rlweave_request_priority(trajectory: TrajectoryInfo) -> int:
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
