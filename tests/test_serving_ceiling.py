"""``bench serving``'s SIMULATED ceiling: the engine model's fit, its speed matched to a
measured FCFS, and the two schedules."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.benchmarks.serving import synthetic_workload
from rlweave.benchmarks.serving_ceiling import calibrate_speed, fit_engine, simulate
from rlweave.plan.generation import serve_open_loop
from rlweave.sim import EngineModel, Request
from rlweave.types import EngineInfo


def test_the_engine_model_is_fitted_from_requests_alone_and_the_saturation_probe() -> None:
    # alone: 2 ms per output token, 0.1 ms per prompt token; at 4 slots an iteration takes 5 ms
    # (2 ms + 1 ms per sequence): a probe request of 50 + 40 tokens holds 50 us x 50 of prefill
    # and 40 iterations shared by 4, so it takes (5 ms + 40 x 5 ms / 4) of the engine
    per_request = 1e-4 * 50 + 40 * 5e-3 / 4
    engine = fit_engine([0.01, 1e-4, 3e-3], 40 / per_request, 50, 40, slots=4)
    assert engine.iteration_s(1, 0) == pytest.approx(3e-3)
    assert engine.iteration_s(4, 0) == pytest.approx(5e-3)
    assert engine.prefill_s_per_token == pytest.approx(1e-4)


def test_the_fixed_cost_per_request_is_latency_outside_the_iterations_and_keeps_the_probe() -> None:
    """Worked by hand: alone, 0.5 s fixed, 0.1 s per prompt token, 1 s per output token; the
    probe, 4 requests of 10 + 4 tokens at once on 2 slots, 16 tokens in 16.5 s. Its wall holds
    the fixed cost once, so the engine's share is 16 s: two waves of a 2 s prefill (20 tokens)
    and 4 iterations of 1.5 s at full batch (2 x (2 + 6) = 16). One request alone (10 + 3
    tokens, arriving at 2 s): latency 0.5 + 1 + 3 x 1 = 4.5 s."""
    probe = 16 / 16.5
    engine = fit_engine([0.5, 0.1, 1.0], probe, 10, 4, slots=2, probe_requests=4)
    assert (engine.request_s, engine.iteration_s(1), engine.iteration_s(2)) == pytest.approx((0.5, 1.0, 1.5))
    alone = [{"arrival_s": 2.0, "prompt_len": 10, "output_len": 3}]
    assert simulate(alone, 1.0, engine, "fcfs").norm_latency.tolist() == pytest.approx([4.5 / 3])
    info = EngineInfo("vllm", "0", 2, 0, 1000, 16, can_preempt=True, keeps_preempted_kv=True)
    assert serve_open_loop([Request(0, 2.0, 3, 10)], engine, "fcfs", info).tolist() == pytest.approx([6.5])
    # the fitted model gives the probe back: its 16 tokens end at 16 s in the engine, 16.5 s out
    assert simulate([{"arrival_s": 0.0, "prompt_len": 10, "output_len": 4}] * 4, 1.0, engine,
                    "fcfs").tokens_per_s == pytest.approx(probe)
    # without the probe's count the fixed cost is dropped, as before: the probe's whole wall is
    # the iterations' (full batch 2 x (4.125 - 1) / 4 = 1.5625 s)
    dropped = fit_engine([0.5, 0.1, 1.0], probe, 10, 4, slots=2)
    assert (dropped.request_s, dropped.iteration_s(2)) == pytest.approx((0.0, 1.5625))
    assert engine.scaled(2.0).request_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="request_s"):
        EngineModel(base_s=1.0, request_s=-0.1)


def test_one_slot_serves_in_arrival_order_and_srpt_runs_the_shortest_first() -> None:
    engine = EngineModel(base_s=1.0, per_seq_s=0.0, slots=1, prefill_s_per_token=0.0)
    requests = [{"arrival_s": 0.0, "prompt_len": 1, "output_len": 10},
                {"arrival_s": 0.5, "prompt_len": 1, "output_len": 1}]
    # FCFS: the long one's 10 iterations, then the short one's
    fcfs = simulate(requests, 1.0, engine, "fcfs")
    assert fcfs.norm_latency.tolist() == [1.0, 10.5] and fcfs.tokens_per_s == 1.0  # 11 tokens by 11 s
    # SRPT: at 1 s the short one (1 token left) preempts the long one (9 left)
    assert simulate(requests, 1.0, engine, "srpt").norm_latency.tolist() == [1.1, 1.5]


def test_shortest_remaining_first_beats_fcfs_on_heavy_tails_near_capacity() -> None:
    workload = synthetic_workload(300, 0, "heavy")
    engine = EngineModel(base_s=2e-3, per_seq_s=5e-4, slots=4, prefill_s_per_token=2e-5)
    tokens_per_s = 4 / engine.iteration_s(4, 0)
    rate = 0.95 * tokens_per_s / np.mean([r["output_len"] for r in workload])
    fcfs, srpt = (simulate(workload, rate, engine, p).norm_latency.mean() for p in ("fcfs", "srpt"))
    assert srpt < fcfs / 2
    with pytest.raises(ValueError, match="unknown policy"):
        simulate(workload, rate, engine, "lifo")


def test_the_model_is_slowed_until_its_fcfs_matches_the_measured_one() -> None:
    workload = synthetic_workload(200, 1, "heavy")
    engine = EngineModel(base_s=2e-3, per_seq_s=5e-4, slots=4, prefill_s_per_token=2e-5)
    rate = 0.9 * 4 / engine.iteration_s(4, 0) / np.mean([r["output_len"] for r in workload])
    # an engine 4% slower than the model, near capacity: FCFS several times the model's
    measured = simulate(workload, rate, engine.scaled(1.04), "fcfs").norm_latency.mean()
    assert measured > 1.5 * simulate(workload, rate, engine, "fcfs").norm_latency.mean()
    assert calibrate_speed(workload, rate, engine, measured) == pytest.approx(1.04, rel=2e-3)
    # no speed within the bounds explains a latency below the no-queueing one
    assert calibrate_speed(workload, rate, engine, 1e-4) is None
