"""``rlweave_single_turn``: verl's single-turn agent loop with rlweave's trajectory hooks.

Select it with ``actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_single_turn``. A
trajectory's start and finish become ``rlweave_trajectory_event`` calls, and a plugin's
``rlweave_request_priority`` becomes the engine priority verl forwards to vLLM.
"""

from __future__ import annotations

import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from rlweave.host import get_host
from rlweave.types import TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo


@register("rlweave_single_turn")
class RlweaveSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        host = get_host()
        uid = str(kwargs.get("uid", id(kwargs)))
        info = TrajectoryInfo(trajectory_id=f"{uid}-{id(kwargs):x}", group_id=uid, turns_done=0,
                              tokens_so_far=0)
        host.hook.rlweave_trajectory_event(
            event=TrajectoryEvent(TrajectoryEventKind.START, info, time.time()))
        decided = host.hook.rlweave_request_priority(trajectory=info)
        output = await super().run(sampling_params, priority=priority if decided is None else decided,
                                   **kwargs)
        done = TrajectoryInfo(info.trajectory_id, uid, turns_done=1,
                              tokens_so_far=len(output.prompt_ids) + len(output.response_ids))
        host.hook.rlweave_trajectory_event(
            event=TrajectoryEvent(TrajectoryEventKind.FINISH, done, time.time()))
        return output
