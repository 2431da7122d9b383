"""A plugin's own engine scheduler on the shared simulator: the decision code that runs inside
vLLM, driven over the neutral types of :mod:`rlweave.types` as the vLLM adapter drives it
(``rlweave.adapters.vllm.scheduler``), so that a prediction runs the plugin's policy rather than
a stand-in for it.

One engine, one event per iteration (:class:`~rlweave.sim.stepped.SteppedSimulator`): before an
iteration, while requests wait, the scheduler sees the waiting and running requests and returns
a :class:`~rlweave.types.ScheduleDecision`; the requests it names first are admitted first, the
running ones it names are preempted and wait again, held out of that iteration, as the adapter
holds them. A decision the scheduler hands back unchanged (the same object) is in place already
and is not applied again, as in the adapter. After each iteration it hears an
:class:`~rlweave.types.EngineStep` (its wall time, the tokens scheduled, the free KV blocks),
then each request that finished. A preempted request keeps its KV (it resumes without a
prefill): the bench's engine kept it (no token re-prefilled) while it had room.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from rlweave.sim.batching import Request
from rlweave.sim.engine import EngineModel
from rlweave.sim.stepped import SteppedSimulator
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision


class EngineScheduler(Protocol):
    """An engine's scheduling policy as a plugin implements it (the preemptive_serving
    plugin's :class:`PreemptiveScheduler` is one)."""

    def arrive(self, request: RequestView, now: float) -> None:
        """``request`` joined the engine's waiting queue at ``now``."""

    def decide(self, waiting: Sequence[RequestView], running: Sequence[RequestView], now: float) -> ScheduleDecision:
        """The order of the waiting queue and the running requests to preempt, before an iteration."""
        ...

    def step(self, step: EngineStep) -> None:
        """An iteration ended."""

    def finish(self, request: RequestView) -> None:
        """``request`` made its last token."""


class _Appended:
    """Queue order of the waiting queue as vLLM keeps it: arrivals at the back."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def key(self, request: Request, left: float) -> tuple:
        return (next(self._next),)


class DecidedSimulator(SteppedSimulator):
    """One engine of ``model`` whose queue ``scheduler`` decides (see the module docstring).
    ``info``: the engine as the scheduler is told of it (its slots are the simulator's);
    ``max_tokens``: each request's cap by id, as the scheduler sees it (absent: none)."""

    def __init__(self, model: EngineModel, scheduler: EngineScheduler, info: EngineInfo,
                 max_tokens: Mapping[int, int] | None = None) -> None:
        super().__init__([model], self, order=_Appended(), slots=[info.max_num_seqs])
        self.scheduler, self.info = scheduler, info
        self.max_tokens = dict(max_tokens or {})
        self._applied: ScheduleDecision | None = None
        self.preemptions = 0

    def view(self, i: int) -> RequestView:
        """Request ``i`` as the engine's scheduler sees it: tokens made, and KV computed (all
        but its last token's, once prefilled)."""
        r = self.requests[i]
        made = int(round(r.output_tokens - self.left[i]))
        computed = r.prompt_tokens + made - 1 if i in self._prefilled else 0
        return RequestView(str(i), r.arrival_s, r.prompt_tokens, made, self.max_tokens.get(i), 0, 0, max(computed, 0))

    def enqueue(self, engine: int, requests: Sequence[Request], now: float) -> None:
        for r in requests:
            self.scheduler.arrive(self.view(r.id), now)
        super().enqueue(engine, requests, now)

    def _choose(self, engine: int, now: float) -> None:
        """The scheduler's decision applied as the adapter applies it, then the free slots
        filled from the front of the waiting queue."""
        e = self._engines[engine]
        queue = [i for _, i in sorted(e.waiting)]
        held: list[int] = []
        if queue:
            decision = self.scheduler.decide([self.view(i) for i in queue], [self.view(i) for i in e.running], now)
            if decision is not self._applied:
                waiting = set(queue)
                front = [int(x) for x in decision.waiting_order if int(x) in waiting]
                queue = front + [i for i in queue if i not in set(front)]
                held = [i for i in map(int, decision.preempt) if i in e.running]
                e.running = [i for i in e.running if i not in held]
                self.preemptions += len(held)
            self._applied = decision
        while queue and len(e.running) < e.slots:
            e.running.append(queue.pop(0))
        queue = held + queue
        e.waiting = [((n - len(queue),), i) for n, i in enumerate(queue)]  # ahead of later arrivals

    # -- the StepListener the stepped simulator asks -------------------------------------------

    def iteration_ended(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        e = self._engines[engine]
        j = e.jump
        tokens = sum(max(1, self.requests[i].prompt_tokens) for i in j.new) + len(e.running) - len(j.new)
        self.scheduler.step(EngineStep(str(engine), len(e.running), len(e.waiting), tokens, j.start, j.end,
                                       tuple(map(str, e.running)), num_free_kv_blocks=self._free_blocks()))

    def finished(self, sim: SteppedSimulator, request: int, now: float) -> None:
        self.scheduler.finish(self.view(request))

    def boundary(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        """Nothing to do: the decision was taken in :meth:`_choose`."""

    def wall_s(self, sim: SteppedSimulator, engine: int, iteration_s: float) -> float:
        return iteration_s

    def _free_blocks(self) -> int:
        """KV blocks not held by a running request or a preempted one (which keeps its KV)."""
        e, size = self._engines[0], self.info.block_size or 1
        holders = e.running + [i for _, i in e.waiting if i in self._prefilled]
        held = sum(math.ceil((self.requests[i].prompt_tokens + self.requests[i].output_tokens - self.left[i]) / size)
                   for i in holders)
        return max(0, self.info.num_kv_blocks - held)
