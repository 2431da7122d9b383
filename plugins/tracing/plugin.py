"""Hook implementations of the tracing plugin: each hook becomes a span or an instant event."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.tracing import now_us, tracer
from rlweave.types import (
    CheckpointCandidate,
    EngineInfo,
    EngineStep,
    FrameworkInfo,
    Heartbeat,
    RecoveryAction,
    RecoveryRecord,
    RequestView,
    RoutingTrace,
    StageContext,
    TrajectoryEvent,
    WorkerIncident,
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
                       tokens=step.num_scheduled_tokens, decided=step.decided)


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


@hookimpl
def rlweave_heartbeat(beat: Heartbeat) -> None:
    # Each finished section of a worker (a trainer rank's update_actor) on the worker's lane.
    for done in beat.finished:
        tracer.record_span(done.section, beat.worker, done.start_s * 1e6, (done.start_s + done.duration_s) * 1e6,
                           step=done.step, section=True)


@hookimpl(wrapper=True)
def rlweave_incident(incident: WorkerIncident) -> RecoveryAction | None:
    action = yield
    tracer.instant("incident", "resilience", worker=incident.worker, kind=incident.kind.value,
                   step=incident.step, section=incident.section, culprit=incident.culprit,
                   score=incident.score, detail=incident.detail,
                   action=action.kind.value if action is not None else None)
    return action


@hookimpl
def rlweave_recovery_done(record: RecoveryRecord) -> None:
    args = {"worker": record.incident.worker, "kind": record.incident.kind.value,
            "action": record.action.kind.value, "ok": record.ok}
    if record.fault_s:
        tracer.record_span("detection", "resilience", record.fault_s * 1e6, record.incident.detected_s * 1e6, **args)
    tracer.record_span("recovery", "resilience", record.start_s * 1e6, record.end_s * 1e6,
                       steps_redone=record.steps_redone, requests_resubmitted=record.requests_resubmitted, **args)
    tracer.flush()


@hookimpl(wrapper=True)
def rlweave_resume_checkpoint(candidates: Sequence[CheckpointCandidate]) -> CheckpointCandidate | None:
    chosen = yield
    tracer.instant("checkpoint_resume", "resilience", chosen=chosen.path if chosen else None,
                   skipped={c.path: list(c.problems) for c in candidates if c.problems})
    return chosen
