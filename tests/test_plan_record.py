"""The planner's Record step reads a trace the tracing plugin really wrote: the hooks are fired
through rlweave's host with the plugin enabled, so the files are the plugin's own format."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlweave import host
from rlweave.config import settings_from_overrides
from rlweave.plan import RecordError, record
from rlweave.tracing import tracer
from rlweave.types import (
    EngineInfo,
    EngineStep,
    Heartbeat,
    RequestView,
    SectionTime,
    Stage,
    StageContext,
    TrajectoryEvent,
    TrajectoryEventKind,
    TrajectoryInfo,
)

BASE, PER_SEQ, PREFILL = 0.010, 0.002, 0.0001  # the engine the synthetic iterations follow
LENGTHS = [3, 5, 8, 13, 21]
STAGE_S = {Stage.GENERATE: 0.06, Stage.OLD_LOG_PROB: 0.02, Stage.UPDATE_ACTOR: 0.04}


@pytest.fixture
def traced(tmp_path, monkeypatch):
    """A host with only the tracing plugin, writing into ``tmp_path/trace``."""
    monkeypatch.setenv("RLWEAVE_LOAD_PLUGINS", "")
    name = tracer.process_name
    h = host.activate(settings_from_overrides(["+rlweave.tracing.enable=true",
                                               f"++rlweave.tracing.dir={tmp_path / 'trace'}"]), export_env=False)
    yield h, tmp_path / "trace"
    tracer.disable()
    tracer.process_name = name


def fire_job(h, steps: int = 2) -> None:
    """Two steps of verl's sync loop with one engine, a heartbeat and one two-turn trajectory."""
    rng = np.random.default_rng(0)
    h.hook.rlweave_engine_started(engine=EngineInfo("vllm", "engine-0", max_num_seqs=16, max_num_batched_tokens=512))
    t = 1000.0
    for _ in range(40):
        running, prefill = int(rng.integers(1, 17)), int(rng.integers(0, 200))
        seconds = BASE + PER_SEQ * running + PREFILL * prefill
        h.hook.rlweave_engine_step(step=EngineStep("engine-0", running, 0, running + prefill, t, t + seconds))
        t += seconds
    for i, n in enumerate(LENGTHS):
        h.hook.rlweave_request_finished(request=RequestView(f"r{i}", time.time(), 10, n, None))
    for step in range(1, steps + 1):
        for stage, seconds in STAGE_S.items():
            h.hook.rlweave_run_stage(context=StageContext(stage, step, "actor"),
                                     run=lambda s=seconds: time.sleep(s))
    # a rank's heartbeat repeats update_actor as a section (its own timing, longer here): not a stage span
    h.hook.rlweave_heartbeat(beat=Heartbeat("trainer:0", time.time(), finished=(
        SectionTime("update_actor", 1, time.time() - 30, 30.0),)))
    info = TrajectoryInfo("traj-0", "g", 0, 0)
    for kind, pause in ((TrajectoryEventKind.START, 0), (TrajectoryEventKind.TURN_START, 0),
                        (TrajectoryEventKind.TURN_END, 0.05), (TrajectoryEventKind.TURN_START, 0),
                        (TrajectoryEventKind.TURN_END, 0), (TrajectoryEventKind.FINISH, 0)):
        h.hook.rlweave_trajectory_event(event=TrajectoryEvent(kind, info, time.time()))
        time.sleep(pause)
    tracer.flush()


def test_record_reads_stages_requests_iterations_and_turns(traced):
    h, directory = traced
    fire_job(h)
    job = record(directory)
    assert job.steps == 2
    stages = job.stage_s()
    assert list(stages) == ["generate", "old_log_prob", "update_actor"]  # verl's order
    for stage, seconds in STAGE_S.items():
        assert seconds <= stages[stage.value] < seconds + 0.05
    assert sorted(job.output_lengths.tolist()) == LENGTHS
    assert job.requests_per_step == len(LENGTHS) / 2
    assert job.engines == ("engine-0",) and job.slots == 16 and len(job.iterations.seconds) == 40
    [trajectory] = job.trajectories
    assert trajectory.turns == 2 and 0.05 <= trajectory.tool_s < 0.1
    assert trajectory.gaps == (trajectory.tool_s,)  # each gap apart, after its own turn


def test_the_fitted_engine_recovers_the_iterations_coefficients(traced):
    h, directory = traced
    fire_job(h)
    engine = record(directory).engine
    assert engine.base_s == pytest.approx(BASE, rel=1e-3)
    assert engine.per_seq_s == pytest.approx(PER_SEQ, rel=1e-3)
    assert engine.prefill_s_per_token == pytest.approx(PREFILL, rel=1e-3)
    assert engine.slots == 16


def test_an_empty_or_stageless_trace_says_what_to_record(tmp_path, traced):
    with pytest.raises(RecordError, match="no rlweave trace.*tracing.enable=true"):
        record(tmp_path / "nothing")
    h, directory = traced
    h.hook.rlweave_step_end(step=1, metrics={})  # an instant only
    with pytest.raises(RecordError, match="no trainer stage and no engine iteration"):
        record(directory)
