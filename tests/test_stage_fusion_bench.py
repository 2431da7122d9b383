"""``rlweave bench fusion-inter``'s arithmetic on synthetic runs: the engine cost fitted from
iterations, the headline over interleaved rounds, the lower bound and the goals."""

from __future__ import annotations

import argparse

import pytest

from rlweave.benchmarks.fusion_inter import (FUSED, FUSED_FREE, STREAM, VERL, VERL_FAST, VERL_FREE, Setup,
                                             cost_overrides, fit_engine_cost, plot, report)


def span(ts: float, dur: float, worker: str, running: int, tokens: int) -> dict:
    return {"name": "iteration", "ph": "X", "ts": ts * 1e6, "dur": dur * 1e6, "worker": worker,
            "args": {"running": running, "tokens": tokens}}


def test_the_engine_cost_is_fitted_from_decode_and_prefill_iterations() -> None:
    spans, t = [], 0.0
    for b in (1, 2, 4, 8) * 5:  # 2 ms + 0.5 ms per sequence, start to start
        spans.append(span(t, 0.001, "engine a", b, b))
        t += 0.002 + 0.0005 * b
    # a prefill of 100 tokens beside one decoding sequence, start to start as the decodes
    spans.append(span(t, 0.001, "engine a", 1, 101))
    spans.append(span(t + 0.0025 + 100 * 20e-6, 0.001, "engine a", 1, 1))
    cost = fit_engine_cost(spans)
    assert cost["decode_base_ms"] == pytest.approx(2.0, rel=1e-6)
    assert cost["decode_per_seq_ms"] == pytest.approx(0.5, rel=1e-6)
    assert cost["prefill_us_per_token"] == pytest.approx(20.0, rel=1e-3)
    assert cost_overrides({"decode_base_ms": 2.0}) == ("+rlweave.stage_fusion.decode_base_ms=2",)
    with pytest.raises(RuntimeError, match="too few decode iterations"):
        fit_engine_cost([])


def run(stage_s: float, step_s: float, predicted: float | None = None, threshold: float = 0.0) -> dict:
    return {"stage_s": stage_s, "step_s": step_s, "generation_s": 0.8 * stage_s, "inference_s": 0.3 * stage_s,
            "threshold": threshold, "migrated": 2.0 if threshold else 0.0, "migrating_steps": 4 if threshold else 0,
            "predicted_stage_s": predicted, "inference_s_per_sample": 0.02, "inference_s_per_sample_shared": 0.04,
            "calibration_ms": 9.0}


def test_the_report_takes_medians_over_rounds_and_checks_the_goals(tmp_path) -> None:
    cost = {"decode_base_ms": 5.0, "decode_per_seq_ms": 0.5, "prefill_us_per_token": 20.0}

    def round_(fused_stage: float) -> dict:
        return {VERL: run(4.0, 5.0), VERL_FAST: run(3.2, 4.2) | {"generation_s": 2.0, "inference_s": 0.4}, STREAM: run(3.3, 4.2) | {"cost_model": cost},
                FUSED: run(fused_stage, 3.9, predicted=2.8, threshold=3), VERL_FREE: run(3.0, 4.0),
                FUSED_FREE: run(2.6, 3.5, predicted=2.5, threshold=2)}

    rounds = [round_(2.8), round_(3.0), round_(3.5)]
    lengths = [[n] for n in (10, 40, 200, 12)]
    result = report(rounds, lengths, Setup(16, 8, 4, 200), argparse.Namespace(steps=6), "synthetic", [])
    h = result.headline
    assert h["rounds"] == 3 and h["speedup"] == round(4.0 / 3.0, 3)  # the median round
    assert "speedup_vs_stream" in h["within_drift"]  # 3.3/3.5 < 1 < 3.3/2.8
    assert h["goals"]["ahead_of_stream_without_migration"] is False
    assert h["goals"]["stage_1.3x_verl_sync"] is True
    assert h["speedup_vs_fast_poll"] == round(3.2 / 3.0, 3) and h["goals"]["stage_1.3x_verl_sync_50ms_poll"] is False
    # verl's generation is the fast-polling run's: 0.4 / 2.0 of it, not 0.3 / 0.8 of the default's
    assert h["inference_to_generation_fast_poll"] == 0.2
    assert h["goals"]["inference_at_least_a_quarter_of_generation"] is False
    assert h["planner_error"] == round(abs(2.8 - 3.0) / 3.0, 3) and h["goals"]["planner_within_15pct"]
    lower = 200 * 5.5e-3 + 0.02  # the longest sample alone, then its inference
    assert h["lower_bound_speedup"] == round(4.0 / lower, 3)
    assert h["lower_bound_speedup_fast_poll"] == round(3.2 / lower, 3)
    assert h["uncontended_speedup"] == round(3.0 / 2.6, 3)
    assert [row[0] for row in result.rows][-1].startswith("lower bound")
    assert any("within drift" in row[3] for row in result.rows if row[0] == STREAM) is False
    result.events = [{**span(0.1, 0.05, "engine a", 2, 2), "run": FUSED}]
    assert plot(result, tmp_path / "fusion-inter.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(RuntimeError, match="failed in every round"):
        report([{FUSED: run(1, 1)}], lengths, Setup(16, 8, 4, 200), argparse.Namespace(steps=6), "x", ["it broke"])
