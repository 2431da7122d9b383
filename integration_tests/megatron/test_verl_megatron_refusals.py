"""verl's own ``main_ppo`` refuses ``replay_balance`` and ``overlap`` before the job starts, with
one message naming why and the fix: verl 0.9's Megatron engine never builds rlweave's layers,
so either would otherwise run as if enabled (overlap: nothing replaced; replay_balance: a stop at
the first training step). Runs verl's real command line in the megatron-core environment."""

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
@pytest.mark.parametrize(("plugin", "why"), [
    ("overlap", "has no ColumnParallelLinear or RowParallelLinear for overlap's linears to replace"),
    ("replay_balance", "Megatron-Bridge's weight sync (verl's default bridge) names experts by position"),
])
def test_a_plugin_verls_megatron_engine_cannot_apply_stops_the_job_before_it_starts(plugin, why, tmp_path):
    proc = main_ppo(tmp_path, f"+rlweave.{plugin}.enable=true", "model_engine=megatron",
                    "actor_rollout_ref.actor.megatron.router_replay.mode=R3")
    assert proc.returncode != 0
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rlweave:")]
    assert f"rlweave.{plugin}.enable=true (from verl command line)" in line and why in line
    assert line.endswith(f"set rlweave.{plugin}.enable=false.")


@pytest.mark.timeout(200)
def test_replay_balance_names_the_router_replay_it_plans_from(tmp_path):
    proc = main_ppo(tmp_path, "+rlweave.replay_balance.enable=true", "model_engine=megatron")
    assert proc.returncode != 0
    assert ("actor_rollout_ref.actor.megatron.router_replay.mode=disabled (the default), but "
            "rlweave.replay_balance needs actor_rollout_ref.actor.megatron.router_replay.mode in {R2, R3}") in proc.stderr
