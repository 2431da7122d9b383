"""rlweave's verl agent loops: verl's own loops, with rlweave's trajectory hooks around each turn.

- ``rlweave_single_turn`` (verl's ``SingleTurnAgentLoop``) and
- ``rlweave_tool_agent`` (verl's multi-turn ``ToolAgentLoop``).

Select one with ``actor_rollout_ref.rollout.agent.default_agent_loop=<name>``. A dataset row
whose ``extra_info`` has ``rlweave_output_len`` gets exactly that many tokens in a single-turn
response (``max_tokens`` with ``ignore_eos``): benchmarks use it to replay an output-length
distribution with a random-weight model. A trajectory's
start, tool calls and finish become ``rlweave_trajectory_event`` calls in the agent-loop worker,
and before every turn a plugin's ``rlweave_request_priority`` becomes the engine priority, which
verl forwards to vLLM, and to SGLang with rlweave's ``verl_sglang_priority`` patch
(``rollout.scheduling_policy=priority``). The agent loop knows what verl's
request balancer cannot: the GRPO group (``uid``), the task (``data_source``) and the tokens
generated so far.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from rlweave.host import get_host
from rlweave.types import TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo


class _Trajectory:
    """One trajectory's progress as the agent loop sees it, reported to rlweave's hooks."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.host = get_host()
        group = str(kwargs.get("uid", ""))
        self.info = TrajectoryInfo(trajectory_id=f"{group}-{uuid4().hex[:8]}", group_id=group,
                                   turns_done=0, tokens_so_far=0,
                                   task=str(kwargs.get("data_source", "")))

    def event(self, kind: TrajectoryEventKind) -> None:
        self.host.hook.rlweave_trajectory_event(event=TrajectoryEvent(kind, self.info, time.time()))

    def priority(self, default: int) -> int:
        decided = self.host.hook.rlweave_request_priority(trajectory=self.info)
        return default if decided is None else decided

    def turn_done(self, generated: int) -> None:
        self.info = TrajectoryInfo(self.info.trajectory_id, self.info.group_id,
                                   self.info.turns_done + 1, self.info.tokens_so_far + generated,
                                   task=self.info.task, prompt_len=self.info.prompt_len)


class _PrioritizedClient:
    """verl's ``LLMServerClient`` seen through one trajectory: each ``generate`` gets the
    trajectory's current priority, and the gaps between calls are its tool calls."""

    def __init__(self, client: Any, trajectory: _Trajectory, default_priority: int) -> None:
        self._client, self._trajectory, self._default = client, trajectory, default_priority

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        t = self._trajectory
        if t.info.turns_done:
            t.event(TrajectoryEventKind.TOOL_END)
        kwargs.setdefault("priority", t.priority(self._default))
        output = await self._client.generate(*args, **kwargs)
        t.turn_done(len(output.token_ids))
        t.event(TrajectoryEventKind.TOOL_START)
        return output


@register("rlweave_single_turn")
class RlweaveSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        trajectory = _Trajectory(kwargs)
        trajectory.event(TrajectoryEventKind.START)
        forced = (kwargs.get("extra_info") or {}).get("rlweave_output_len")
        if forced is not None:
            sampling_params = {**sampling_params, "max_tokens": int(forced), "ignore_eos": True}
        output = await super().run(sampling_params, priority=trajectory.priority(int(priority)),
                                   **kwargs)
        trajectory.turn_done(len(output.response_ids))
        trajectory.event(TrajectoryEventKind.FINISH)
        return output


@register("rlweave_tool_agent")
class RlweaveToolAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        trajectory = _Trajectory(kwargs)
        self.server_manager = _PrioritizedClient(self.server_manager, trajectory, int(priority))
        trajectory.event(TrajectoryEventKind.START)
        try:
            return await super().run(sampling_params, priority=priority, **kwargs)
        finally:
            trajectory.event(TrajectoryEventKind.FINISH)
