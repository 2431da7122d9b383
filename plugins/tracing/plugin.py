"""Hook implementations of the tracing plugin: each hook becomes a span or an instant event."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.tracing import now_us, tracer
from rlweave.types import (
    EngineInfo,
    EngineStep,
    FrameworkInfo,
    RequestView,
    RoutingTrace,
    StageContext,
    TrajectoryEvent,
)


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    tracer.configure(config.tracing.dir)


@hookimpl
def rlweave_framework_loaded(framework: FrameworkInfo) -> None:
    tracer.process_name = framework.process_role
    tracer.instant("framework_loaded", framework.process_role, **asdict(framework))


@hookimpl(wrapper=True)
def rlweave_run_stage(context: StageContext, run: Callable[[], Any]) -> Any:
    with tracer.span(context.stage.value, context.worker, step=context.step):
        return (yield)


@hookimpl
def rlweave_step_end(step: int, metrics: dict[str, float]) -> None:
    tracer.instant("step_end", "trainer", step=step)
    tracer.flush()  # once per step: a trainer process killed at shutdown keeps its stages


@hookimpl
def rlweave_engine_started(engine: EngineInfo) -> None:
    tracer.instant("engine_started", engine.instance_id, **asdict(engine))


@hookimpl
def rlweave_engine_step(step: EngineStep) -> None:
    tracer.record_span("iteration", step.instance_id, step.start_s * 1e6, step.end_s * 1e6,
                       running=step.num_running, waiting=step.num_waiting,
                       tokens=step.num_scheduled_tokens)


@hookimpl
def rlweave_request_finished(request: RequestView) -> None:
    # A request's whole stay in the engine, queueing included.
    tracer.record_span("request", "requests", request.arrival_s * 1e6, now_us(),
                       request_id=request.request_id, output_len=request.output_len,
                       priority=request.priority)


@hookimpl
def rlweave_trajectory_event(event: TrajectoryEvent) -> None:
    tracer.instant(f"trajectory_{event.kind.value}", event.trajectory.trajectory_id)


@hookimpl
def rlweave_routing_recorded(trace: RoutingTrace) -> None:
    tracer.instant("routing_recorded", trace.source, tokens=int(trace.topk_ids.shape[0]),
                   top_k=int(trace.topk_ids.shape[-1]))
