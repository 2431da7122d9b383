"""rlweave's verl agent loops, around verl's real LLM client interface: every turn's generate
call carries the plugin's priority, and the trajectory's turns and tool calls reach the hooks.
(The model server is a stand-in: serving needs vLLM, which the verl_trainer group runs.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from rlweave.config import Setting
from rlweave.hookspecs import hookimpl
from rlweave.host import activate, reset
from rlweave.types import TrajectoryEvent, TrajectoryInfo


class Recorder:
    """A plugin that answers priorities (turn number x 10) and records trajectory events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []

    @hookimpl(tryfirst=True)
    def rlweave_request_priority(self, trajectory: TrajectoryInfo) -> int:
        return 10 * trajectory.turns_done + 1

    @hookimpl
    def rlweave_trajectory_event(self, event: TrajectoryEvent) -> None:
        t = event.trajectory
        self.events.append((event.kind.value, t.turns_done, t.tokens_so_far))


class StandInClient:
    """verl's LLMServerClient surface the agent loops use: ``generate(...) -> TokenOutput``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.config = SimpleNamespace(name="stand-in")

    async def generate(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return SimpleNamespace(token_ids=[1] * (3 + len(self.calls)))


@pytest.fixture
def recorder():
    import verl  # noqa: F401  (first: loading verl activates rlweave from the environment)

    reset()
    host = activate([Setting("agentic_rollout.enable", True, "test")], export_env=False)
    plugin = Recorder()
    host.pm.register(plugin)
    yield plugin
    reset()


def test_each_turn_gets_the_plugins_priority_and_tool_calls_are_reported(recorder):
    from rlweave.adapters.verl.agent_loop import _PrioritizedClient, _Trajectory
    from rlweave.types import TrajectoryEventKind

    trajectory = _Trajectory({"uid": "g1", "data_source": "math"})
    assert (trajectory.info.group_id, trajectory.info.task) == ("g1", "math")
    inner = StandInClient()
    client = _PrioritizedClient(inner, trajectory, default_priority=7)
    trajectory.event(TrajectoryEventKind.START)

    async def three_turns() -> None:
        for _ in range(3):
            await client.generate(request_id="r", prompt_ids=[1, 2], sampling_params={})

    asyncio.run(three_turns())
    trajectory.event(TrajectoryEventKind.FINISH)
    assert [c["priority"] for c in inner.calls] == [1, 11, 21]
    assert client.config.name == "stand-in"  # everything else is verl's client
    assert recorder.events == [
        ("start", 0, 0),
        ("tool_start", 1, 4), ("tool_end", 1, 4),
        ("tool_start", 2, 9), ("tool_end", 2, 9),
        ("tool_start", 3, 15), ("finish", 3, 15),
    ]


def test_an_explicit_priority_from_the_caller_is_kept(recorder):
    from rlweave.adapters.verl.agent_loop import _PrioritizedClient, _Trajectory

    inner = StandInClient()
    client = _PrioritizedClient(inner, _Trajectory({}), default_priority=0)
    asyncio.run(client.generate(request_id="r", prompt_ids=[1], sampling_params={}, priority=-5))
    assert inner.calls[0]["priority"] == -5
