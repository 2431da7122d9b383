"""rlweave's verl request load balancer: verl's sticky least-in-flight balancer, with placement
decided by ``rlweave_choose_instance`` (Heddle's trajectory-aware placement and migration).

verl routes every turn of a trajectory through ``acquire_server(request_id)`` with the
trajectory's request id, from one balancer actor shared by all agent-loop workers: the one place
that sees every turn. This subclass turns those calls into the trajectory view plugins decide on:
the first acquire starts a trajectory, a release ends a turn (the trajectory enters a tool call
or is done), the next acquire ends the tool call. verl clears the sticky cache when a rollout
phase ends; the trajectories still known then are reported finished, which is when a predictor
learns from them. With no plugin answering, routing is exactly verl's.

Selected by the ``verl_router_default`` patch when a plugin implements
``rlweave_choose_instance`` and ``rollout.router_config_path`` is unset, or explicitly through
verl's own ``rollout.router_config_path`` YAML with ``router_class:
rlweave.adapters.verl.router.RlweaveLoadBalancer``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from rlweave.host import get_host
from rlweave.types import InstanceLoad, TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo


@dataclass
class _Seen:
    info: TrajectoryInfo
    in_turn: bool = False


class RlweaveLoadBalancer(GlobalRequestLoadBalancer):
    def __init__(self, servers: dict[str, Any], config: dict | None = None,
                 max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
                 full_determinism: bool = False) -> None:
        # ``config`` is the router YAML when verl builds this from ``router_config_path``.
        super().__init__(servers, max_cache_size=max_cache_size, full_determinism=False)
        self._host = get_host()
        self._trajectories: dict[str, _Seen] = {}

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]  # the context length tells how far a trajectory has come

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(self, request_id: str, prompt_ids: list[int] | None = None, **_: Any
                       ) -> tuple[str, Any]:
        now = time.time()
        seen = self._trajectories.get(request_id)
        context = len(prompt_ids or ())
        if seen is None:
            info = TrajectoryInfo(request_id, "", 0, 0, prompt_len=context)
            seen = self._trajectories[request_id] = _Seen(info)
            self._event(TrajectoryEventKind.START, info, now)
        else:
            # Context growth = generated tokens plus tool outputs: the best a router can see.
            seen.info = replace(seen.info, tokens_so_far=max(context - seen.info.prompt_len, 0))
            self._event(TrajectoryEventKind.TOOL_END, seen.info, now)
        instances = [InstanceLoad(sid, n, 0) for sid, n in self._inflight_requests.items()]
        server_id = self._host.hook.rlweave_choose_instance(trajectory=seen.info, instances=instances)
        if server_id is None or server_id not in self._inflight_requests:
            server_id, handle = super().acquire_server(request_id)
        else:
            self._request_id_to_server[request_id] = server_id
            self._inflight_requests[server_id] += 1
            handle = self._servers[server_id]
        seen.info = replace(seen.info, instance_id=server_id)
        seen.in_turn = True
        return server_id, handle

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        super().release_server(server_id, request_id)
        seen = self._trajectories.get(request_id) if request_id is not None else None
        if seen is not None and seen.in_turn:
            seen.in_turn = False
            seen.info = replace(seen.info, turns_done=seen.info.turns_done + 1)
            self._event(TrajectoryEventKind.TOOL_START, seen.info, time.time())

    def clear_sticky_cache(self) -> dict:
        for seen in self._trajectories.values():
            self._event(TrajectoryEventKind.FINISH, seen.info, time.time())
        self._trajectories.clear()
        return super().clear_sticky_cache()

    def _event(self, kind: TrajectoryEventKind, info: TrajectoryInfo, now: float) -> None:
        self._host.hook.rlweave_trajectory_event(event=TrajectoryEvent(kind, info, now))
