"""Inside an inference engine (vLLM v1 scheduler, SGLang scheduler): one call per iteration.

Called by ``rlweave.adapters.vllm.scheduler`` in the EngineCore process, and by the SGLang
adapter in SGLang's scheduler process.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.hookspecs import hookspec
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision


@hookspec
def rlweave_engine_started(engine: EngineInfo) -> None:
    """The engine built its scheduler; profile-at-start-up plugins measure here."""


@hookspec
def rlweave_request_arrived(request: RequestView) -> None:
    """A request entered the engine's waiting queue."""


@hookspec(firstresult=True)
def rlweave_schedule(
    waiting: Sequence[RequestView], running: Sequence[RequestView], engine: EngineInfo
) -> ScheduleDecision | None:
    """Decide, before the engine schedules an iteration, the order of the waiting queue and
    which running requests to preempt (``ScheduleDecision.preempt``, only where
    ``engine.can_preempt``).

    Only called when some plugin implements it and a request is waiting, so an observer-only
    setup costs nothing on the engine's hot path. ``None`` keeps the engine's own policy (FCFS
    or vLLM priority).
    """


@hookspec
def rlweave_engine_step(step: EngineStep) -> None:
    """The engine finished one iteration (called on the hot path: keep implementations cheap)."""


@hookspec
def rlweave_request_finished(request: RequestView) -> None:
    """A request left the engine (finished, aborted or length-capped)."""
