"""The preemptive-serving policy of one engine: engine events in, a ScheduleDecision out.

Two policies share the MLFQ of :mod:`.mlfq` and differ in how they level a request:

- ``skip_join_mlfq`` / ``mlfq`` (FastServe): join by prefill time (or the top level), demote by
  attained service. Information-agnostic, so it preempts whatever the lengths: on near-uniform
  lengths that only delays everyone.
- ``adaptive`` (rlweave's default): level by *expected remaining work*, from the lengths the
  engine has served, the request's ``max_tokens`` and its attained tokens
  (:class:`.lengths.LengthModel`), plus the prefill it still needs. This preempts where the
  distribution says it pays: MLFQ-like on heavy tails, shortest-remaining-first where caps are
  lengths, never on near-uniform lengths; FCFS until enough requests have finished. The
  regime it believes in is logged whenever it changes.

Both spare a running request whose remaining work is smaller than the recompute its
preemption would cost (none where the engine keeps a preempted request's KV and has room).
The adaptive policy also spares one that would finish before the request that would take its
slot: with remaining work ``b`` for the running request, ``a`` for the entrant and ``r`` for
the recompute, running the entrant first lowers the pair's total completion time only when
``b > a + r``. And a request promoted for starvation does not preempt at all: it takes the
next free slot. (Letting it preempt by work alone made near-ties thrash on near-uniform lengths
under overload: each newly admitted request, a little longer than the next starving one, was
preempted in its first iteration.) Explicit priorities are not second-guessed: a
higher-priority entrant preempts whatever the work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlweave.plugins.preemptive_serving.options import PreemptiveServingConfig
from rlweave.plugins.preemptive_serving.lengths import LengthModel
from rlweave.plugins.preemptive_serving.mlfq import SkipJoinMLFQ
from rlweave.plugins.preemptive_serving.profile import IterationProfile
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision

log = logging.getLogger("rlweave.preemptive_serving")
# Quantum used before the engine's first iteration is measured. It never decides anything:
# demotion needs an iteration, and the first one sets the measured quantum.
_UNMEASURED_QUANTUM_S = 1e-3


class PreemptiveScheduler:
    """Skip-join MLFQ over one engine, profiled on that engine while it runs.

    Until the profile has seen enough iterations to fit a line (a handful, see
    :class:`IterationProfile`), arrivals join the top level as in plain MLFQ.
    """

    def __init__(self, config: PreemptiveServingConfig, engine: EngineInfo) -> None:
        self.engine = engine
        self.adaptive = config.policy == "adaptive"
        self.skip_join = config.policy != "mlfq"
        self.fixed_quantum_s = config.base_quantum_ms / 1000.0
        self.profile = IterationProfile()
        self.lengths = LengthModel()
        self.mlfq = SkipJoinMLFQ(self.fixed_quantum_s or _UNMEASURED_QUANTUM_S,
                                 config.quantum_ratio, config.num_levels, config.starvation_s,
                                 demote_by_service=not self.adaptive)
        self._requests: dict[str, RequestView] = {}  # the latest view of each request
        self._free_kv_blocks = engine.num_kv_blocks
        self._held: _HeldDecision | None = None  # the last decision
        # The level of a decoding request by (output length, max_tokens), for the current
        # length model and quantum: see _relevel_running.
        self._decoding_levels: dict[tuple[int, int | None], int] = {}
        self._levelled_at_fit = 0  # the length model's fit that the levels come from
        self.regime = self.lengths.regime().name if self.adaptive else config.policy
        if not engine.can_preempt:
            log.warning("rlweave preemptive_serving: engine %s cannot preempt running requests "
                        "(vLLM async scheduling); MLFQ orders the waiting queue only.",
                        engine.instance_id)
        elif self.adaptive:
            log.info("rlweave preemptive_serving: engine %s, adaptive policy; lengths: %s",
                     engine.instance_id, self.lengths.regime().detail)

    # -- events ------------------------------------------------------------------------------

    def arrive(self, request: RequestView, now: float) -> None:
        self._requests[request.request_id] = request
        work_s = self._work_s(request) if self.adaptive else (
            self.profile.prefill_s(request.prompt_len) if self.skip_join and self.profile.ready else 0.0)
        self.mlfq.add(request.request_id, now=now, prefill_s=work_s, priority=request.priority)

    def step(self, step: EngineStep) -> None:
        seconds = step.end_s - step.start_s - step.schedule_overhead_s - step.observe_overhead_s
        quantum_s = self.profile.shortest_s
        self.profile.observe(step.num_scheduled_tokens, seconds)
        if not self.fixed_quantum_s and self.profile.shortest_s != quantum_s:
            self.mlfq.base_quantum_s = self.profile.shortest_s
            self._held = None  # every level's quantum changed
            self._decoding_levels.clear()
        self._free_kv_blocks = step.num_free_kv_blocks
        self.mlfq.served(step.scheduled, seconds, step.end_s)

    def finish(self, request: RequestView) -> None:
        self.mlfq.remove(request.request_id)
        self._requests.pop(request.request_id, None)
        if self.adaptive:
            fits = self.lengths.fits
            self.lengths.observe(request.output_len, request.max_tokens)
            regime = self.lengths.regime() if self.lengths.fits != fits else None
            if regime is not None and regime.name != self.regime:
                self.regime = regime.name
                log.info("rlweave preemptive_serving: engine %s believes lengths are %s (%s).",
                         self.engine.instance_id, regime.name, regime.detail)

    # -- the decision ------------------------------------------------------------------------

    def decide(self, waiting: Sequence[RequestView], running: Sequence[RequestView],
               now: float) -> ScheduleDecision:
        if self.adaptive and self.lengths.fits != self._levelled_at_fit:
            self._relevel(self._requests.values(), now)  # the model changed: every request
            self._levelled_at_fit = self.lengths.fits
            self._decoding_levels.clear()
        requests, jobs = self._requests, self.mlfq.jobs
        for view in running:
            requests[view.request_id] = view
            if view.request_id not in jobs:  # arrived before this policy existed
                self.arrive(view, now)
        if self.adaptive:
            self._relevel_running(running, now)
        running_ids = tuple(r.request_id for r in running)
        self.mlfq.promote_starved(now)
        held = self._held
        if held is not None and held.same(self.mlfq.version, running_ids):
            return held.decision  # no rank changed and nobody was admitted or preempted
        decision = self._decide(waiting, running_ids, now)
        self._held = _HeldDecision(decision, self.mlfq.version, running_ids)
        return decision

    def _decide(self, waiting: Sequence[RequestView], running_ids: tuple[str, ...],
                now: float) -> ScheduleDecision:
        candidates: Iterable[str] | None = None  # every request it knows that is not running
        if len(self.mlfq.jobs) != len(waiting) + len(running_ids):  # some it has not seen arrive,
            for view in waiting:  # or some outside vLLM's waiting queue: ask the queue itself
                if view.request_id not in self.mlfq.jobs:
                    self.arrive(view, now)
            candidates = [view.request_id for view in waiting]
        order, preempt = self.mlfq.decide(candidates, running_ids, self.engine.max_num_seqs, now,
                                          self.engine.can_preempt, keep=self._keep_running)
        return ScheduleDecision(waiting_order=tuple(order), preempt=tuple(preempt))

    def _relevel(self, views: Iterable[RequestView], now: float) -> None:
        if self.lengths.ready:
            for view in views:
                if view.request_id in self.mlfq.jobs:
                    self.mlfq.set_level(view.request_id, self.mlfq.join_level(self._work_s(view)), now)

    def _relevel_running(self, running: Sequence[RequestView], now: float) -> None:
        """:meth:`_relevel` of the running requests, which runs every engine iteration. A
        decoding request's work (no prefill left) depends only on its output length and
        ``max_tokens``, and running requests pass through the same lengths one after another,
        so its level is looked up by those two while the length model and the quantum stay."""
        if not self.lengths.ready:
            return
        levels, mlfq = self._decoding_levels, self.mlfq
        for view in running:  # each has a job: decide() added the missing ones
            if view.prompt_len + view.output_len - view.num_computed_tokens > 1:  # prefilling
                level = mlfq.join_level(self._work_s(view))
            else:
                key = (view.output_len, view.max_tokens)
                level = levels.get(key)
                if level is None:
                    level = levels[key] = mlfq.join_level(self._work_s(view))
            mlfq.set_level(view.request_id, level, now)

    def _keep_running(self, victim_id: str, entrant_id: str) -> bool:
        """Whether preempting the running ``victim_id`` for ``entrant_id`` costs more than it
        gains: more recompute than the work the victim has left (at its level, for FastServe's
        MLFQ), or, for the adaptive policy, more than the entrant's work saves (see the module
        docstring)."""
        view = self._requests[victim_id]
        recompute_s = self._recompute_s(view)
        if self._remaining_s(view) < recompute_s:
            return True
        entrant = self._requests.get(entrant_id)
        if not self.adaptive or entrant is None or entrant.priority != view.priority:
            return False
        if self.mlfq.jobs[entrant_id].promoted:  # starvation reorders the queue, nothing more
            return True
        return self._work_s(view) <= self._work_s(entrant) + recompute_s

    # -- costs -------------------------------------------------------------------------------

    def _iteration_s(self) -> float:
        """Seconds per generated token: the engine's shortest iteration (a decode step)."""
        return self.mlfq.base_quantum_s

    def _prefill_s(self, tokens: int) -> float:
        return self.profile.prefill_s(tokens) if self.profile.ready and tokens > 1 else 0.0

    def _work_s(self, view: RequestView) -> float:
        """Expected remaining work: the prefill still needed plus the expected remaining tokens
        (0 while the length model is warming up, so every request joins the top level)."""
        tokens = self.lengths.expected_remaining(view.output_len, view.max_tokens)
        if tokens is None:
            return 0.0
        uncomputed = view.prompt_len + view.output_len - view.num_computed_tokens
        return self._prefill_s(uncomputed) + tokens * self._iteration_s()

    def _remaining_s(self, view: RequestView) -> float:
        cap_s = (math.inf if view.max_tokens is None
                 else (view.max_tokens - view.output_len) * self._iteration_s())
        if self.adaptive:
            return min(self._work_s(view), cap_s) if self.lengths.ready else cap_s
        job = self.mlfq.jobs[view.request_id]
        return min(self.mlfq.quantum(job.level) - job.attained_s, cap_s)

    def _recompute_s(self, view: RequestView) -> float:
        """Zero where the engine will keep the request's KV; else re-prefilling it."""
        if self.engine.keeps_preempted_kv and self._has_room():
            return 0.0
        return self._prefill_s(view.num_computed_tokens)

    def _has_room(self) -> bool:
        """At least a tenth of the KV blocks free as of the last iteration (FastServe holds new
        requests back below that much free swap space). The adapter decides each preemption
        from the blocks the admitted requests need; this only estimates its answer."""
        return self._free_kv_blocks >= 0.1 * self.engine.num_kv_blocks > 0


@dataclass(frozen=True)
class _HeldDecision:
    """The last decision and what it was taken on: reused while no rank changed
    (:attr:`SkipJoinMLFQ.version`) and the same requests run."""

    decision: ScheduleDecision
    version: int
    running_ids: tuple[str, ...]

    def same(self, version: int, running_ids: tuple[str, ...]) -> bool:
        return version == self.version and running_ids == self.running_ids
