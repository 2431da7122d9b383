"""verl's own ``main_ppo`` refuses, before the job starts and with one message naming why and the
fix, what verl 0.9's Megatron engine cannot run with rlweave's layers: ``overlap`` on any path
(nothing would be replaced), ``replay_balance`` off the path it trains on (vanilla mbridge with
``SequentialMLP`` experts: ``integration_tests/verl_trainer/test_replay_balance_verl.py``) or
without routing replay. Runs verl's real command line in the megatron-core environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def main_ppo(cwd, *overrides: str) -> subprocess.CompletedProcess:
    """verl's trainer command line, run in ``cwd`` (Hydra writes its outputs/ there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")} | {"RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(200)
def test_overlap_which_verls_megatron_engine_cannot_apply_stops_the_job_before_it_starts(tmp_path):
    proc = main_ppo(tmp_path, "+rlweave.overlap.enable=true", "model_engine=megatron")
    assert proc.returncode != 0
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rlweave:")]
    assert "rlweave.overlap.enable=true (from verl command line)" in line
    assert "leaving no ColumnParallelLinear or RowParallelLinear to replace" in line
    assert line.endswith("set rlweave.overlap.enable=false.")


@pytest.mark.timeout(200)
def test_replay_balance_outside_the_mbridge_path_it_runs_on_stops_the_job_before_it_starts(tmp_path):
    """verl's default bridge (Megatron-Bridge) and grouped experts: one line naming both fixes."""
    proc = main_ppo(tmp_path, "+rlweave.replay_balance.enable=true", "model_engine=megatron",
                    "actor_rollout_ref.actor.megatron.router_replay.mode=R3")
    assert proc.returncode != 0
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rlweave:")]
    assert ("actor_rollout_ref.actor.megatron.vanilla_mbridge=False (the default), but rlweave.replay_balance "
            "needs actor_rollout_ref.actor.megatron.vanilla_mbridge in {True, true}") in line
    assert "names experts by position" in line
    assert line.endswith("set actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=False.")


@pytest.mark.timeout(200)
def test_replay_balance_names_the_router_replay_it_plans_from(tmp_path):
    proc = main_ppo(tmp_path, "+rlweave.replay_balance.enable=true", "model_engine=megatron")
    assert proc.returncode != 0
    assert ("actor_rollout_ref.actor.megatron.router_replay.mode=disabled (the default), but "
            "rlweave.replay_balance needs actor_rollout_ref.actor.megatron.router_replay.mode in {R2, R3}") in proc.stderr
