"""``rlweave bench plan``'s readers of stored runs (``benchmarks/plan_readers.py``): each plans
the run from its own stored inputs and sets the prediction beside the measured ratio; a plugin
with no stored run says so, and why."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

from rlweave.benchmarks.plan import PLUGINS, run
from rlweave.benchmarks.fusion_executor import ACTOR_PP
from rlweave.benchmarks.plan_readers import (NOT_READ, READS, fusion_executor_rows, moe_rows, resilience_rows,
                                             stream_rows)
from rlweave.benchmarks.stream import ASYNC_DISAGG, ONPOLICY_DISAGG, stored_predictions
from rlweave.plan.training import expert_balance_speedup, lost_share, pipeline_fusion
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, StageCosts

# Runs on the CPU rig, kept beside the tests (bench-results/ is ignored): `rlweave bench stream
# --workload long` with the two disaggregated runs (one round, and two rounds an hour later),
# `rlweave bench fusion-executor`, `rlweave bench moe` cut to its measured part, and `rlweave bench
# resilience` cut to its ETTR part.
DATA = Path(__file__).resolve().parent / "data"


def _fusion_record(actor: list[list[float]], critic: list[list[float]], speedup: float) -> dict:
    settings = {"critic_pp": 2, "micro_batches": 4, "repeats": 6, "warmup": 2, "batch": 8, "seq": 128,
                "layers_per_stage": 2, "seed": 0}
    return {"benchmark": "fusion-executor", "argv": [], "headline": {"speedup": speedup},
            "details": {"settings": settings, "costs": {"actor": actor, "critic": critic}}}


def test_fusion_executor_is_planned_on_its_measured_stage_costs():
    """Uniform costs worked by hand: two stages, four micro-batches, forward 1 and backward 2 on
    every stage of both models. Separate 1F1B: the actor's 1F1B takes (4 + 2 - 1) x 3 = 15, its
    stage on device 1 done at 13 and on device 0 at 15; the critic, placed in reverse, starts its
    first stage on device 1 at 13, and its own 1F1B of 15 runs a second late behind device 0:
    29. Fused, each device holds 2 models x 4 x 3 = 24 of work, which the search reaches: the
    plan is 29 / 24."""
    record = _fusion_record([[1.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 2.0]], speedup=1.1)
    uniform = FusedPipelineProblem(ACTOR_PP, 2, 4, 4, StageCosts((1.0, 1.0), (2.0, 2.0)),
                                   StageCosts((1.0, 1.0), (2.0, 2.0)))
    fused = pipeline_fusion(uniform)
    assert fused.separate_1f1b_s == pytest.approx(29.0) and fused.fused_s == pytest.approx(24.0)
    (row,) = fusion_executor_rows(record, "stored.json")
    assert row["predicted"] == pytest.approx(fused.speedup)
    assert row["plugin"] == "stage_fusion" and row["kind"] == "cpu" and row["label"] == "SIMULATED"
    assert row["measured"] == 1.1 and row["error"] == pytest.approx(abs(row["predicted"] / 1.1 - 1))
    assert row["predicted"] == pytest.approx(29 / 24)
    # the costs are read: a critic twice as slow leaves less of its bubble to fill relative to the step
    slow = fusion_executor_rows(_fusion_record([[1.0, 1.0], [2.0, 2.0]], [[2.0, 2.0], [4.0, 4.0]], 1.1), "s")[0]
    assert slow["predicted"] != pytest.approx(row["predicted"])


def test_moe_is_planned_on_its_busiest_ranks_tokens():
    """The MoE layer's time is its busiest rank's tokens: max/mean 1.5 before and 1.2 after is
    1.25x on the layer; with the layer half of the step, 1 / (0.5 + 0.5 x 0.8) = 1.111x."""
    assert expert_balance_speedup(1.5, 1.2) == pytest.approx(1.25)
    assert expert_balance_speedup(1.5, 1.2, moe_share=0.5) == pytest.approx(1 / 0.9)
    record = {"benchmark": "moe", "headline": {}, "details": {"measured_ep2": {
        "max_mean_rank_tokens": {"static": 1.5, "rlweave": 1.2}, "speedup": 1.1}}}
    (row,) = moe_rows(record, "moe.json")
    assert row["plugin"] == "replay_balance" and row["label"] == "MODELLED" and row["predicted"] == pytest.approx(1.25)
    assert row["measured"] == 1.1 and row["error"] == pytest.approx(1.25 / 1.1 - 1)
    assert moe_rows({"benchmark": "moe", "headline": {}, "details": {"measured_ep2": None}}, "moe.json") == []


SETUP = {"prompts": 4, "group": 2, "minibatch": 1, "slots": 4, "max_len": 16}
LENGTHS = [[4, 6], [16, 2], [3, 3], [8, 12], [5, 5], [2, 9]]


def _run(step_s: float, gen: float, train: float, push: float = 0.0) -> dict:
    stages = {"reward": 0.05, "old_log_prob": train * 0.3, "ref": 0.0, "adv": 0.01, "update_actor": train * 0.7,
              "gen": gen, "update_weights": 0.1}
    return {"step_s": step_s, "samples_per_s": 8 / step_s, "stage_s": stages, "dispatch_s": 0.05,
            "delivery_s": 0.02, "rollout_push_s": push, "streamed_updates_per_step": 0.0}


def _stream_record() -> dict:
    runs = {"verl sync": _run(3.0, 1.6, 1.0), ONPOLICY_DISAGG: _run(2.2, 1.8, 1.1, push=0.1),
            ASYNC_DISAGG: _run(1.7, 1.9, 1.2, push=0.1)}
    profile = {str(b): 10.0 * b / (1 + 0.2 * b) for b in range(1, 5)}  # JSON keys are strings
    return {"benchmark": "stream", "argv": ["--seed", "0"], "headline": {},
            "details": {"rounds": [runs, runs], "planner_rounds": [{"engine_tokens_per_s": profile}] * 2,
                        "lengths": LENGTHS, "setup": SETUP}}


def test_stream_is_planned_from_each_rounds_stored_inputs():
    record = _stream_record()
    rows = {r["case"]: r for r in stream_rows(record, "stream.json")}
    assert set(rows) == {f"stream: verl sync over {label}" for label in (ONPOLICY_DISAGG, ASYNC_DISAGG)}
    runs = record["details"]["rounds"][0]
    steps = stored_predictions(record["details"]["planner_rounds"][0]["engine_tokens_per_s"], runs, LENGTHS, SETUP, 0)
    assert steps["verl sync"] > 0 and set(steps) >= {"verl sync", ONPOLICY_DISAGG, ASYNC_DISAGG}
    for label in (ONPOLICY_DISAGG, ASYNC_DISAGG):
        r = rows[f"stream: verl sync over {label}"]
        assert r["plugin"] == "stream_generation" and r["measured"] == pytest.approx(3.0 / runs[label]["step_s"])
        assert r["predicted"] == pytest.approx(steps["verl sync"] / steps[label])
    # the stored engine profile is what the planner runs on: a slower engine moves the prediction
    slow = _stream_record()
    for check in slow["details"]["planner_rounds"]:
        check["engine_tokens_per_s"] = {b: t / 3 for b, t in check["engine_tokens_per_s"].items()}
    moved = {r["case"]: r["predicted"] for r in stream_rows(slow, "stream.json")}
    assert any(moved[c] != pytest.approx(r["predicted"]) for c, r in rows.items())


def test_every_plugin_is_compared_or_says_why_not(tmp_path):
    (tmp_path / "fusion-executor.json").write_text(json.dumps(_fusion_record([[1.0, 1.0], [2.0, 2.0]],
                                                                             [[1.0, 1.0], [2.0, 2.0]], 1.1)))
    (tmp_path / "stream.json").write_text(json.dumps(_stream_record()))
    h = run(argparse.Namespace(results=str(tmp_path))).headline
    assert set(h["error_per_plugin"]) == {"stage_fusion", "stream_generation"}
    assert set(h["error_per_plugin"]) | set(h["not_compared"]) == set(PLUGINS)
    assert "no stored bench agentic run" in h["not_compared"]["agentic_rollout"]
    assert "no stored bench resilience run" in h["not_compared"]["resilience"]
    for plugin, why in NOT_READ.items():
        assert h["not_compared"][plugin] == why and plugin not in READS.values()
    assert h["max_planner_error_cpu"] == max(h["error_per_plugin"].values())


@pytest.mark.parametrize("name", ["bench-stream-long.json", "bench-stream-long-2rounds.json"])
def test_the_stored_stream_run_is_replanned_exactly_as_the_bench_planned_it(name):
    """The stored inputs are enough: re-run from the JSON, StreamRL's planner gives each run's
    step the bench itself predicted at run time (from the verl sync run's spans), every round."""
    record = json.loads((DATA / name).read_text())
    d = record["details"]
    for runs, check in zip(d["rounds"], d["planner_rounds"], strict=True):
        steps = stored_predictions(check["engine_tokens_per_s"], runs, d["lengths"], d["setup"], 0)
        for label, step in check["predicted_step_s"].items():
            assert steps[label] == pytest.approx(step, rel=1e-12), label
    rows = stream_rows(record, "stream.json")
    labels = (ONPOLICY_DISAGG, ASYNC_DISAGG)
    assert {r["case"] for r in rows} == {f"stream: verl sync over {label}" for label in labels}
    for r in rows:  # the median over the rounds of the ratio within each, as the bench's headline gives it
        label = r["case"].split(" over ", 1)[1]
        ratios = [runs[label]["samples_per_s"] / runs["verl sync"]["samples_per_s"] for runs in d["rounds"]]
        assert r["measured"] == pytest.approx(statistics.median(ratios))


def test_the_stored_fusion_executor_run_is_planned_on_the_costs_the_bench_simulated():
    record = json.loads((DATA / "bench-fusion-executor.json").read_text())
    d = record["details"]
    m = d["settings"]["micro_batches"]
    actor, critic = (StageCosts(*map(tuple, d["costs"][model])) for model in ("actor", "critic"))
    problem = FusedPipelineProblem(ACTOR_PP, d["settings"]["critic_pp"], m, m, actor, critic)
    fused = pipeline_fusion(problem)
    assert fused.separate_1f1b_s == pytest.approx(d["predicted"]["separate_1f1b"], rel=1e-12)
    assert fused.fused_s <= d["predicted"]["fused"] * (1 + 1e-9)  # the planner's search does no worse than the bench's
    (row,) = fusion_executor_rows(record, "fusion-executor.json")
    assert row["predicted"] == pytest.approx(fused.speedup) and row["measured"] == record["headline"]["speedup"]


def test_the_stored_moe_run_is_planned_on_the_loads_its_ranks_counted():
    """`rlweave bench moe --json`'s record, cut to the measured part bench plan reads."""
    record = json.loads((DATA / "bench-moe-measured.json").read_text())
    measured = record["details"]["measured_ep2"]
    (row,) = moe_rows(record, "moe.json")
    imbalance = measured["max_mean_rank_tokens"]
    assert imbalance["static"] > imbalance["rlweave"] >= 1.0  # the skewed routing, then balanced by the plans
    assert row["predicted"] == pytest.approx(imbalance["static"] / imbalance["rlweave"])
    assert row["measured"] == measured["speedup"]


def test_resilience_model_takes_a_given_save_interval_or_youngs():
    """Saving 0.5 s every 10 s, a 20 s restart and a failure every 200 s of work: 0.5 / 10 +
    (20 + 10 / 2) / 200 = 0.175 lost. Without an interval, Young's sqrt(2 x 0.5 x 200) = 14.14 s:
    0.5 / 14.14 + (20 + 7.07) / 200 = 0.1707 (less: Young's is the optimum)."""
    assert lost_share(0.5, 20.0, 200.0, 2.0, 10.0) == pytest.approx((0.175, 10.0))
    lost, tau = lost_share(0.5, 20.0, 200.0, 2.0)
    assert tau == pytest.approx(200 ** 0.5) and lost == pytest.approx(0.5 / tau + (20 + tau / 2) / 200)
    assert lost == pytest.approx(0.17071, abs=1e-5)


def _ettr_side(ettr: float, restarts: list[float | None], checkpoints: list[float], snapshots: list[float]) -> dict:
    return {"ettr": ettr, "clean_step_s": [2.4, 2.6], "costs": {"restart_s": restarts, "step_s": 2.55,
            "save_checkpoint_s": checkpoints, "snapshot_s": snapshots}}


def test_resilience_is_planned_on_each_sides_own_faults_and_saves():
    """A fault every 240 s, clean step 2.5 s (the mean of the two beside the side), save_freq 5.
    rlweave: a snapshot every step (2.5 s) stalling its 5 ms plus a fifth of verl's 0.5 s
    checkpoint, restarts 17 and 19 s: 0.105 / 2.5 + (18 + 1.25) / 240 = 0.12221, ETTR 0.89110.
    verl: its checkpoint every 12.5 s, restarts 120 and 130 s (a fault with none is left out):
    0.5 / 12.5 + (125 + 6.25) / 240 = 0.58688, ETTR 0.63017."""
    record = {"benchmark": "resilience", "headline": {}, "details": {"args": {"save_freq": 5}, "parts": {"ettr": {
        "fault_every_s": 240.0, "window_s": 480.0,
        "rlweave": _ettr_side(0.85, [17.0, 19.0], [0.5, 0.5], [0.004, 0.005, 0.006]),
        "verl": _ettr_side(0.5, [120.0, None, 130.0], [0.4, 0.5, 0.6], [])}}}}
    rlweave, verl, ratio = resilience_rows(record, "resilience.json")
    assert rlweave["plugin"] == "resilience" and rlweave["label"] == "MODELLED"
    assert rlweave["predicted"] == pytest.approx(0.89110, abs=1e-5) and rlweave["measured"] == 0.85
    assert verl["predicted"] == pytest.approx(0.63017, abs=1e-5)
    assert verl["error"] == pytest.approx(0.63017 / 0.5 - 1, abs=1e-4)
    assert ratio["predicted"] == pytest.approx(0.89110 / 0.63017, abs=1e-4) and ratio["measured"] == pytest.approx(1.7)
    assert resilience_rows({"benchmark": "resilience", "details": {"parts": {}}}, "faults-only.json") == []


def test_the_stored_resilience_run_is_planned_on_its_own_faults_and_saves():
    """`rlweave bench resilience --parts ettr --fault-every-s 240 --ettr-window-s 480`'s record,
    cut to its ETTR part: each side planned on its own clean step, restarts and saves (figures
    pinned from the stored inputs), against the ETTR measured over the window."""
    record = json.loads((DATA / "bench-resilience-ettr.json").read_text())
    ettr = record["details"]["parts"]["ettr"]
    rlweave, verl, ratio = resilience_rows(record, "resilience.json")
    assert rlweave["predicted"] == pytest.approx(0.9347, abs=1e-4)
    assert verl["predicted"] == pytest.approx(0.7062, abs=1e-4)
    assert rlweave["measured"] == ettr["rlweave"]["ettr"] and verl["measured"] == ettr["verl"]["ettr"]
    assert ratio["measured"] == pytest.approx(ettr["rlweave"]["ettr"] / ettr["verl"]["ettr"])
    assert all(r is not None for side in ("rlweave", "verl") for r in ettr[side]["costs"]["restart_s"])
