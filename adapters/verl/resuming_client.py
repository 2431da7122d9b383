"""An agent-loop client for verl's rollout replicas that resumes an aborted request at once.

verl aborts requests in flight when it pauses its replicas (partial rollout: a weight push in
async mode) and rlweave does when it migrates a generation tail (:mod:`.tail_migration`). The
request comes back with the tokens it has; the client resubmits it, prompt plus those tokens,
with the rest of its budget, and the replica (or another, as the request balancer decides)
re-prefills and decodes on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl.workers.rollout.llm_server import LLMServerClient

ABORTED = ("aborted", "abort")


class ResumingLLMServerClient(LLMServerClient):
    """verl's client, resubmitting a request that its replica aborted (a migration, or a weight
    push's partial rollout) at once, with the tokens it has so far and the rest of its budget,
    so that an abort is invisible to the agent loop. verl's ``FullyAsyncLLMServerClient`` does
    the same but waits a second before each resubmission, which costs the tail more than a
    migration shortens it, and in async mode holds every sample a push cut off for a second.
    A request that reaches a paused replica is parked by the replica until it resumes, so
    resubmitting at once never spins."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        params = dict(sampling_params)
        budget_key = next((k for k in ("max_tokens", "max_new_tokens") if k in params), None)
        if budget_key is None:  # the server's default budget is counted from the prompt: pin the response's
            budget_key, params["max_tokens"] = "max_tokens", int(self.config.actor_rollout_ref.rollout.response_length)
        budget = params[budget_key]
        tokens: list[int] = []
        log_probs: list[float] = []
        routed: list[Any] = []
        first_steps, resumed = None, 0
        while True:
            output = await super().generate(request_id, prompt_ids=list(prompt_ids) + tokens,
                                            sampling_params=params, **kwargs)
            tokens += list(output.token_ids)
            if output.log_probs is not None:
                log_probs += list(output.log_probs)
            if output.routed_experts is not None and len(output.token_ids):
                routed.append(output.routed_experts[-len(output.token_ids):])
            if first_steps is None:
                first_steps = output.extra_fields.get("min_global_steps")
            if output.stop_reason not in ABORTED:
                break
            resumed += 1
            params[budget_key] = budget - len(tokens)
            if params[budget_key] <= 0:
                output.stop_reason = "length"
                break
        if resumed:
            output.token_ids, output.log_probs = tokens, log_probs if output.log_probs is not None else None
            if routed:
                output.routed_experts = np.concatenate(routed)
            output.extra_fields["min_global_steps"] = first_steps
        output.extra_fields["rlweave_resumed"] = resumed
        return output
