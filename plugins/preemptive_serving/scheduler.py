"""The preemptive-serving policy of one engine: engine events in, a ScheduleDecision out."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlweave.config import PreemptiveServingConfig
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
        self.skip_join = config.policy == "skip_join_mlfq"
        self.fixed_quantum_s = config.base_quantum_ms / 1000.0
        self.profile = IterationProfile()
        self.mlfq = SkipJoinMLFQ(self.fixed_quantum_s or _UNMEASURED_QUANTUM_S,
                                 config.quantum_ratio, config.num_levels, config.starvation_s)
        if not engine.can_preempt:
            log.warning("rlweave preemptive_serving: engine %s cannot preempt running requests "
                        "(vLLM async scheduling); MLFQ orders the waiting queue only.",
                        engine.instance_id)

    def arrive(self, request: RequestView, now: float) -> None:
        prefill_s = (self.profile.prefill_s(request.prompt_len)
                     if self.skip_join and self.profile.ready else 0.0)
        self.mlfq.add(request.request_id, now=now, prefill_s=prefill_s, priority=request.priority)

    def step(self, step: EngineStep) -> None:
        seconds = step.end_s - step.start_s
        self.profile.observe(step.num_scheduled_tokens, seconds)
        if not self.fixed_quantum_s and self.profile.shortest_s < float("inf"):
            self.mlfq.base_quantum_s = self.profile.shortest_s
        self.mlfq.served(step.scheduled, seconds, step.end_s)

    def decide(self, waiting: Sequence[RequestView], running: Sequence[RequestView],
               now: float) -> ScheduleDecision:
        for view in (*waiting, *running):
            if view.request_id not in self.mlfq.jobs:  # arrived before this policy existed
                self.arrive(view, now)
        order, preempt = self.mlfq.decide([r.request_id for r in waiting],
                                          [r.request_id for r in running],
                                          self.engine.max_num_seqs, now, self.engine.can_preempt)
        return ScheduleDecision(waiting_order=tuple(order), preempt=tuple(preempt))

    def finish(self, request_id: str) -> None:
        self.mlfq.remove(request_id)
