"""Multi-turn trajectories on the simulator: an agent loop's turns, each a request whose
successor arrives a tool call after it finishes, on the engine its trajectory is placed on.

Placement is sticky (a trajectory's turns share an engine, as verl's agent loop keeps a
trajectory on its server for the prefix cache), and its turns queue by the trajectory's
priority (smaller first), which a policy may revise at each turn from what it has seen. This is
what Heddle's placement and priority, and verl's balancer, are compared on (issue 44).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rlweave.sim.batching import Request, Simulator
from rlweave.sim.engine import EngineModel


@dataclass(frozen=True)
class Trajectory:
    """One trajectory: ``turns`` output tokens per turn, ``tool_s`` seconds between a turn's
    end and the next turn's arrival, ``prompt_tokens`` prefilled per turn. ``gaps``, where
    known, gives each of those seconds apart (one fewer than turns) and overrides ``tool_s``:
    a trajectory's tool calls are heavy-tailed, and the one slow call decides its finish."""

    turns: tuple[int, ...]
    tool_s: float
    prompt_tokens: int = 0
    gaps: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.gaps and len(self.gaps) != len(self.turns) - 1:
            raise ValueError(f"a trajectory of {len(self.turns)} turns has {len(self.turns) - 1} tool gaps, "
                             f"not {len(self.gaps)}: give one per turn but the last, or none")

    def gap_after(self, turn: int) -> float:
        """Seconds between turn ``turn``'s end and the next turn's arrival."""
        return self.gaps[turn] if self.gaps else self.tool_s

    def tool_left(self, done: int) -> float:
        """Tool seconds still ahead once ``done`` turns have finished."""
        return sum(self.gaps[done:]) if self.gaps else self.tool_s * max(len(self.turns) - 1 - done, 0)


class _Sticky:
    """Placement: each request joins its trajectory's engine on arrival."""

    def __init__(self, engine_of: Sequence[int]) -> None:
        self.engine_of = engine_of

    def arrive(self, sim: Simulator, requests: list[Request], now: float) -> None:
        for r in requests:
            sim.enqueue(self.engine_of[r.group], [r], now)

    def refill(self, sim: Simulator, engine: int, now: float) -> None:
        """Nothing is held back: every turn was placed on arrival."""


class _ByPriority:
    """Queue order: the trajectory's current priority, then arrival."""

    def __init__(self, priority: list[float]) -> None:
        self.priority = priority

    def key(self, request: Request, left: float) -> tuple:
        return (self.priority[request.group], request.id)


# (trajectory index, turns done) -> priority; smaller runs first
Priority = Callable[[int, int], float]


def run_trajectories(trajectories: Sequence[Trajectory], engine: EngineModel, engine_of: Sequence[int],
                     engines: int, priority: Priority | None = None) -> np.ndarray:
    """Each trajectory's finish time when all start at 0, trajectory ``k`` on engine
    ``engine_of[k]`` of ``engines`` identical ones, turns ordered by ``priority`` (``None``:
    first come, first served)."""
    prio = [0.0] * len(trajectories)
    rank = priority or (lambda k, done: 0.0)
    sim = Simulator([engine] * engines, order=_ByPriority(prio), placement=_Sticky(engine_of))
    pending: dict[int, tuple[int, int]] = {}  # request id -> (trajectory, turn)
    finish = np.zeros(len(trajectories))
    ids = iter(range(1 << 62))

    def submit(k: int, turn: int, at: float) -> None:
        prio[k] = rank(k, turn)
        t = trajectories[k]
        rid = next(ids)
        pending[rid] = (k, turn)
        sim.submit([Request(rid, at, int(t.turns[turn]), t.prompt_tokens, group=k)])

    for k in range(len(trajectories)):
        submit(k, 0, 0.0)
    while pending:
        sim.run_until(sim.next_event_s())
        for rid in [r for r in pending if r in sim.finish_s]:
            k, turn = pending.pop(rid)
            done = sim.finish_s[rid]
            if turn + 1 < len(trajectories[k].turns):
                submit(k, turn + 1, done + trajectories[k].gap_after(turn))
            else:
                finish[k] = done
    return finish
