"""verl's vLLM rollout replica whose server reports its requests in flight (resilience).

The server's heartbeat section is ``generate`` while at least one request is in flight on it,
so that the monitor knows a replica is mid-generation (the chaos tool fires a rollout fault
``@N.generate`` then) and the beat goes out at once when the first request arrives. Registered
as verl's ``vllm`` replica (``RolloutReplicaRegistry``, verl's own door) while resilience is on.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from rlweave.adapters import heartbeat


class ResilientvLLMHttpServer(vLLMHttpServer):
    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        sender = heartbeat.current()
        with sender.activity("generate") if sender is not None else nullcontext():
            return await super().generate(*args, **kwargs)


class ResilientvLLMReplica(vLLMReplica):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(ResilientvLLMHttpServer)
