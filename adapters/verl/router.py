"""rlweave's verl request load balancer: verl's sticky least-in-flight balancer, with placement
decided by ``rlweave_choose_instance`` (Heddle's trajectory-aware placement and migration), and
the one process where rlweave's rollout plugins see the whole rollout.

verl routes every turn of a trajectory through ``acquire_server(request_id)`` from one balancer
actor shared by all agent-loop workers. rlweave's agent loops (:mod:`.agent_loop`) send their
reports (a trajectory's start, each turn's start and end, its finish) and each turn's priority
question to this actor through its handle, under the same request id, so that the hooks here see
what the agent loops know (group, task, turns, tokens, tool time) together with what only the
balancer knows (the instance of every turn, the in-flight load). With no plugin answering,
routing is exactly verl's.

Selected by the ``verl_router_default`` patch when a plugin implements
``rlweave_choose_instance`` and ``rollout.router_config_path`` is unset, or explicitly through
verl's own ``rollout.router_config_path`` YAML with ``router_class:
rlweave.adapters.verl.router.RlweaveLoadBalancer``.

What the plugins learned here outlives a restart with verl's checkpoint: the
``verl_rollout_state`` patch calls :func:`save_rollout_state` after verl saves step N and
:func:`restore_rollout_state` after verl loads one (``global_step_N/rlweave_rollout_state.json``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from rlweave.host import get_host
from rlweave.types import InstanceLoad, TrajectoryEvent, TrajectoryInfo

STATE_FILE = "rlweave_rollout_state.json"


class RlweaveLoadBalancer(GlobalRequestLoadBalancer):
    def __init__(self, servers: dict[str, Any], config: dict | None = None,
                 max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
                 full_determinism: bool = False) -> None:
        # ``config`` is the router YAML when verl builds this from ``router_config_path``.
        super().__init__(servers, max_cache_size=max_cache_size, full_determinism=False)
        self._host = get_host()

    def acquire_server(self, request_id: str, **_: Any) -> tuple[str, Any]:
        """verl's acquire, placed by the plugin. Like verl's, it takes the request id alone: the
        context a turn sends (what migrating it would re-prefill) came with the turn's report,
        which rlweave's agent loop sends just before; shipping the whole context again with
        every acquire cost each turn a serialisation on both sides."""
        previous = self._request_id_to_server.get(request_id)
        info = TrajectoryInfo(request_id, "", 0, 0, instance_id=previous)
        instances = [InstanceLoad(sid, n, 0) for sid, n in self._inflight_requests.items()]
        server_id = self._host.hook.rlweave_choose_instance(trajectory=info, instances=instances)
        if server_id is None or server_id not in self._inflight_requests:
            return super().acquire_server(request_id)
        self._request_id_to_server[request_id] = server_id
        self._inflight_requests[server_id] += 1
        return server_id, self._servers[server_id]

    # -- rlweave's agent loops report here (one process for all agent-loop workers) -------------
    def rlweave_trajectory_event(self, event: TrajectoryEvent) -> None:
        self._host.hook.rlweave_trajectory_event(event=event)

    def rlweave_turn_started(self, event: TrajectoryEvent, caller_priority: int = 0) -> int:
        """The turn's ``TURN_START`` report, answered with the priority a plugin decides, or the
        caller's: the answer reaches the engine as an argument (see :mod:`.agent_loop`)."""
        self._host.hook.rlweave_trajectory_event(event=event)
        decided = self._host.hook.rlweave_request_priority(trajectory=event.trajectory)
        return caller_priority if decided is None else decided

    # -- what the rollout plugins learned, kept with verl's checkpoint -------------------------
    def rlweave_rollout_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for answer in self._host.hook.rlweave_rollout_state():
            state.update(answer or {})
        return state

    def rlweave_restore_rollout_state(self, state: dict[str, Any]) -> None:
        self._host.hook.rlweave_restore_rollout_state(state=state)


def _rlweave_balancers(trainer: Any) -> list[Any]:
    """The rlweave balancer handles of a verl v1 trainer's server managers."""
    handles = []
    for name in ("llm_server_manager", "standalone_server_manager"):
        handle = getattr(getattr(trainer, name, None), "global_load_balancer", None)
        if hasattr(handle, "rlweave_rollout_state"):
            handles.append(handle)
    return handles


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def save_rollout_state(trainer: Any) -> None:
    """After verl saved ``global_step_N``: write the rollout plugins' state beside it."""
    import ray

    balancers = _rlweave_balancers(trainer)
    if not balancers:
        return
    state: dict[str, Any] = {}
    for handle in balancers:
        state.update(ray.get(handle.rlweave_rollout_state.remote()))
    folder = os.path.join(_absolute(trainer.config.trainer.default_local_dir),
                          f"global_step_{trainer.global_steps}")
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(folder, STATE_FILE))


def restore_rollout_state(trainer: Any) -> None:
    """After verl loaded a checkpoint (``global_steps`` > 0): hand its saved rollout state, if
    any, back to the rollout plugins. verl resumed from ``resume_from_path`` or, in ``auto``
    mode, from ``default_local_dir/global_step_<global_steps>``."""
    import ray

    if not trainer.global_steps:
        return
    t = trainer.config.trainer
    if t.resume_mode == "resume_path":
        folder = _absolute(t.resume_from_path)
    else:
        folder = os.path.join(_absolute(t.default_local_dir), f"global_step_{trainer.global_steps}")
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        state = json.load(f)
    ray.get([h.rlweave_restore_rollout_state.remote(state) for h in _rlweave_balancers(trainer)])
