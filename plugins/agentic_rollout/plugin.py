"""Hook implementations of the agentic_rollout plugin (Heddle): one orchestrator per process.

The verl adapter calls these from its request load balancer actor, the one process that sees
every turn of every trajectory; the benchmark calls them from its client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.agentic_rollout.orchestrator import OrchestratorSettings, TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.types import (
    InstanceLoad,
    SettingRequirement,
    TrajectoryEvent,
    TrajectoryEventKind,
    TrajectoryInfo,
)

orchestrator: TrajectoryOrchestrator | None = None


def _orchestrator() -> TrajectoryOrchestrator:
    if orchestrator is None:
        raise RuntimeError("the agentic_rollout plugin was registered without rlweave_configure")
    return orchestrator


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global orchestrator
    c = config.agentic_rollout
    cost = EngineCostModel(c.iteration_base_ms / 1e3, c.iteration_per_seq_ms / 1e3, c.slots,
                           c.prefill_us_per_token / 1e6)
    orchestrator = TrajectoryOrchestrator(
        cost, OrchestratorSettings(c.queue_weight, c.replan_s, c.migrate_fraction))


# verl passes request priorities to vLLM natively and to SGLang through rlweave's
# verl_sglang_priority patch; both schedule by them only under the priority policy.
VERL_REQUIREMENTS = (
    SettingRequirement("actor_rollout_ref.rollout.name", ("vllm", "sglang"), None,
                       "each turn gets an engine priority, which verl passes only to vLLM and, with "
                       "rlweave's patch, SGLang", "agentic_rollout"),
    SettingRequirement("actor_rollout_ref.rollout.scheduling_policy", ("priority",), "fcfs",
                       "the engines ignore request priorities under FCFS; for SGLang rlweave then turns "
                       "on its priority scheduling, lower values first", "agentic_rollout"),
)


@hookimpl
def rlweave_framework_requirements(framework: str) -> Sequence[SettingRequirement]:
    return VERL_REQUIREMENTS if framework == "verl" else ()


@hookimpl
def rlweave_request_priority(trajectory: TrajectoryInfo) -> int:
    return _orchestrator().priority(trajectory)


@hookimpl
def rlweave_choose_instance(trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad]) -> str:
    return _orchestrator().choose_instance(trajectory, instances, time.time())


@hookimpl
def rlweave_trajectory_event(event: TrajectoryEvent) -> None:
    o, t = _orchestrator(), event.trajectory
    match event.kind:
        case TrajectoryEventKind.START:
            o.started(t)
        case TrajectoryEventKind.TOOL_START:
            o.tool_started(t, event.time_s)
        case TrajectoryEventKind.TOOL_END:
            o.tool_ended(t, event.time_s)
        case TrajectoryEventKind.FINISH:
            o.finished(t)
