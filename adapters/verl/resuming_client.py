"""rlweave's one agent-loop client for verl's rollout replicas: it resubmits every request that
did not finish, so that the agent loop sees one output as if nothing had happened.

- **Aborted** (always): verl aborts requests in flight when it pauses its replicas (partial
  rollout: a weight push in async mode) and rlweave does when it migrates a generation tail
  (:mod:`.tail_migration`). The request comes back with the tokens it has; the client resubmits
  it at once, prompt plus those tokens, with the rest of its budget, and the replica (or
  another, as the request balancer decides) re-prefills and decodes on.
- **Its replica died** (with ``wait_s``, which resilience passes): its engine dead or its server
  actor gone. The client resubmits the request, with the tokens earlier parts returned, once the
  load balancer offers a live replica, so no finished sample is lost for a dead engine and none
  is generated twice (the agent loop writes a sample only when its request returns).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import ray
from verl.workers.rollout.llm_server import LLMServerClient

from rlweave.adapters import heartbeat

ABORTED = ("aborted", "abort")
RESUBMITTED = "requests_resubmitted"  # a heartbeat counter: requests resubmitted for a dead replica
DEAD_REPLICA_MARKS = ("EngineDeadError", "EngineCore", "ActorDiedError", "ActorUnavailableError", "engine core")


def replica_died(error: BaseException) -> bool:
    """Whether a request failed because its replica is gone (not because of the request)."""
    if isinstance(error, ray.exceptions.RayActorError):
        return True
    text = f"{type(error).__name__}: {error}"
    return any(mark in text for mark in DEAD_REPLICA_MARKS)


class ResumingLLMServerClient(LLMServerClient):
    """verl's client, resubmitting an aborted request (a migration, or a weight push's partial
    rollout) at once, with the tokens it has so far and the rest of its budget. verl's
    ``FullyAsyncLLMServerClient`` does the same but waits a second before each resubmission,
    which costs the tail more than a migration shortens it, and in async mode holds every sample
    a push cut off for a second. A request that reaches a paused replica is parked by the
    replica until it resumes, so resubmitting at once never spins. With ``wait_s`` a request
    whose replica died is resubmitted too, waiting up to ``wait_s`` for a live replica before
    it fails as it would without rlweave."""

    _wait_s: float | None = None  # no failover unless resilience asks for it

    def __init__(self, *args: Any, wait_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wait_s = wait_s
        self._dead: set[str] = set()
        self._server_of: dict[str, str] = {}

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
            output = await self._part(request_id, list(prompt_ids) + tokens, params, kwargs)
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

    async def _part(self, request_id: str, prompt_ids: list[int], params: dict[str, Any], kwargs: dict) -> Any:
        """One submission of the request; with failover, again on a live replica if its replica
        died under it (a heartbeat section of the worker's while it runs)."""
        if self._wait_s is None:
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=params, **kwargs)
        sender = heartbeat.current()
        try:
            while True:
                try:
                    with sender.activity("generate") if sender is not None else nullcontext():
                        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=params,
                                                      **kwargs)
                except Exception as error:
                    if not replica_died(error):
                        raise
                    self._mark_dead(request_id, error, sender)
        finally:
            self._server_of.pop(request_id, None)

    def _mark_dead(self, request_id: str, error: BaseException, sender: Any) -> None:
        server = self._server_of.get(request_id, "")
        if server not in self._dead:
            print(f"rlweave resilience: rollout server {server} is gone ({type(error).__name__}); "
                  "resubmitting its requests")
        self._dead.add(server)
        if sender is not None:
            sender.count(RESUBMITTED)

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        if self._wait_s is None:
            return await super()._acquire_server(request_id, **extra)
        deadline = time.monotonic() + self._wait_s
        while True:
            try:
                server_id, handle = await super()._acquire_server(request_id, **extra)
            except RuntimeError as error:  # no replica in the balancer: one is being replaced
                if "No available servers" not in str(error) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            if server_id not in self._dead:
                self._server_of[request_id] = server_id
                return server_id, handle
            self._release_server(server_id, request_id=request_id)
            if time.monotonic() > deadline:
                raise RuntimeError(f"rlweave resilience: no live rollout replica within {self._wait_s:.0f}s")
            await asyncio.sleep(0.2)
