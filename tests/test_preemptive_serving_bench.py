"""``rlweave bench serving``'s workload side: seeded synthetic traffic, the JSONL trace format
and its errors, and the rescaling of arrivals to a load level."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlweave.benchmarks.serving import MAX_MODEL_LEN, read_trace, synthetic_workload, unit_rate


def test_synthetic_workload_is_seeded_heavy_tailed_and_fits_the_model():
    a, b = synthetic_workload(400, seed=3), synthetic_workload(400, seed=3)
    assert a == b != synthetic_workload(400, seed=4)
    outputs = sorted(r["output_len"] for r in a)
    assert outputs[-1] > 5 * outputs[len(outputs) // 2]  # a heavy tail
    assert all(r["prompt_len"] + r["output_len"] < MAX_MODEL_LEN for r in a)


def test_trace_is_read_sorted_and_rescaled_to_unit_rate(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        {"arrival_s": 14.0, "prompt_len": 8, "output_len": 4},
        {"arrival_s": 10.0, "prompt_len": 16, "output_len": 30},
        {"arrival_s": 12.0, "prompt_len": 32, "output_len": 2})) + "\n")
    workload = unit_rate(read_trace(path))
    assert [r["arrival_s"] for r in workload] == [0.0, 1.0, 2.0]
    assert [r["prompt_len"] for r in workload] == [16, 32, 8]


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": 1, "prompt_len": 8}', "trace.jsonl:1: expected"),
    ('{"arrival_s": 1, "prompt_len": 500, "output_len": 20}', "sum below 512"),
])
def test_bad_trace_line_names_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text(line + "\n" + '{"arrival_s": 2, "prompt_len": 8, "output_len": 8}\n')
    with pytest.raises(SystemExit, match=message):
        read_trace(path)


def fake_run(scale: float, workload: list[dict], levels: list[dict], preempt: bool) -> dict:
    """An engine run as serving_engine reports it: every latency ``scale`` times a base."""
    out = {"block_size": 128, "num_kv_blocks": 1000, "max_num_batched_tokens": 2048,
           "capacity_req_s": 30.0, "probe_tokens_per_s": 600.0 / scale, "alone": [{"prompt_len": p, "output_len": o, "latency_s": 0.001 * p / 10 + 0.002 * o}
                                             for p, o in ((8, 2), (64, 2), (8, 64), (128, 64))],
           "levels": {}, "finished": [], "steps": [], "bursts": {}}
    for level in levels:
        key = str(level["load"])
        results = [{"latency_s": scale * 0.003 * r["output_len"], "ttft_s": 0.01, "tokens": r["output_len"],
                    "finish_s": 10.0 * scale} for r in workload[: level["requests"]]]
        out["levels"][key] = {"rate_req_s": 6.0 * level["load"], "results": results, "name": f"load{key}"}
        if preempt:
            out["finished"] += [{"request_id": f"load{key}-{i}", "num_preemptions": 1, "num_recomputed_tokens": 0}
                                for i in range(level["requests"])]
    if preempt:
        out["steps"] = ["64 0.004 0.00003 0.00001 0"] * 10 + ["3 0.003 0.00001 0 0"] * 5
        out["bursts"] = {"64": [0, 10], "4": [10, 15]}
    return out


def test_report_pairs_interleaved_runs_into_ratios_with_their_spread():
    import argparse

    from rlweave.benchmarks.serving import report

    workload = synthetic_workload(40, seed=0)
    levels = [{"load": 0.2, "requests": 20}, {"load": 0.95, "requests": 40}]
    runs = {"fcfs": [fake_run(2.0, workload, levels, False), fake_run(2.2, workload, levels, False)],
            "rlweave": [fake_run(1.0, workload, levels, True), fake_run(1.0, workload, levels, True)]}
    args = argparse.Namespace(uncontended_load=0.2, max_num_seqs=4, trace=None, workload="heavy", repeats=2)
    result = report(args, ["fcfs", "rlweave"], runs, workload, levels, [0.95], 0)
    h = result.headline
    assert h["mean_norm_latency_ratio"] == 2.1 and h["mean_norm_latency_ratio_spread"] == [2.0, 2.2]
    assert h["throughput_ratio"] == 2.1 and h["preemptions_per_request"] == 1.0
    assert h["decision_share_64_waiting"] == 0.0075 and h["overhead_share_64_waiting"] == 0.01
    assert h["recomputed_tokens_per_preempted"] == 0.0
    assert h["all_requests_complete"] and len(result.rows[0]) == len(result.rows[-1])
    assert result.details["calibration_tokens_per_s"] == {"fcfs": [300, 273], "rlweave": [600, 600]}
    # SIMULATED beside the measurements: each round's engine model slowed until its FCFS matches
    # that round's measured FCFS at the highest load (the model's own numbers are worked by hand in
    # test_the_ceiling_model_on_a_case_worked_by_hand); the calibration's mark is the measurement
    top = result.details["levels"]["0.95"]
    factors = result.details["simulated_engine_speed_factors"]
    assert len(factors) == 2 and all(0.5 < f < 2.0 for f in factors)
    assert h["engine_speed_factor_simulated"] == pytest.approx(np.median(factors), abs=1e-3)
    assert top["simulated"]["fcfs"]["median"] == pytest.approx(top["fcfs"]["mean_norm_latency_s"]["median"], rel=2e-3)
    assert h["srpt_oracle_vs_lower_bound_simulated"] * top["lower_bound"]["mean_norm_latency_s"] <= (
        top["fcfs"]["mean_norm_latency_s"]["median"])
    assert "factor per round 1.1" in result.regime
    assert any("SIMULATED" in row[0] for row in result.rows)


def test_the_ceiling_model_on_a_case_worked_by_hand():
    from rlweave.benchmarks.serving_ceiling import calibrate_speed, fit_engine, simulate

    # fit_engine([fixed, prefill 0.1, alone 1.0], probe 1 token/s, probe 10+4 tokens, 2 slots):
    # a probe request costs 4 s (4 tokens at 1/s), of which 0.1 * 10 = 1 s prefill, so the 4
    # iterations at full batch take 2 * (4 - 1) / 4 = 1.5 s; per_seq = (1.5 - 1.0) / (2 - 1) = 0.5,
    # base = 1.0 - 0.5 = 0.5. (Check: both probe requests start in one 0.5 + 2 * 0.5 + 0.1 * 20 =
    # 3.5 s iteration, then 3 of 1.5 s: 8 tokens in 8 s.) A probe faster than alone (10 tokens/s:
    # 0.4 s a request, less than its prefill) leaves the batch free: full = alone, per_seq = 0.
    def terms(e):  # base, per_seq, prefill, slots
        return e.base_s, e.per_seq_s, e.prefill_s_per_token, e.slots

    engine = fit_engine([0.3, 0.1, 1.0], 1.0, 10, 4, 2)
    assert terms(engine) == pytest.approx((0.5, 0.5, 0.1, 2))
    assert terms(fit_engine([0.3, 0.1, 1.0], 10.0, 10, 4, 2)) == pytest.approx((1.0, 0.0, 0.1, 2))
    # Iterations: 1.0 s alone, 1.5 s two, + 1 s for each 10-token prompt starting. At 2 req/s, A
    # (4 tokens) and B (2) arrive at 0, C (1) and E (2) at 1 s, D (2) at 30.25 s, after the engine
    # went idle. FCFS: A+B 0-3.5, 3.5-5 B ends; C then E waited: A+C 5-7.5 C ends, A+E 7.5-10 A
    # ends, E 10-11; D 30.25-33.25. Latency per token: A 10/4, B 5/2, C 6.5/1, E 10/2, D 3/2; mean
    # 18/5 = 3.6. SRPT: A+B 0-3.5 (A 3 left, B 1); B and C (1 left) beat E (2) and A (3): 3.5-6 B
    # and C end; E+A 6-8.5, 8.5-10 E ends, A 10-11; D as before. A 11/4, B 6/2, C 5/1, E 9/2, D 3/2;
    # mean 16.75/5 = 3.35. Both: 11 tokens by 33.25 s.
    requests = [{"arrival_s": a, "prompt_len": 10, "output_len": o}
                for a, o in ((0, 4), (0, 2), (2, 1), (2, 2), (60.5, 2))]
    fcfs, srpt = (simulate(requests, 2.0, engine, p) for p in ("fcfs", "srpt"))
    assert fcfs.norm_latency == pytest.approx([2.5, 2.5, 6.5, 5.0, 1.5])
    assert srpt.norm_latency == pytest.approx([2.75, 3.0, 5.0, 4.5, 1.5])
    assert fcfs.tokens_per_s == srpt.tokens_per_s == pytest.approx(11 / 33.25)
    # A and B alone, both at 0: no wait for an arrival, so every time scales with the engine's
    # speed. FCFS: B ends at 5 (5/2), A at 7 (7/4): mean 2.125 x the factor; a measured 2.55
    # calls for 1.2; 0.5 and 6.0 need a factor outside 0.5-2.0x: none.
    pair = requests[:2]
    assert calibrate_speed(pair, 2.0, engine, 2.55) == pytest.approx(1.2, rel=1e-3)
    assert calibrate_speed(pair, 2.0, engine, 0.5) is None and calibrate_speed(pair, 2.0, engine, 6.0) is None


class FakeEngine:
    """An engine process that answers every phase at once and records what it was asked."""

    asked: list[tuple[str, dict]] = []

    def __init__(self, policy: str, spec: dict, folder) -> None:
        self.policy, self.info, self.rounds = policy, {"num_kv_blocks": 100}, 0
        assert "authkey" in spec and spec["max_num_seqs"] == 4

    def ask(self, command: dict) -> dict:
        FakeEngine.asked.append((self.policy, command))
        if command["do"] == "calibrate":
            self.rounds += 1  # the machine slows: each round measures a lower capacity
            return {"probe_tokens_per_s": 100.0 / self.rounds, "measured_capacity_req_s": 10.0 / self.rounds}
        if command["do"] == "bursts":
            return {"bursts": {"64": [0, 1]}}
        return {"rate_req_s": command["load"] * command["capacity_req_s"], "results": []}

    def close(self) -> None:
        pass

    def logs(self):
        return [], []


def test_engines_take_turns_at_every_phase_and_each_round_loads_against_its_own_calibration(monkeypatch):
    from rlweave.benchmarks import serving

    monkeypatch.setattr(serving, "EngineProcess", FakeEngine)
    FakeEngine.asked = []
    levels = [{"load": 0.2, "requests": 5}, {"load": 0.95, "requests": 10}]
    runs = serving.interleaved_runs(["fcfs", "rlweave"], {"max_num_seqs": 4, "workload": []}, levels, 2)
    phases = [(p, c["do"], c.get("load")) for p, c in FakeEngine.asked]
    assert phases == [("fcfs", "calibrate", None), ("rlweave", "calibrate", None),
                      ("fcfs", "level", 0.2), ("rlweave", "level", 0.2),
                      ("fcfs", "level", 0.95), ("rlweave", "level", 0.95), ("rlweave", "bursts", None),
                      # the second round starts with the other engine
                      ("rlweave", "calibrate", None), ("fcfs", "calibrate", None),
                      ("rlweave", "level", 0.2), ("fcfs", "level", 0.2),
                      ("rlweave", "level", 0.95), ("fcfs", "level", 0.95), ("rlweave", "bursts", None)]
    assert [r["capacity_req_s"] for r in runs["rlweave"]] == [10.0, 5.0]  # the round's FCFS probe
    assert runs["rlweave"][1]["levels"]["0.95"] == {"rate_req_s": 0.95 * 5.0, "results": [], "name": "r1-load0.95"}
    assert runs["rlweave"][0]["bursts"] == {"64": [0, 1]} and runs["fcfs"][0]["bursts"] == {}


def test_the_vllm_client_heavy_workload_without_pandas_is_refused_with_the_fix(tmp_path, monkeypatch):
    import importlib.util

    from rlweave.benchmarks import serving_client

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pandas" else real(name, *a))
    with pytest.raises(RuntimeError, match="pip install pandas"):
        serving_client.dataset_args("heavy", tmp_path, 8, 0)
    args, mean_out = serving_client.dataset_args("near-uniform", tmp_path, 8, 0)  # needs none
    assert "random" in args and mean_out == 96.0
