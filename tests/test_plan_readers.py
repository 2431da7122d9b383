"""``rlweave bench plan``'s readers of stored runs (``benchmarks/plan_readers.py``): each plans
the run from its own stored inputs and sets the prediction beside the measured ratio; a plugin
with no stored run says so, and why."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from rlweave.benchmarks.plan import PLUGINS, run
from rlweave.benchmarks.fusion_executor import ACTOR_PP
from rlweave.benchmarks.fusion_inter import FUSED, STREAM, VERL, VERL_FAST
from rlweave.benchmarks.plan_readers import (
    NOT_READ,
    READS,
    VERL_POLLS,
    fusion_executor_rows,
    fusion_inter_model,
    fusion_inter_rows,
    moe_rows,
    resilience_rows,
    serving_rows,
    stream_rows,
)
from rlweave.benchmarks.stream import ASYNC_DISAGG, ONPOLICY_DISAGG, stored_predictions
from rlweave.plan.generation import serve_open_loop
from rlweave.plan.inter_stage import InterStageSetup, generation_s, inter_stage_fusion, sequential_generation
from rlweave.plan.training import ettr_at, expert_balance_speedup, pipeline_fusion
from rlweave.plugins.stage_fusion.migration import InferenceCost, engine_cost
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, StageCosts
from rlweave.sim import EngineModel, Request
from rlweave.types import EngineInfo, RolloutInstance

# Runs on the CPU rig, kept beside the tests (bench-results/ is ignored): `rlweave bench stream
# --workload long` with the two disaggregated runs (one round, and two rounds an hour later),
# `rlweave bench fusion-executor`, `rlweave bench fusion-inter` (one round, contended runs only),
# `rlweave bench moe` cut to its measured part, and `rlweave bench resilience` cut to its ETTR part.
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


# one token a second whatever the batch; the first instance on the trainer's core (inference
# there runs twice as slow beside a decoding engine), the second beside it
SECOND = engine_cost(1.0, 0.0, 0.0)
HAND = InterStageSetup(SECOND, (RolloutInstance("shared", True, 8), RolloutInstance("free", False, 8)),
                       InferenceCost(1.0, shared_slowdown=2.0))


def test_the_tail_migration_model_on_a_case_worked_by_hand():
    """Two samples of 1 and 5 tokens, inferred 1 s each. verl: generation ends at 5 s, seen at
    the next poll (6 s at a 2 s poll, 5 s at 0.5 s), then its 0.5 s of inference. Streamed with
    the 5-token sample on the free instance: the shared core is idle from 1 s, the short one is
    inferred by 2 s, the long one by 6 s. With it on the shared core: its second token (1-2 s)
    began before the short one's inference; the third runs beside the inference's last half
    second (1 s at half speed from 1 s) and takes 1.5 s; the last two end at 5.5 s, inferred by
    6.5 s. The plugin migrates the tail (threshold 1) when the short sample ends at 1 s: the long
    one goes on on the free instance, done at 5 s and inferred by 6 s in either dispatch."""
    assert generation_s([1, 5], HAND.instances, SECOND) == pytest.approx(5.0)
    model = inter_stage_fusion([[1, 5], [1, 5]], HAND)
    assert model.thresholds == (1,) and model.fused_s == pytest.approx((6.0,))
    halves = 16 * (model.streamed_mean_s - 6.0)  # each of the 8 dispatch orders gives 6 s or 6.5 s
    assert 0 < halves <= 8 and halves == pytest.approx(round(halves))
    verl = sequential_generation([[1, 5], [1, 5]], HAND.instances, SECOND)
    assert verl.generation_s == pytest.approx((5.0,))
    assert verl.stage_s(0.5, poll_s=2.0) == pytest.approx(6.5)
    assert verl.stage_s(0.5, poll_s=0.5) == pytest.approx(5.5)
    # verl on its own engine, twice as fast: 2.5 s of generation, seen at the 0.5 s poll at 2.5 s
    faster = sequential_generation([[1, 5], [1, 5]], HAND.instances, engine_cost(0.5, 0.0, 0.0))
    assert faster.stage_s(0.5, poll_s=0.5) == pytest.approx(3.0)
    # The plan comes from the step before: two 5-token samples end together, nothing to migrate,
    # so the next step streams without a plan.
    unplanned = inter_stage_fusion([[5, 5], [1, 5]], HAND)
    assert unplanned.thresholds == (0,) and unplanned.fused_s == unplanned.streamed_s


def _fusion_inter_record(verl_stage: float = 1.2) -> dict:
    cost = {"decode_base_ms": 10.0, "decode_per_seq_ms": 2.0, "prefill_us_per_token": 50.0}
    verl_cost = {"decode_base_ms": 8.0, "decode_per_seq_ms": 1.0, "prefill_us_per_token": 40.0}
    runs = {VERL: {"stage_s": verl_stage, "inference_s": 0.3, "cost_model": verl_cost},
            VERL_FAST: {"stage_s": 0.6, "inference_s": 0.25, "cost_model": dict(verl_cost)},
            STREAM: {"stage_s": 0.7, "cost_model": cost},
            FUSED: {"stage_s": 0.5, "inference_s_per_sample": 0.05, "inference_s_per_sample_shared": 0.08,
                    "prompt_len": 20.0}}
    return {"benchmark": "fusion-inter", "argv": ["--repeats", "1"], "headline": {},
            "details": {"rounds": [runs], "lengths": [[n] for n in (4, 30, 6, 2, 16, 3, 8, 5)],
                        "setup": {"prompts": 4, "minibatch": 8, "slots": 2, "max_len": 30}}}


def test_fusion_inter_is_planned_from_each_rounds_stored_inputs():
    record = _fusion_inter_record()
    runs = record["details"]["rounds"][0]
    model, verl = fusion_inter_model(runs, [4, 30, 6, 2, 16, 3, 8, 5], prompts=4, slots=2, seed=0)
    rows = {r["case"].split(": ", 1)[1].split(" over ")[0]: r for r in fusion_inter_rows(record, "fi.json")}
    assert set(rows) == {VERL, VERL_FAST, STREAM} and set(verl) == {VERL, VERL_FAST}
    for label, poll in VERL_POLLS.items():
        assert rows[label]["predicted"] == pytest.approx(verl[label].stage_s(runs[label]["inference_s"], poll)
                                                         / model.fused_mean_s)
        assert rows[label]["measured"] == pytest.approx(runs[label]["stage_s"] / 0.5)
    assert rows[STREAM]["predicted"] == pytest.approx(model.streamed_mean_s / model.fused_mean_s)
    assert all(r["plugin"] == "stage_fusion" and r["label"] == "SIMULATED" for r in rows.values())
    # the 2 s poll rounds verl's generation (tens of milliseconds here) up to 2 s
    assert rows[VERL]["predicted"] > rows[VERL_FAST]["predicted"]
    # the stored engine cost is what it plans on: a slower engine moves the prediction
    slow = _fusion_inter_record()
    slow["details"]["rounds"][0][STREAM]["cost_model"]["decode_base_ms"] = 40.0
    moved = {r["case"]: r["predicted"] for r in fusion_inter_rows(slow, "fi.json")}
    assert all(moved[r["case"]] != pytest.approx(r["predicted"]) for r in rows.values())


SETUP = {"prompts": 4, "group": 2, "minibatch": 1, "slots": 4, "max_len": 16}
LENGTHS = [[4, 6], [16, 2], [3, 3], [8, 12], [5, 5], [2, 9]]


def _run(step_s: float, gen: float, train: float, push: float = 0.0) -> dict:
    stages = {"reward": 0.05, "old_log_prob": train * 0.3, "ref": 0.0, "adv": 0.01, "update_actor": train * 0.7,
              "gen": gen, "update_weights": 0.1}
    return {"step_s": step_s, "samples_per_s": 8 / step_s, "stage_s": stages, "dispatch_s": 0.05,
            "delivery_s": 0.02, "rollout_push_s": push, "streamed_updates_per_step": 0.0,
            "idle": {"actor": 0.5, "engine ab50": 1 - gen / step_s}}


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
    # the engine runs at the verl sync run's measured busy time: a busier engine moves the
    # prediction, and the stored profile gives only its shape (a third of its level changes nothing)
    busy = _stream_record()
    for runs in busy["details"]["rounds"]:
        runs["verl sync"] = dict(runs["verl sync"], idle={"actor": 0.5, "engine ab50": 0.1})
    moved = {r["case"]: r["predicted"] for r in stream_rows(busy, "stream.json")}
    assert any(moved[c] != pytest.approx(r["predicted"]) for c, r in rows.items())
    slow = _stream_record()
    for check in slow["details"]["planner_rounds"]:
        check["engine_tokens_per_s"] = {b: t / 3 for b, t in check["engine_tokens_per_s"].items()}
    same = {r["case"]: r["predicted"] for r in stream_rows(slow, "stream.json")}
    assert all(same[c] == pytest.approx(r["predicted"]) for c, r in rows.items())


def _fusion_inter_predicted(record: dict) -> dict[str, float]:
    return {r["case"].split(": ", 1)[1].split(" over ")[0]: r["predicted"] for r in fusion_inter_rows(record, "fi.json")}


def test_fusion_inter_plans_each_verl_run_on_its_own_engine():
    """verl's generation runs on its own run's fitted cost, the plugin's stages on the stream
    run's. Five of the eight lengths are 30 tokens, so every step of four holds one; the four fit
    the 2 x 2 slots at once and end after 30 iterations. The 50 ms poll's run given 50 ms an
    iteration whatever the batch: 1.5 s (a poll lands then) plus its measured 0.25 s of
    inference; the 2 s poll's given 100 ms: 3 s, seen at the 4 s poll, plus 0.3 s. Each over the
    same fused stage; the stream row does not move. A new cost for the stream run moves the fused
    stage, not verl's."""
    record = _fusion_inter_record()
    record["details"]["lengths"] = [[n] for n in (4, 30, 6, 30, 30, 3, 30, 30)]
    lengths, runs = [n for n, in record["details"]["lengths"]], record["details"]["rounds"][0]
    before = _fusion_inter_predicted(record)
    runs[VERL_FAST]["cost_model"] = {"decode_base_ms": 50.0, "decode_per_seq_ms": 0.0, "prefill_us_per_token": 0.0}
    runs[VERL]["cost_model"] = {"decode_base_ms": 100.0, "decode_per_seq_ms": 0.0, "prefill_us_per_token": 0.0}
    after = _fusion_inter_predicted(record)
    fused_s = fusion_inter_model(runs, lengths, prompts=4, slots=2, seed=0)[0].fused_mean_s
    assert after[VERL_FAST] == pytest.approx((1.5 + 0.25) / fused_s)
    assert after[VERL] == pytest.approx((4.0 + 0.3) / fused_s)
    assert after[STREAM] == pytest.approx(before[STREAM]) and after[VERL] != pytest.approx(before[VERL])
    runs[STREAM]["cost_model"] = {"decode_base_ms": 20.0, "decode_per_seq_ms": 1.0, "prefill_us_per_token": 10.0}
    slower = _fusion_inter_predicted(record)
    fused_slower_s = fusion_inter_model(runs, lengths, prompts=4, slots=2, seed=0)[0].fused_mean_s
    assert fused_slower_s > fused_s
    assert slower[VERL_FAST] == pytest.approx((1.5 + 0.25) / fused_slower_s)


def test_every_plugin_is_compared_or_says_why_not(tmp_path):
    (tmp_path / "fusion-executor.json").write_text(json.dumps(_fusion_record([[1.0, 1.0], [2.0, 2.0]],
                                                                             [[1.0, 1.0], [2.0, 2.0]], 1.1)))
    (tmp_path / "stream.json").write_text(json.dumps(_stream_record()))
    (tmp_path / "fusion-inter.json").write_text(json.dumps(_fusion_inter_record(verl_stage=3.0)))
    result = run(argparse.Namespace(results=str(tmp_path)))
    h = result.headline
    assert set(h["error_per_plugin"]) == {"stage_fusion", "stream_generation"}
    # stage fusion has two readers: its error is the worse of their rows
    fusion = [r for r in result.details["rows"] if r["plugin"] == "stage_fusion"]
    assert {r["case"].split(":")[0] for r in fusion} == {"fusion-executor", "fusion-inter"}
    assert h["error_per_plugin"]["stage_fusion"] == max(r["error"] for r in fusion)
    assert set(h["error_per_plugin"]) | set(h["not_compared"]) == set(PLUGINS)
    assert "no stored bench agentic run" in h["not_compared"]["agentic_rollout"]
    assert "no stored bench resilience run" in h["not_compared"]["resilience"]
    for plugin, why in NOT_READ.items():
        assert h["not_compared"][plugin] == why and plugin not in READS.values()
    assert h["max_planner_error_cpu"] == max(h["error_per_plugin"].values())


# Each round's predicted steps (s): the engine at the verl sync run's measured busy time, and
# verl sync taking its batch at its replay buffer's 2-s poll. Measured: 2.483, 2.220, 3.357 (one
# round); 2.880, 2.643, 4.676 and 2.830, 2.378, 4.250 (two rounds). The bench itself predicted
# the disaggregated runs 15 to 26% short before (its JSON's planner_rounds).
STORED_STEPS = {
    "bench-stream-long.json": [(2.219, 1.994, 3.441)],
    "bench-stream-long-2rounds.json": [(2.814, 2.434, 4.488), (2.516, 2.281, 3.968)],
}


@pytest.mark.parametrize("name", sorted(STORED_STEPS))
def test_the_stored_stream_run_is_replanned_from_its_json(name):
    """The stored inputs are enough: re-run from the JSON, StreamRL's planner gives each run's
    step, every round, and the ratio compared is the median over the rounds."""
    record = json.loads((DATA / name).read_text())
    d = record["details"]
    for runs, check, pinned in zip(d["rounds"], d["planner_rounds"], STORED_STEPS[name], strict=True):
        steps = stored_predictions(check["engine_tokens_per_s"], runs, d["lengths"], d["setup"], 0)
        assert [steps[label] for label in (ONPOLICY_DISAGG, ASYNC_DISAGG, "verl sync")] == pytest.approx(pinned, abs=6e-4)
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


def test_requests_arriving_over_time_under_fcfs_and_the_plugins_own_policies():
    """Worked by hand: one slot, every iteration 1 s, no prompt; A (4 tokens) arrives at 0, B (1)
    at 1, C (2) at 1.5. FCFS: A 0-4, B 4-5, C 5-7. rlweave's adaptive policy, its length model
    warm and every cap a length (ignore_eos), ranks by tokens left: at 1 B (1 left) preempts A
    (3 left), which keeps its KV; at 2 C (2) goes before A (3); A resumes at 4 and ends at 7.
    FastServe's MLFQ, quantum one iteration (the shortest measured): A keeps its slot at 1 (1 s
    attained, within level 0's quantum), is demoted at 2 and preempted by B (level 0, entered
    at 1), then C (level 0) runs 3-5 and A 5-7. Mean normalised latency: FCFS (4/4 + 4/1 +
    5.5/2) / 3 = 2.583, adaptive (7/4 + 1/1 + 2.5/2) / 3 = 1.333."""
    engine = EngineModel(base_s=1.0, slots=1)
    info = EngineInfo("vllm", "0", 1, 0, 1000, 16, can_preempt=True, keeps_preempted_kv=True)
    requests = [Request(0, 0.0, 4), Request(1, 1.0, 1), Request(2, 1.5, 2)]
    history = [4, 1, 2, 8] * 8  # 32 lengths, each at its cap: enough for the length model
    finish = {p: serve_open_loop(requests, engine, p, info, history).tolist() for p in ("fcfs", "rlweave", "fastserve")}
    assert finish == {"fcfs": [4.0, 5.0, 7.0], "rlweave": [7.0, 2.0, 4.0], "fastserve": [7.0, 3.0, 5.0]}
    arrival, tokens = np.array([0.0, 1.0, 1.5]), np.array([4, 1, 2])
    norm = {p: float(np.mean((np.array(f) - arrival) / tokens)) for p, f in finish.items()}
    assert norm["fcfs"] == pytest.approx(31 / 12) and norm["rlweave"] == pytest.approx(4 / 3)
    # before its length model is warm (no history) the adaptive policy serves first come first served
    assert serve_open_loop(requests, engine, "rlweave", info).tolist() == finish["fcfs"]


def test_the_stored_serving_run_is_planned_on_its_own_requests_engine_and_rates():
    """`rlweave bench serving --policies fcfs,rlweave --repeats 2 --json` (2026-12-07, the CPU
    rig): per load, the median over its two rounds of FCFS's simulated mean normalised latency
    over the plugin's own adaptive scheduler's, each on its own engine's model that round
    (requests alone, their fixed cost outside the iterations, and that engine's probe), against
    the ratio the run measured. Pinned: 0.970, 1.094, 1.907 and 5.760 SIMULATED against 0.923,
    1.015, 3.258 and 8.689 measured (error up to 0.415, at 0.8: the goal of 0.15 is not met)."""
    record = json.loads((DATA / "bench-serving.json").read_text())
    levels = record["details"]["levels"]
    rows = {r["case"].rsplit(" ", 1)[1]: r for r in serving_rows(record, "serving.json")}
    assert set(rows) == set(levels) == {"0.2", "0.5", "0.8", "0.95"}
    pinned = {"0.2": 0.970339, "0.5": 1.093643, "0.8": 1.907104, "0.95": 5.759989}
    for load, r in rows.items():
        assert r["plugin"] == "preemptive_serving" and r["label"] == "SIMULATED"
        assert r["measured"] == levels[load]["rlweave"]["vs_fcfs"]["mean_norm_latency_s"]["median"]
        assert r["predicted"] == pytest.approx(pinned[load], rel=1e-5)
    assert max(r["error"] for r in rows.values()) == pytest.approx(1 - 1.907104 / 3.25776, rel=1e-4)

    def moved(policy: str) -> dict[str, float]:  # each predicted ratio with that engine's probes 10% slower
        slow = json.loads((DATA / "bench-serving.json").read_text())
        probes = slow["details"]["calibration_tokens_per_s"]
        probes[policy] = [t * 0.9 for t in probes[policy]]
        return {r["case"].rsplit(" ", 1)[1]: r["predicted"] for r in serving_rows(slow, "serving.json")}

    # each policy runs on its own engine: a slower FCFS engine queues more, a slower rlweave engine
    # serves rlweave's requests more slowly
    assert moved("fcfs")["0.95"] > rows["0.95"]["predicted"] > moved("rlweave")["0.95"]
    slow = json.loads((DATA / "bench-serving.json").read_text())
    del slow["details"]["block_size"]  # recorded before the run kept it: nothing to plan from
    assert serving_rows(slow, "serving.json") == []


def test_the_stored_fusion_inter_run_is_planned_on_its_own_inputs():
    """`rlweave bench fusion-inter --repeats 1 --no-uncontended --json` (2026-12-08, one round,
    8.5 min): verl's stage, its generation on its own run's fitted engine cost to the next poll
    and its measured inference, over the plugin's fused stage on the stream run's cost. The 2 s
    poll's row misses most (0.104): its generation, 1.3 to 1.6 s simulated, ends before the first
    poll in every step, while the run measured 2.43 s a step to the poll that saw it."""
    record = json.loads((DATA / "bench-fusion-inter.json").read_text())
    runs = record["details"]["rounds"][0]
    rows = {r["case"].split(": ", 1)[1].split(" over ")[0]: r for r in fusion_inter_rows(record, "fi.json")}
    for label, predicted in ((VERL, 1.82841), (VERL_FAST, 1.23662), (STREAM, 1.25290)):
        assert rows[label]["predicted"] == pytest.approx(predicted, abs=5e-5), label
        assert rows[label]["measured"] == pytest.approx(runs[label]["stage_s"] / runs[FUSED]["stage_s"])
    assert rows[VERL]["measured"] == pytest.approx(record["headline"]["speedup"], abs=5e-4)
    assert rows[STREAM]["measured"] == pytest.approx(record["headline"]["speedup_vs_stream"], abs=5e-4)
    model, _ = fusion_inter_model(runs, [n for n, in record["details"]["lengths"]], 16, 4, 0)
    assert all(0 < t < 16 for t in model.thresholds)  # the plugin migrates every predicted step's tail


def test_the_two_round_fusion_inter_run_is_planned_round_by_round():
    """The same command with `--repeats 2` (2026-12-08, 16 min): each round planned on its own
    runs' costs, the median of the rounds' ratios against the median of the measured ones. Here
    streaming without migration misses most (0.160): its stage is simulated 7-14% long (1.87 and
    1.76 s against 1.64 and 1.66) while the fused one is 4-6% short."""
    record = json.loads((DATA / "bench-fusion-inter-2rounds.json").read_text())
    rounds = record["details"]["rounds"]
    rows = {r["case"].split(": ", 1)[1].split(" over ")[0]: r for r in fusion_inter_rows(record, "fi2.json")}
    for label, predicted in ((VERL, 1.66485), (VERL_FAST, 0.89448), (STREAM, 1.27074)):
        assert rows[label]["predicted"] == pytest.approx(predicted, abs=5e-5), label
        measured = sorted(r[label]["stage_s"] / r[FUSED]["stage_s"] for r in rounds)
        assert rows[label]["measured"] == pytest.approx(sum(measured) / 2)  # the median of two
    assert max(r["error"] for r in rows.values()) == pytest.approx(rows[STREAM]["error"])


def test_resilience_model_takes_a_given_save_interval_or_youngs():
    """Saving 0.5 s after every 10 s of work, a 20 s restart and a failure every 200 s of wall
    time: each failure costs 20 + 10 / 2 = 25 s, so (1 - 25 / 200) / (1 + 0.5 / 10) = 0.8333 of
    the wall time progresses. Without an interval, Young's sqrt(2 x 0.5 x 200) = 14.14 s:
    (1 - 27.07 / 200) / (1 + 0.5 / 14.14) = 0.8351 (more: Young's is the optimum). Failures
    faster than the recovery leave nothing."""
    assert ettr_at(0.5, 20.0, 200.0, 2.0, 10.0) == pytest.approx((0.833333, 10.0), abs=1e-6)
    ettr, tau = ettr_at(0.5, 20.0, 200.0, 2.0)
    assert tau == pytest.approx(200 ** 0.5) and ettr == pytest.approx(0.835119, abs=1e-6)
    assert ettr_at(0.5, 250.0, 200.0, 2.0, 10.0)[0] == 0.0


def _ettr_side(ettr: float, restarts: list[float | None], checkpoints: list[float], snapshots: list[float]) -> dict:
    return {"ettr": ettr, "clean_step_s": [2.4, 2.6], "costs": {"restart_s": restarts, "step_s": 2.55,
            "save_checkpoint_s": checkpoints, "snapshot_s": snapshots}}


def test_resilience_is_planned_on_each_sides_own_faults_and_saves():
    """A fault every 240 s, clean step 2.5 s (the mean of the two beside the side), save_freq 5.
    rlweave: a snapshot every step (2.5 s) stalling its 5 ms plus a fifth of verl's 0.5 s
    checkpoint, restarts 17 and 19 s: (1 - (18 + 1.25) / 240) / (1 + 0.105 / 2.5) = 0.88272.
    verl: its checkpoint every 12.5 s, restarts 120 and 130 s (a fault with none is left out):
    (1 - (125 + 6.25) / 240) / (1 + 0.5 / 12.5) = 0.43570."""
    record = {"benchmark": "resilience", "headline": {}, "details": {"args": {"save_freq": 5}, "parts": {"ettr": {
        "fault_every_s": 240.0, "window_s": 480.0,
        "rlweave": _ettr_side(0.85, [17.0, 19.0], [0.5, 0.5], [0.004, 0.005, 0.006]),
        "verl": _ettr_side(0.5, [120.0, None, 130.0], [0.4, 0.5, 0.6], [])}}}}
    rlweave, verl, ratio = resilience_rows(record, "resilience.json")
    assert rlweave["plugin"] == "resilience" and rlweave["label"] == "MODELLED"
    assert rlweave["predicted"] == pytest.approx(0.88272, abs=1e-5) and rlweave["measured"] == 0.85
    assert verl["predicted"] == pytest.approx(0.43570, abs=1e-5)
    assert verl["error"] == pytest.approx(1 - 0.43570 / 0.5, abs=1e-4)
    assert ratio["predicted"] == pytest.approx(0.88272 / 0.43570, abs=1e-4) and ratio["measured"] == pytest.approx(1.7)
    assert resilience_rows({"benchmark": "resilience", "details": {"parts": {}}}, "faults-only.json") == []


def test_the_stored_resilience_run_is_planned_on_its_own_faults_and_saves():
    """`rlweave bench resilience --parts ettr --fault-every-s 240 --ettr-window-s 480`'s record,
    cut to its ETTR part: each side planned on its own clean step, restarts and saves (figures
    pinned from the stored inputs), against the ETTR measured over the window."""
    record = json.loads((DATA / "bench-resilience-ettr.json").read_text())
    ettr = record["details"]["parts"]["ettr"]
    rlweave, verl, ratio = resilience_rows(record, "resilience.json")
    assert rlweave["predicted"] == pytest.approx(0.9304, abs=1e-4)
    assert verl["predicted"] == pytest.approx(0.5851, abs=1e-4)
    assert rlweave["measured"] == ettr["rlweave"]["ettr"] and verl["measured"] == ettr["verl"]["ettr"]
    assert ratio["measured"] == pytest.approx(ettr["rlweave"]["ettr"] / ettr["verl"]["ettr"])
    assert all(r is not None for side in ("rlweave", "verl") for r in ettr[side]["costs"]["restart_s"])
