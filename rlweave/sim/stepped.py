"""The simulator iteration by iteration, for models whose iterations cost what something outside
the engines makes them cost, and which move requests between engines mid-run.

RLHFuse's migration model needs three things the jumping :class:`Simulator` does not give: an
engine on the trainer's devices slows by the inference queued beside it, which changes every
iteration (so every iteration is its own event, its wall time asked of a listener); finishes
feed that queue (the listener hears each one); and the unfinished requests of some engines move
onto others, which re-prefill what they receive (:meth:`SteppedSimulator.move`). The queue
orders, placements and the engine model are the shared ones; preemption is not (a request keeps
its slot until it ends or moves).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import Protocol

from rlweave.sim.batching import Request, Simulator, _Jump
from rlweave.sim.engine import EngineModel
from rlweave.sim.policies import Placement, QueueOrder


class StepListener(Protocol):
    """What a :class:`SteppedSimulator` tells its client, and asks it, at each iteration."""

    def iteration_ended(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        """``engine``'s iteration ended at ``now``, before its tokens are counted."""
        ...

    def finished(self, sim: SteppedSimulator, request: int, now: float) -> None:
        """``request`` made its last token at ``now``."""
        ...

    def boundary(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        """``engine`` has retired its finished requests and filled its slots; its next iteration
        starts after this (a :meth:`SteppedSimulator.move` may come here)."""
        ...

    def wall_s(self, sim: SteppedSimulator, engine: int, iteration_s: float) -> float:
        """Wall seconds of ``engine``'s next iteration, which alone would take ``iteration_s``."""
        ...


class SteppedSimulator(Simulator):
    """:class:`Simulator` (not fluid, never preempting) with one event per iteration and a
    :class:`StepListener`; see the module docstring. ``prompts_prefilled``: see :meth:`submit`.
    It keeps no :attr:`log` (one entry per iteration would cost as much as the run); :meth:`busy_s`
    counts its pauses as busy (it takes none: the listener's wall time stands in for them)."""

    def __init__(self, engines: Sequence[EngineModel], listener: StepListener, order: QueueOrder | None = None,
                 placement: Placement | None = None, slots: Sequence[int] | None = None,
                 prompts_prefilled: bool = False) -> None:
        super().__init__(engines, order=order, placement=placement, slots=slots)
        self.listener = listener
        self.prompts_prefilled = prompts_prefilled
        self._current = -1  # the engine at its boundary, between its choice and its next iteration
        self._moves = itertools.count()

    def submit(self, requests: Sequence[Request]) -> None:
        """As :meth:`Simulator.submit`; with ``prompts_prefilled``, a request starts without
        prefilling its prompt (a model that leaves the first prefill out; a move still pays it)."""
        super().submit(requests)
        if self.prompts_prefilled:
            self._prefilled.update(r.id for r in requests)

    def move(self, sources: Sequence[int], destinations: Sequence[int], now: float) -> None:
        """Abort every request on ``sources`` (they take no more work) and resubmit them onto
        ``destinations`` in turn, behind what waits there. Those that fit a destination's free
        slots join its batch at once; each destination first re-prefills everything it received
        (prompt and generated tokens): its iteration in flight ends that much later, an idle one
        starts after it."""
        moved = [i for k in sources for i in self._abort(k)]
        stall = dict.fromkeys(destinations, 0.0)
        for n, i in enumerate(moved):
            k = destinations[n % len(destinations)]
            e, r = self._engines[k], self.requests[i]
            stall[k] += e.model.prefill_s_per_token * (r.prompt_tokens + r.output_tokens - self.left[i])
            self._prefilled.add(i)
            heapq.heappush(e.waiting, ((math.inf, next(self._moves)), i))
        for k, s in stall.items():
            self._receive(k, s, now)

    def _abort(self, engine: int) -> list[int]:
        """Empty ``engine`` (its iteration in flight is void); its requests, running first."""
        e = self._engines[engine]
        out = e.running + [i for _, i in sorted(e.waiting)]
        e.running, e.waiting, e.jump = [], [], None
        e.version += 1
        return out

    def _receive(self, engine: int, stall_s: float, now: float) -> None:
        e = self._engines[engine]
        self._choose(engine, now)
        if engine == self._current or e.jump is None:
            e.carry_s += stall_s  # paid before its next iteration
            if engine != self._current and e.running:
                self._start(engine, now)
        else:
            e.jump.stall_s += stall_s
            e.jump.end += stall_s
            self._schedule(engine, e.jump.end)

    def _boundary(self, engine: int, now: float) -> None:
        e = self._engines[engine]
        if e.jump is None or not e.jump.count:  # nothing ran yet: the first choice
            super()._boundary(engine, now)
            return
        self.listener.iteration_ended(self, engine, now)
        e.busy_s += e.jump.end - e.jump.start
        left, done = self.left, []
        for i in e.running:
            left[i] -= 1
            if left[i] <= 0:
                done.append(i)
        for i in done:
            self.finish_s[i] = now
            e.running.remove(i)
            self.listener.finished(self, i, now)
        e.jump = None
        self.placement.refill(self, engine, now)
        self._choose(engine, now)
        self._current = engine
        self.listener.boundary(self, engine, now)
        self._current = -1
        if e.running:
            self._start(engine, max(now, e.resume_at))

    def _start(self, engine: int, start: float) -> None:
        """One iteration, its wall time the listener's, after the prefill of the requests new to
        the engine (and any stall a move left it)."""
        e = self._engines[engine]
        every = len(self._prefilled) == len(self.requests)  # the common case: nothing new to look for
        new = () if every else tuple(i for i in e.running if i not in self._prefilled)
        prefill = sum(self.requests[i].prompt_tokens + self.requests[i].output_tokens - self.left[i] for i in new)
        self._prefilled.update(new)
        stall = e.model.prefill_s_per_token * prefill + e.carry_s
        each = self.listener.wall_s(self, engine, e.model.iteration_s(len(e.running)))
        e.jump = _Jump(start, stall, each, 1, start + stall + each, prefill=prefill, new=new, carried_s=e.carry_s)
        e.carry_s = 0.0
        self._schedule(engine, e.jump.end)
