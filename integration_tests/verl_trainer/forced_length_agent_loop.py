"""verl's own single-turn agent loop, giving each sample the PPO workload's forced response
length, for the run with rlweave off.

The forced lengths (``extra_info.rlweave_output_len``) are honoured by rlweave's
``rlweave_single_turn`` loop, which verl does not know while rlweave is off. This loop does the
same through verl's own extension point (``actor_rollout_ref.rollout.agent.agent_loop_config_path``,
``forced_length_agent_loop.yaml``), so that the run with rlweave off asks vLLM for what the run
with rlweave on asks: the same ``max_tokens`` with ``ignore_eos``.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop


class ForcedLengthSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        forced = (kwargs.get("extra_info") or {}).get("rlweave_output_len")
        if forced is not None:
            sampling_params = {**sampling_params, "max_tokens": int(forced), "ignore_eos": True}
        return await super().run(sampling_params, **kwargs)
