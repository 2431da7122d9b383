"""``rlweave bench fusion-schedule --quick`` end to end (small budget), and bench
fusion-executor's report on synthetic rank results."""

from __future__ import annotations

import argparse

import pytest

from rlweave.benchmarks import fusion_executor, fusion_schedule
from rlweave.plugins.stage_fusion.baselines import separate_1f1b
from rlweave.plugins.stage_fusion.schedule import Evaluator


def test_quick_sweep_reports_ratios_with_their_bound_and_draws(tmp_path):
    args = argparse.Namespace(quick=True, seconds=0.2, seed=0)
    result = fusion_schedule.run(args)
    runs = result.details["runs"]
    assert len(runs) == result.headline["configs"] == len(fusion_schedule.sweep(True)) == len(result.rows) - 1
    assert all(r["lower_bound"] <= r["makespan"] <= min(r["greedy"], r["separate_1f1b"]) for r in runs)
    mean, worst = result.headline["mean_makespan_over_lb"], result.headline["max_makespan_over_lb"]
    assert mean >= 1
    assert mean <= worst
    assert result.headline["min_speedup_vs_1f1b"] >= 1 and "SIMULATED" in result.regime
    assert fusion_schedule.plot(result, tmp_path / "f.png").stat().st_size > 10_000


def test_executor_report_compares_measured_steps_with_the_simulated_ones():
    settings = dict(critic_pp=2, micro_batches=2, repeats=2, warmup=1, batch=1, seq=4,
                    layers_per_stage=1, seed=0)
    problem = fusion_executor._problem(settings)
    separate = Evaluator(problem).expand(separate_1f1b(problem)).to_json()
    orders = {"separate_1f1b": separate, "fused": separate}
    spans = [[(tuple(e), 0.0, 0.01 if e[3] == "F" else 0.02) for e in order] for order in separate]
    ranks = [{"times": {"separate_1f1b": [0.2, 0.22], "fused": [0.1, 0.12]}, "spans": s, "orders": orders}
             for s in spans]
    result = fusion_executor.report(ranks, settings)
    assert result.headline["speedup"] == round(0.21 / 0.11, 3)
    assert result.headline["predicted_speedup"] == 1.0  # the same order twice
    # Predicted from the measured spans (F 10 ms, B 20 ms), worked by hand in 10-ms units: the
    # actor's 1F1B over two stages and two micro-batches ends at 9 on rank 0 (F0 0-1, F1 1-2,
    # B0 4-6 after stage 1's B0 at 2-4, B1 7-9 after stage 1's F1 4-5 and B1 5-7), 7 on rank 1;
    # the critic then runs stage 0 on rank 1 (F0 7-8, F1 8-9, B0 12-14, B1 15-17) and stage 1 on
    # rank 0 (F0 9-10, B0 10-12, F1 12-13, B1 13-15): 17 units, 0.17 s.
    assert result.details["costs"] == {"actor": [[0.01, 0.01], [0.02, 0.02]], "critic": [[0.01, 0.01], [0.02, 0.02]]}
    assert result.details["predicted"] == {"separate_1f1b": pytest.approx(0.17), "fused": pytest.approx(0.17)}
