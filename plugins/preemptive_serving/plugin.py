"""Hook implementations of preemptive serving: one :class:`PreemptiveScheduler` per engine
process (vLLM runs one EngineCore, hence one scheduler, per process)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.plugins.preemptive_serving.options import PreemptiveServingConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.preemptive_serving.scheduler import PreemptiveScheduler
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision

_config = PreemptiveServingConfig()
_scheduler: PreemptiveScheduler | None = None


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _config
    _config = config.preemptive_serving


@hookimpl
def rlweave_engine_started(engine: EngineInfo) -> None:
    global _scheduler
    _scheduler = PreemptiveScheduler(_config, engine)


@hookimpl
def rlweave_request_arrived(request: RequestView) -> None:
    if _scheduler is not None:
        _scheduler.arrive(request, time.time())


@hookimpl
def rlweave_schedule(waiting: Sequence[RequestView], running: Sequence[RequestView],
                     engine: EngineInfo) -> ScheduleDecision | None:
    return None if _scheduler is None else _scheduler.decide(waiting, running, time.time())


@hookimpl
def rlweave_engine_step(step: EngineStep) -> None:
    if _scheduler is not None:
        _scheduler.step(step)


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    if _scheduler is not None:
        _scheduler.finish(request)
