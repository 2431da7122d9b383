"""The done-when of the planner, on stored inputs: ``rlweave plan`` on a trace recorded from
verl's own ``main_ppo`` (verl's sync GRPO trainer on the CPU rig, traced as ``rlweave demo``'s
verl part records it: ``tests/data/traces/verl-grpo-sync``) with the cluster files in
``docs/examples`` for 1,024 and 10,000 H100s, each whole plan (sensitivity included) in under a
minute, every figure labelled."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from rlweave.plan.command import main

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "traces" / "verl-grpo-sync"
LABELS = {"SIMULATED", "MODELLED"}


def plan(gpus: int, capsys: pytest.CaptureFixture[str]) -> tuple[dict, float]:
    start = time.perf_counter()
    assert main([str(TRACE), "--cluster", str(ROOT / "docs" / "examples" / f"h100-{gpus}.toml"), "--json"]) == 0
    return json.loads(capsys.readouterr().out), time.perf_counter() - start


@pytest.mark.parametrize("gpus", [1024, 10_000])
def test_a_verl_jobs_trace_is_planned_on_1024_and_10000_gpus_in_under_a_minute(gpus, capsys):
    result, seconds = plan(gpus, capsys)
    assert seconds < 60
    assert result["gpus"] == gpus and result["instances"] == gpus // 4  # rollout TP 4
    # the stages verl's sync GRPO trainer ran, as the trace recorded them (no critic, no ref)
    assert set(result["stages"]) == {"generate", "old_log_prob", "adv", "update_actor", "weight_sync"}
    assert result["stages"]["generate"]["label"] == "SIMULATED"
    for row in result["plugins"]:
        assert row["label"] in LABELS or (row["label"] == "no prediction" and row["note"]), row["name"]
    assert {r["name"] for r in result["plugins"] if r["label"] == "no prediction"} == {"stage_fusion",
                                                                                         "replay_balance"}


def test_a_ten_times_larger_cluster_fails_ten_times_as_often_and_snapshots_more_often(capsys):
    small, _ = plan(1024, capsys)
    large, _ = plan(10_000, capsys)
    resilience = [next(r for r in p["plugins"] if r["name"] == "resilience") for p in (small, large)]
    mtbf = [r["settings"]["cluster MTBF h"] for r in resilience]
    assert mtbf[0] / mtbf[1] == pytest.approx(10_000 / 1024, rel=0.01)  # 50,000 GPU-hours each
    assert resilience[1]["settings"]["snapshot_every (steps)"] < resilience[0]["settings"]["snapshot_every (steps)"]
    assert resilience[1]["ratio"] < resilience[0]["ratio"] < 1  # it buys more where failures are frequent


def test_the_sensitivity_line_gives_moves_relative_to_its_own_fidelity(capsys):
    """Fewer GPU-hours between failures give resilience more to win (its ratio falls), more give
    it less; the line says so as changes, beside the reruns' own center."""
    result, _ = plan(1024, capsys)
    line = next(r for r in result["plugins"] if r["name"] == "resilience")["sensitivity"]
    match = re.fullmatch(r"GPU MTBF \(([-+]\d+\.\d)% at -20%, ([-+]\d+\.\d)% at \+20%, of (\d\.\d{3}) at that "
                         r"fidelity\)", line)
    assert match, line
    assert float(match[1]) < 0 < float(match[2])
