"""Event-driven continuous batching over engine instances: the one simulator every planner,
ceiling and oracle in rlweave runs on.

Each engine runs iterations back to back; an iteration decodes one token of every running
request and prefills the prompts of those that start in it (:class:`EngineModel`). Requests
join or leave the running set only at iteration boundaries, as in vLLM: a request that arrives
mid-iteration waits for the boundary. Between two changes of the running set every iteration
costs the same, so the simulator jumps over them in one event (cost per event, not per
iteration): a jump ends at the first finish, or earlier at the boundary after something joins
the engine's queue. A pause stops every engine (a weight push): the iteration in flight resumes
after it.

``fluid=True`` is the coarser model StreamRL's planner and the agentic simulation were built on:
a request placed mid-iteration starts at once, progress counts in fractions of a token, and a
pause keeps the fraction made. A jump then prefills first (a stall) and decodes at one token
per ``iteration_s(b)`` after it.

``eager=True`` (fluid only) takes an engine's boundary at each request it is given, so requests
placed at one instant are chosen one at a time, as an agent loop submits them: what the engine
chose at that instant is committed (its prefill paid) before the next arrives.

What a request waits in and how it is chosen are the policies (:mod:`rlweave.sim.policies`): a
placement puts it on an engine's waiting queue, the queue order ranks it there, the preemption
rule says whether a waiting request displaces a running one at each boundary, and the prefill
rule says what a request prefills when it starts on an engine. A :class:`RequestListener` hears
each start, preemption, finish and scheduled boundary (an agent loop submits its next turn from
a finish); :meth:`Simulator.rebuild` merges engines into one of another model (tail parallelism).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rlweave.sim.engine import EngineModel
from rlweave.sim.policies import (
    ArrivalOrder,
    KeepRunning,
    Placement,
    Preemption,
    Prefill,
    PromptAndMade,
    QueueOrder,
    RoundRobin,
)

# at one instant, arrivals are queued before an engine chooses, and engines choose in index order
_ARRIVAL, _BOUNDARY = 0, 1


@dataclass(frozen=True)
class Request:
    """One generation request: ``id`` indexes the simulator's results (0..n-1, arrival order);
    ``group``: requests a placement keeps together (StreamRL's groups), -1 for none;
    ``output_tokens``: whole, but for a fluid simulator."""

    id: int
    arrival_s: float
    output_tokens: float
    prompt_tokens: int = 0
    group: int = -1


@dataclass(frozen=True)
class Iteration:
    """One logged jump: ``iterations`` iterations of ``engine`` from ``start_s`` to ``end_s``,
    each decoding ``decoding`` requests; the first also prefilled ``prefill_tokens``."""

    engine: int
    start_s: float
    end_s: float
    decoding: int
    prefill_tokens: int
    iterations: float  # whole, but for a fluid simulator


@dataclass
class _Jump:
    """``count`` iterations from ``start``: the first also prefills (``stall_s`` more), then one
    each ``each_s``; ``end = start + stall_s + count * each_s`` plus any pause inside."""

    start: float
    stall_s: float
    each_s: float
    count: float  # iterations until the boundary where the running set may change
    end: float
    pauses: list[tuple[float, float]] = field(default_factory=list)  # pauses inside the jump: from, until
    prefill: int = 0
    new: tuple[int, ...] = ()  # the requests it prefills
    carried_s: float = 0.0  # the stall it took over from a cut jump


class RequestListener(Protocol):
    """What a :class:`Simulator` tells its client about requests (all optional to act on)."""

    def started(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        """``request`` took a slot on ``engine`` at ``now`` (again, after a preemption)."""

    def preempted(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        """``request`` gave its slot to a better waiting one and waits again."""

    def finished(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        """``request`` made its last token at ``now`` (the client may submit more from here)."""

    def boundary(self, sim: Simulator, engine: int, now: float) -> None:
        """``engine``'s scheduled iteration boundary was taken (its next iteration started)."""


@dataclass
class _Engine:
    model: EngineModel
    slots: int
    waiting: list[tuple[tuple, int]] = field(default_factory=list)  # heap of (queue key, request id)
    running: list[int] = field(default_factory=list)
    jump: _Jump | None = None
    version: int = 0
    resume_at: float = 0.0
    busy_s: float = 0.0
    carry_s: float = 0.0  # a fluid engine's prefill stall left unpaid when its jump was cut


class Simulator:
    """Continuous batching of submitted requests on ``engines`` (one :class:`EngineModel` per
    instance; ``slots``: per instance where the models leave it open). Feed it with
    :meth:`submit`, advance it with :meth:`run_until` (or :meth:`run` to the end), read
    :attr:`finish_s`, :meth:`busy_s` and :attr:`log`. ``fluid`` and ``eager``: see the module
    docstring."""

    def __init__(self, engines: Sequence[EngineModel], order: QueueOrder | None = None,
                 preemption: Preemption | None = None, placement: Placement | None = None,
                 slots: Sequence[int] | None = None, fluid: bool = False, eager: bool = False,
                 prefill: Prefill | None = None, listener: RequestListener | None = None) -> None:
        slots = list(slots) if slots is not None else [m.slots for m in engines]
        if not engines or len(slots) != len(engines) or any(s is None or s < 1 for s in slots):
            raise ValueError(f"Simulator needs at least one engine and a slot count >= 1 for each (from the "
                             f"EngineModel or the slots argument), got {len(engines)} engines, slots {slots}")
        self._engines = [_Engine(m, int(s)) for m, s in zip(engines, slots, strict=True)]
        self.order = order or ArrivalOrder()
        self.preemption = preemption or KeepRunning()
        self.placement = placement or RoundRobin()
        if eager and not fluid:
            raise ValueError("eager admission is a fluid simulator's (a request placed mid-iteration starts at once): "
                             "pass fluid=True with eager=True")
        self.fluid, self.eager = fluid, eager
        self.prefill = prefill or PromptAndMade()
        self.request_listener = listener
        self._displacing: set[int] = set()  # requests that took a running one's slot at this boundary
        self.requests: dict[int, Request] = {}
        self.left: dict[int, float] = {}
        self.finish_s: dict[int, float] = {}
        self.log: list[Iteration] = []
        self._prefilled: set[int] = set()
        self._events: list[tuple[float, int, int, int, object]] = []  # (time, kind, engine, seq, payload)
        self._seq = itertools.count()

    @property
    def engine_count(self) -> int:
        return len(self._engines)

    def submit(self, requests: Sequence[Request]) -> None:
        """Requests that arrive at their ``arrival_s`` (those arriving together, together)."""
        by_time: dict[float, list[Request]] = {}
        for r in requests:
            whole = self.fluid or float(r.output_tokens).is_integer()
            if r.id in self.requests or r.output_tokens <= 0 or not whole:
                raise ValueError(f"request {r.id}: ids must be new and output_tokens > 0 (whole tokens unless the "
                                 f"simulator is fluid), got {r}")
            self.requests[r.id] = r
            self.left[r.id] = r.output_tokens
            by_time.setdefault(r.arrival_s, []).append(r)
        for t, batch in by_time.items():
            heapq.heappush(self._events, (t, _ARRIVAL, -1, next(self._seq), batch))

    def pause(self, now: float, until: float) -> None:
        """No engine makes progress from ``now`` to ``until``; an iteration in flight resumes
        after. Call once every event up to ``now`` has run."""
        for k, e in enumerate(self._engines):
            e.resume_at = max(e.resume_at, until)
            if e.jump is not None and e.jump.end > now:
                self._cut(k, now)
                if e.jump.count and not self.fluid:  # the iteration in flight resumes after the pause
                    e.jump.pauses.append((now, until))
                    e.jump.end += until - now
                self._schedule(k, e.jump.end)

    def next_event_s(self) -> float:
        """When the next arrival or iteration boundary is (``inf``: none)."""
        while self._events and self._stale(self._events[0]):
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else math.inf

    def run_until(self, until: float) -> None:
        """Process every event up to and including ``until``."""
        while math.isfinite(t := self.next_event_s()) and t <= until:
            now, kind, _, _, payload = heapq.heappop(self._events)
            if kind == _ARRIVAL:
                self.placement.arrive(self, payload, now)
            else:
                self._boundary(payload[0], now)
                if self.request_listener is not None:
                    self.request_listener.boundary(self, payload[0], now)

    def run(self) -> Simulator:
        """Run until every submitted request has finished."""
        self.run_until(math.inf)
        return self

    def busy_s(self, now: float = math.inf) -> np.ndarray:
        """Seconds each engine has spent iterating up to ``now`` (pauses and idle excluded)."""
        return np.array([e.busy_s + (self._partial(e.jump, now) if e.jump else 0.0) for e in self._engines])

    def finish_array(self) -> np.ndarray:
        """Finish time of requests 0..n-1 (``inf``: not finished)."""
        return np.array([self.finish_s.get(i, math.inf) for i in range(len(self.requests))])

    def running(self, engine: int) -> int:
        """How many requests ``engine``'s iteration in flight decodes."""
        return len(self._engines[engine].running)

    def waiting(self, engine: int) -> int:
        """How many requests wait in ``engine``'s queue."""
        return len(self._engines[engine].waiting)

    def has_room(self, engine: int) -> bool:
        """Whether ``engine``'s running and waiting requests are fewer than its slots."""
        e = self._engines[engine]
        return len(e.running) + len(e.waiting) < e.slots

    def enqueue(self, engine: int, requests: Sequence[Request], now: float) -> None:
        """Placement's door: ``requests`` join ``engine``'s waiting queue at ``now``; they can
        start at its next iteration boundary (at once, or when a pause ends, if it is idle)."""
        e = self._engines[engine]
        for r in requests:
            heapq.heappush(e.waiting, (self.order.key(r, self.left[r.id]), r.id))
        if self.eager:
            if e.jump is not None and e.jump.end > now:
                self._cut(engine, now)
            self._boundary(engine, now)
        elif e.jump is None:
            start = max(now, e.resume_at)
            e.jump = _Jump(start=start, stall_s=0.0, each_s=0.0, count=0, end=start)
            self._schedule(engine, e.jump.end)
        elif e.jump.end > now and self._cut(engine, now):
            self._schedule(engine, e.jump.end)

    def rebuild(self, engine: int, absorb: Sequence[int], model: EngineModel, until: float, now: float) -> None:
        """Engines ``absorb`` hand every request to ``engine``, which becomes ``model`` and
        resumes at ``until`` (a reconfiguration, as tensor parallelism for the tail): running
        requests keep the tokens they made and lose their KV (a prefill in flight is lost with
        it), and all wait on ``engine`` in its order; the absorbed engines take no more work."""
        if not self.fluid:
            raise ValueError("rebuild stops engines mid-iteration, which only a fluid simulator models: "
                             "pass fluid=True")
        head = self._engines[engine]
        for k in (*absorb, engine):
            e = self._engines[k]
            if e.jump is not None and e.jump.end > now:
                self._cut(k, now)
            self._settle(k)
            self._prefilled.difference_update(e.running)
            moved = [(self.order.key(self.requests[i], self.left[i]), i) for i in e.running] + e.waiting
            e.running, e.waiting, e.carry_s = [], [], 0.0
            e.version += 1  # its scheduled boundary is void
            for entry in moved:
                heapq.heappush(head.waiting, entry)
        head.model, head.resume_at = model, max(head.resume_at, until)
        self._boundary(engine, until)

    def _cut(self, engine: int, now: float) -> bool:
        """Shorten the engine's jump to end at its first boundary at or after ``now`` (fluid:
        at ``now``, with the unpaid part of its prefill stall carried to the next jump)."""
        e = self._engines[engine]
        j = e.jump
        if j.pauses or not j.count:
            return False
        if now < j.start or (now == j.start and not self.eager):
            # not begun (it waits for a pause to end): the engine chooses afresh then
            self._prefilled.difference_update(j.new)
            e.carry_s, j.count, j.stall_s, j.end = j.carried_s, 0, 0.0, j.start
            return True
        decoding = max(0.0, now - j.start - j.stall_s) / j.each_s
        if self.fluid:
            e.carry_s = max(0.0, j.start + j.stall_s - now)
            j.stall_s -= e.carry_s
            j.count, j.end = min(decoding, j.count), max(now, j.start)
            return True
        done = max(1, math.ceil(decoding - 1e-12))
        if done >= j.count:
            return False
        j.count, j.end = done, j.start + j.stall_s + done * j.each_s
        return True

    def _schedule(self, engine: int, at: float) -> None:
        e = self._engines[engine]
        e.version += 1
        heapq.heappush(self._events, (at, _BOUNDARY, engine, next(self._seq), (engine, e.version)))

    def _stale(self, event: tuple) -> bool:
        return event[1] == _BOUNDARY and event[4][1] != self._engines[event[2]].version

    def _boundary(self, engine: int, now: float) -> None:
        """The engine's jump ended: count its tokens, retire finished requests, refill, choose."""
        e = self._engines[engine]
        self._settle(engine)
        for i in [i for i in e.running if self.left[i] <= 1e-9 * max(1.0, self.requests[i].output_tokens)]:
            self.finish_s[i] = now
            e.running.remove(i)
            if self.request_listener is not None:
                self.request_listener.finished(self, i, engine, now)
        self.placement.refill(self, engine, now)
        self._choose(engine, now)
        if e.running:
            self._start(engine, max(now, e.resume_at))

    def _settle(self, engine: int) -> None:
        """Count the tokens of the engine's ended (or cut) jump; it has no jump after."""
        e = self._engines[engine]
        if e.jump is not None and e.jump.count:
            self._account(engine, e.jump)
            for i in e.running:
                self.left[i] -= e.jump.count
        e.jump = None

    def _choose(self, engine: int, now: float) -> None:
        """Fill the slots from the waiting queue in its order; then, with a preempting rule,
        while the best waiting request ranks strictly above the worst running one (the first
        admitted among equals), it takes that one's slot."""
        e = self._engines[engine]
        started = []
        while e.waiting and len(e.running) < e.slots:
            started.append(heapq.heappop(e.waiting)[1])
            e.running.append(started[-1])
        self._displacing = set()
        while self.preemption.preempts and e.waiting and e.running:
            worst = max(e.running, key=lambda i: self.order.key(self.requests[i], self.left[i]))
            key = self.order.key(self.requests[worst], self.left[worst])
            if e.waiting[0][0] >= key:
                break
            e.running.remove(worst)
            heapq.heappush(e.waiting, (key, worst))
            if self.preemption.recompute:  # only the requests that lose their slot lose their KV
                self._prefilled.discard(worst)
            if self.request_listener is not None:
                self.request_listener.preempted(self, worst, engine, now)
            started.append(heapq.heappop(e.waiting)[1])
            e.running.append(started[-1])
            self._displacing.add(started[-1])
        if self.request_listener is not None:
            for i in started:
                self.request_listener.started(self, i, engine, now)

    def _start(self, engine: int, start: float) -> None:
        e = self._engines[engine]
        new = [i for i in e.running if i not in self._prefilled]
        prefill = sum(self.prefill.tokens(self, i, engine, i in self._displacing) for i in new)
        self._prefilled.update(new)
        stall = e.model.iteration_s(0, prefill) - e.model.iteration_s(0) + e.carry_s
        each = e.model.iteration_s(len(e.running))
        count = min(self.left[i] for i in e.running)
        e.jump = _Jump(start, stall, each, count, start + stall + count * each, prefill=prefill, new=tuple(new),
                       carried_s=e.carry_s)
        e.carry_s = 0.0
        self._schedule(engine, e.jump.end)

    def _account(self, engine: int, j: _Jump) -> None:
        e = self._engines[engine]
        e.busy_s += j.end - j.start - sum(b - a for a, b in j.pauses)
        self.log.append(Iteration(engine, j.start, j.end, len(e.running), j.prefill, j.count))

    @staticmethod
    def _partial(j: _Jump, now: float) -> float:
        """Busy seconds of an unfinished jump up to ``now``."""
        if not j.count or now <= j.start:
            return 0.0
        upto = min(now, j.end)
        return upto - j.start - sum(max(0.0, min(upto, b) - a) for a, b in j.pauses)
