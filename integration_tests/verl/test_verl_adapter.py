"""verl loads rlweave through its ``verl.plugins`` entry point: in a fresh ``import verl``, in
verl's real ``main_ppo`` command line, and in the workers of a Ray worker group on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlweave.tracing import load_events

HERE = Path(__file__).resolve().parent
REGISTRY = ("import verl; from verl.experimental.agent_loop.agent_loop import _agent_loop_registry; "
            "print(sorted(_agent_loop_registry))")


def python(*args: str, timeout: int = 180, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base["RAY_AUTH_MODE"] = "disabled"
    # Ray would start one idle worker per CPU for a script's first driver; verl's worker group
    # gives each worker its own environment (rank, world size), so none of them would be used.
    base["RAY_prestart_worker_first_driver"] = "0"
    return subprocess.run([sys.executable, *args], env=base | env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(200)
def test_import_verl_loads_the_adapter_and_registers_the_agent_loop(tmp_path):
    proc = python("-c", REGISTRY, RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rlweave_single_turn" in proc.stdout and "rlweave_tool_agent" in proc.stdout
    loaded = [e for e in load_events(tmp_path) if e["name"] == "framework_loaded"]
    assert [e["args"]["name"] for e in loaded] == ["verl"]


@pytest.mark.timeout(200)
def test_disabled_leaves_verls_registry_as_it_was():
    proc = python("-c", REGISTRY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rlweave" not in proc.stdout


@pytest.mark.timeout(200)
def test_a_misspelt_flag_stops_verls_own_trainer_with_one_clear_message():
    proc = python("-m", "verl.trainer.main_ppo", "+rlweave.tracing.enabel=true")
    assert proc.returncode != 0
    assert "rlweave: unknown option 'rlweave.tracing.enabel'" in proc.stderr
    assert "Options of rlweave.tracing: enable, dir" in proc.stderr
    assert "Traceback" not in proc.stderr  # the message alone, not buried in a stack


@pytest.mark.timeout(200)
def test_agentic_rollout_without_priority_scheduling_is_refused():
    proc = python("-m", "verl.trainer.main_ppo", "+rlweave.agentic_rollout.enable=true")
    assert proc.returncode != 0
    assert "set actor_rollout_ref.rollout.scheduling_policy=priority" in proc.stderr


@pytest.mark.timeout(200)
def test_agentic_rollout_on_an_engine_without_request_priorities_is_refused():
    proc = python("-m", "verl.trainer.main_ppo", "+rlweave.agentic_rollout.enable=true",
                  "actor_rollout_ref.rollout.name=trtllm", "actor_rollout_ref.rollout.scheduling_policy=priority")
    assert proc.returncode != 0
    assert ("actor_rollout_ref.rollout.name=trtllm (from verl command line), but rlweave.agentic_rollout needs "
            "actor_rollout_ref.rollout.name in {vllm, sglang}") in proc.stderr


@pytest.mark.timeout(200)
def test_a_plugin_enabled_through_the_environment_is_checked_against_verls_config():
    """No ``+rlweave.*`` on the command line, so the import-time check cannot tell the job's
    settings; verl's config validation (``verl_config_check``) refuses it, before Ray starts."""
    proc = python("-m", "verl.trainer.main_ppo", RLWEAVE__AGENTIC_ROLLOUT__ENABLE="true")
    assert proc.returncode != 0
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rlweave:")]
    assert ("actor_rollout_ref.rollout.scheduling_policy=fcfs (from the job's config), but "
            "rlweave.agentic_rollout needs") in line
    assert "ray init kwargs" not in proc.stdout  # stopped before main_ppo starts Ray


@pytest.mark.parametrize(("overrides", "refused"), [
    (["actor_rollout_ref.rollout.scheduling_policy=priority",
      "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_tool_agent"], None),
    (["actor_rollout_ref.rollout.scheduling_policy=priority",
      "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_tool_agent",
      "actor_rollout_ref.rollout.name=trtllm"],
     "actor_rollout_ref.rollout.name=trtllm (from the job's config)"),
])
def test_verls_composed_config_is_checked_as_its_command_line_is(overrides, refused, monkeypatch):
    """What the patch calls, on verl's own composed config (Hydra's compose, as a script that
    builds its config would): a config that meets the plugin passes, one that does not is
    refused naming the setting."""
    from hydra import compose, initialize_config_module

    from rlweave.adapters.verl import check_assembled_config
    from rlweave.host import reset

    monkeypatch.setenv("RLWEAVE__AGENTIC_ROLLOUT__ENABLE", "true")
    reset()
    try:
        with initialize_config_module("verl.trainer.config", version_base=None):
            config = compose("ppo_trainer", overrides=overrides)
        if refused is None:
            check_assembled_config(config)  # does not raise
        else:
            with pytest.raises(SystemExit, match=re.escape(refused)):
                check_assembled_config(config)
    finally:
        reset()


def check_command_line(argv: list[str]) -> None:
    """The check the adapter runs at ``import verl`` in verl's driver, through the host."""
    from rlweave.adapters.verl import _check_command_line
    from rlweave.adapters.verl_needs import verl_requirements
    from rlweave.config import settings_from_overrides
    from rlweave.host import activate, reset
    from rlweave.requirements import gathered

    try:
        host = activate(settings_from_overrides(argv), export_env=False)
        _check_command_line(verl_requirements(gathered(host.hook.rlweave_needs())), argv)
    finally:
        reset()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_agentic_rollout_accepts_vllm_and_sglang_with_priority_scheduling(engine):
    check_command_line(["+rlweave.agentic_rollout.enable=true", f"actor_rollout_ref.rollout.name={engine}",
                        "actor_rollout_ref.rollout.scheduling_policy=priority",
                        "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_tool_agent"])  # does not raise


@pytest.mark.parametrize(("plugins", "message"), [
    (("stream_generation",), "trainer.v1.trainer_mode=sync (the default), but rlweave.stream_generation needs"),
    (("stage_fusion",), "trainer.v1.trainer_mode=sync (the default), but rlweave.stage_fusion needs"),
    (("stream_generation", "stage_fusion"), "trainer.v1.trainer_mode=colocate_async"),
])
def test_stream_plugins_refuse_a_command_line_they_cannot_honour(plugins, message):
    """The path to the user's terminal is shown by the agentic test above. Stream generation and
    stage fusion share the stream trainer, so they compose, with any advantage estimator (GAE's
    wait for the batch's last sample)."""
    from rlweave.config import ConfigError

    argv = [f"+rlweave.{p}.enable=true" for p in plugins]
    wrong = ["trainer.v1.trainer_mode=colocate_async"] if len(plugins) > 1 else []
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_command_line([*argv, *wrong])
    check_command_line([*argv, "trainer.v1.trainer_mode=rlweave_stream", "algorithm.adv_estimator=gae"])


@pytest.mark.timeout(300)
def test_ray_worker_group_on_cpu_calls_the_stage_hook(tmp_path):
    proc = python(str(HERE / "ray_worker_group.py"), timeout=280,
                  RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [w["result"] for w in workers] == [3, 13] and all(w["active"] for w in workers)
    spans = [e for e in load_events(tmp_path) if e["name"] == "update_actor"]
    assert {e["pid"] for e in spans} == {w["pid"] for w in workers}
    assert {e["worker"] for e in spans} == {"actor-rank0", "actor-rank1"}


@pytest.mark.timeout(200)
def test_agentic_rollout_replaces_verls_request_load_balancer(tmp_path):
    """With the flag alone, verl's own factory builds rlweave's balancer (a Ray actor) and
    every turn is placed by the plugin. (The trajectory events come from rlweave's agent loops,
    which report them to this actor: ``test_verl_agent_loops.py``.)"""
    proc = python(str(HERE / "router_script.py"), timeout=180,
                  RLWEAVE__AGENTIC_ROLLOUT__ENABLE="true", RLWEAVE__TRACING__ENABLE="true",
                  RLWEAVE__TRACING__DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["balancer"] == "rlweave.adapters.verl.router.RlweaveLoadBalancer"
    assert out["acquire_fields"] == []  # as verl's: the context comes with the turn's report
    assert all(len(servers) == 3 and set(servers) <= {"server-0", "server-1"}
               for servers in out["turns"].values())
    assert out["status"]["total_inflight"] == 0
    assert {s for servers in out["turns"].values() for s in servers} == {"server-0", "server-1"}


@pytest.mark.timeout(200)
def test_without_the_flag_verl_builds_its_own_balancer():
    proc = python(str(HERE / "router_script.py"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["balancer"] == "verl.workers.rollout.router.GlobalRequestLoadBalancer"
    assert all(len(set(servers)) == 1 for servers in out["turns"].values())  # sticky


@pytest.mark.timeout(600)
def test_a_verl_outside_the_supported_range_is_refused_when_a_plugin_is_on(version_gate):
    """``import verl`` (verl's plugin loader), with the installed version read as one just
    outside ``rlweave.frameworks``' range: rlweave stops the process with one clear message."""
    from rlweave.frameworks import FRAMEWORKS

    outside, run = version_gate
    for version in outside("verl"):
        proc = run("verl", version, "import verl", RLWEAVE__TRACING__ENABLE="true", RAY_AUTH_MODE="disabled")
        assert proc.returncode != 0, f"verl {version} was accepted"
        assert (f"rlweave: verl {version} is not supported by rlweave "
                f"(supported: {FRAMEWORKS['verl'].supported_range})") in proc.stderr
        assert "Traceback" not in proc.stderr
