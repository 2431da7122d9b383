"""The simulator's swappable policies: which waiting request runs first (queue order), whether
a running request gives its slot back to a better waiting one (preemption), and which engine a
request joins and when (placement). Each is a small object, as vLLM's scheduler swaps its
request queue rather than branching on a policy name. The prefill rule (what a request
prefills when it starts) is one too: an agent loop's prefix cache keeps a trajectory's context
on its engine between turns."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rlweave.sim.batching import Request, Simulator


class QueueOrder(Protocol):
    """Orders an engine's waiting queue: the smallest key runs first."""

    def key(self, request: Request, left: int) -> tuple:
        """The request's place, given its output tokens still to make."""
        ...


class ArrivalOrder:
    """First come, first served (vLLM's default): by request id, which is arrival order."""

    def key(self, request: Request, left: int) -> tuple:
        return (request.id,)


class ShortestRemaining:
    """Fewest output tokens left first, with true lengths: the oracle no real scheduler has."""

    def key(self, request: Request, left: int) -> tuple:
        return (left, request.id)


class Preemption(Protocol):
    """Decides whether waiting requests may displace running ones at each iteration boundary."""

    preempts: bool  # True: running requests compete with waiting ones for the slots
    recompute: bool  # True: a resumed request prefills its prompt and generated tokens again


@dataclass(frozen=True)
class KeepRunning:
    """A request keeps its slot until it ends (vLLM without KV pressure)."""

    preempts: bool = False
    recompute: bool = False


@dataclass(frozen=True)
class ShortestRemainingPreempts:
    """Every iteration runs the best ``slots`` requests by the queue order (a waiting request
    takes a running one's slot only if it ranks strictly above it); the others wait with their
    KV kept (``recompute`` False: at no cost) or dropped (re-prefilled on resume). Named for its
    use: with :class:`ShortestRemaining` it is the SRPT oracle."""

    preempts: bool = True
    recompute: bool = False


class Prefill(Protocol):
    """What a request prefills when it starts on an engine (and it has no KV there)."""

    def tokens(self, sim: Simulator, request: int, engine: int, displaced: bool) -> float:
        """Tokens ``request`` prefills on ``engine``; ``displaced``: it took a running
        request's slot (a preemption) rather than a free one."""
        ...


class PromptAndMade:
    """Its prompt and every token it has made (a resumed request recomputes them)."""

    def tokens(self, sim: Simulator, request: int, engine: int, displaced: bool) -> float:
        r = sim.requests[request]
        return r.prompt_tokens + r.output_tokens - sim.left[request]


class Placement(Protocol):
    """Puts arriving requests on engines."""

    def arrive(self, sim: Simulator, requests: list[Request], now: float) -> None:
        """``requests`` arrive together at ``now``: queue each on an engine, now or later."""
        ...

    def refill(self, sim: Simulator, engine: int, now: float) -> None:
        """``engine`` reached an iteration boundary with its finished requests gone."""
        ...


class RoundRobin:
    """Each request joins an engine's waiting queue on arrival, the engines in turn (verl's
    balancer with equal loads; one engine: all of them)."""

    def __init__(self) -> None:
        self._next = 0

    def arrive(self, sim: Simulator, requests: list[Request], now: float) -> None:
        for r in requests:
            sim.enqueue(self._next % sim.engine_count, [r], now)
            self._next += 1

    def refill(self, sim: Simulator, engine: int, now: float) -> None:
        """Nothing is held back: every request was placed on arrival."""


class PullGroups:
    """Requests wait in one cluster queue by group (lowest group first); an engine claims a
    whole group while its running and waiting requests are fewer than its slots. On an arrival
    the engines claim in turn, one group a round (StreamRL's engines pulling from one queue)."""

    def __init__(self) -> None:
        self._queue: list[int] = []
        self._members: dict[int, list[Request]] = {}

    def arrive(self, sim: Simulator, requests: list[Request], now: float) -> None:
        for r in requests:
            if r.group not in self._members:
                heapq.heappush(self._queue, r.group)
            self._members.setdefault(r.group, []).append(r)
        while self._queue and any(sim.has_room(e) for e in range(sim.engine_count)):
            for e in range(sim.engine_count):
                if self._queue and sim.has_room(e):
                    self._claim(sim, e, now)

    def refill(self, sim: Simulator, engine: int, now: float) -> None:
        while self._queue and sim.has_room(engine):
            self._claim(sim, engine, now)

    def _claim(self, sim: Simulator, engine: int, now: float) -> None:
        sim.enqueue(engine, self._members.pop(heapq.heappop(self._queue)), now)
