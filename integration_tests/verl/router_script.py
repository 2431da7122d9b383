"""Build verl's request load balancer exactly as verl's LLMServerManager does
(``get_router_handle`` as a Ray actor) and route a few multi-turn trajectories through it.

Run as a script; prints which balancer verl built, where each turn went and the final status.
"""

from __future__ import annotations

import json

import ray
import verl  # noqa: F401  (loads rlweave's adapter and, when enabled, its patches)
from verl.workers.rollout.router import get_router_handle

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
balancer = get_router_handle({"server-0": "handle-0", "server-1": "handle-1"})
acquire_fields = ray.get(balancer.require_acquire_fields.remote())
release_fields = ray.get(balancer.require_release_fields.remote())
turns: dict[str, list[str]] = {}
for turn in range(3):
    held = []
    for k in range(6):
        rid = f"traj-{k}"
        extra = {"prompt_ids": list(range(16 + 24 * turn))} if "prompt_ids" in acquire_fields else {}
        server_id, handle = ray.get(balancer.acquire_server.remote(request_id=rid, **extra))
        assert handle == server_id.replace("server", "handle")
        turns.setdefault(rid, []).append(server_id)
        held.append((server_id, rid))
    for server_id, rid in held:
        extra = {"request_id": rid} if "request_id" in release_fields else {}
        ray.get(balancer.release_server.remote(server_id=server_id, **extra))
built = ray.get(balancer.__ray_call__.remote(lambda b: f"{type(b).__module__}.{type(b).__name__}"))
cleared = ray.get(balancer.clear_sticky_cache.remote())
status = ray.get(balancer.get_status.remote())


def flush_trace(_balancer: object) -> None:
    from rlweave.tracing import tracer

    tracer.flush()


ray.get(balancer.__ray_call__.remote(flush_trace))  # the actor's trace, before Ray stops it
print(json.dumps({"balancer": built, "acquire_fields": acquire_fields, "turns": turns, "status": status,
                  "cleared": cleared["cleared_entries"]}))
ray.shutdown()
