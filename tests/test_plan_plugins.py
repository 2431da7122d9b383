"""Plan's per-plugin predictions: every plugin answers with a labelled figure beside its bound
and its settings, or says why it has none; the policies beside the oracle for agentic and
serving; a sensitivity line per plugin; the composable sets; 10,000 GPUs in under a minute."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from rlweave.plan import parse_cluster, predict_step
from rlweave.plan.command import main
from rlweave.plan.generation import predict_agentic, predict_serving, predict_stream
from rlweave.plan.plugins import SETS, plan_plugins
from rlweave.plan.prediction import Baseline
from rlweave.plan.record import Iterations, JobRecord, Trajectory
from rlweave.plan.training import predict_overlap, predict_resilience, young_interval_s
from rlweave.plugins.stream_generation.planner import PlanMode
from rlweave.sim import EngineModel

STAGES = {"generate": 30.0, "old_log_prob": 4.0, "ref": 4.0, "update_actor": 12.0, "weight_sync": 2.0,
          "reward": 1.0}
FAILURES = {"gpu_mtbf_hours": 50_000, "checkpoint_s": 300, "restart_s": 900, "snapshot_s": 10, "recover_s": 120}


def job(trajectories: bool = True, stages: dict | None = None) -> JobRecord:
    """A job recorded on 8 A100s, one engine per GPU, 128 requests a step, with agent loops."""
    rng = np.random.default_rng(1)
    lengths = rng.lognormal(6.0, 0.8, 1024).astype(int) + 1
    engine = EngineModel(base_s=0.02, per_seq_s=0.0002, slots=64, prefill_s_per_token=2e-6)
    empty = Iterations(np.zeros(0, int), np.zeros(0, int), np.zeros(0))
    trajs = tuple(Trajectory(str(i), int(rng.integers(1, 8)), float(rng.exponential(5))) for i in range(64))
    stages = stages or STAGES
    return JobRecord("synthetic", {s: dict(stages) for s in range(1, 9)}, lengths, empty,
                     tuple(f"e{i}" for i in range(8)), 64, engine, 200.0, trajs if trajectories else ())


def cluster(gpus: int = 64, tp: int = 4, failures: dict | None = FAILURES, experts: int = 0) -> object:
    return parse_cluster({
        "gpu": {"kind": "H100_SXM", "count": gpus},
        "model": {"params_b": 7.0, "layers": 28, "hidden": 3584, "experts": experts, "top_k": 2 if experts else 0},
        "parallelism": {"tp": tp, "pp": 1, "dp": gpus // tp, "rollout_tp": 4, "ep": 1},
        "recorded": {"gpu": "A100_80GB", "gpus": 8, "params_b": 7.0, "rollout_tp": 1},
        **({"failures": failures} if failures else {})})


def baseline(j: JobRecord | None = None, c=None) -> Baseline:
    j, c = j or job(), c or cluster()
    return Baseline(j, c, predict_step(j, c, sample=16))


@pytest.fixture(scope="module")
def plan():
    return plan_plugins(job(), cluster(), sample=16)


def test_every_plugin_gives_a_labelled_figure_beside_its_bound_or_says_why_not(plan):
    rows = {r.name: r for r in plan.rows}
    assert {"stream_generation (on_policy)", "stream_generation (async)", "agentic_rollout", "preemptive_serving",
            "overlap", "resilience", "stage_fusion", "replay_balance"} <= set(rows)
    for r in rows.values():
        if r.step_s is None:
            assert r.label == "no prediction" and r.note and r.bound_s is None
        else:
            assert r.label in ("SIMULATED", "MODELLED")
            assert r.bound_s <= r.step_s * (1 + 1e-9), r.name  # no prediction beats its own bound
            assert r.bound_ratio <= r.ratio * (1 + 1e-9)
    assert rows["stage_fusion"].step_s is None and "pipeline bubbles" in rows["stage_fusion"].note
    assert rows["replay_balance"].step_s is None and "dense model" in rows["replay_balance"].note


def test_replay_balance_on_an_moe_model_names_the_routing_the_trace_lacks(plan):
    moe = plan_plugins(job(), cluster(experts=8), sample=8, sensitivity=False)
    row = next(r for r in moe.rows if r.name == "replay_balance")
    assert row.step_s is None and "expert routing" in row.note


def test_async_streaming_hides_training_behind_generation_and_its_pools_fill_the_cluster():
    base = baseline()
    p = predict_stream(base, PlanMode.ASYNC)
    assert p.ratio < 0.95  # training (20 s of 53) overlaps the next batch's generation
    assert p.settings["generation_gpus"] + p.settings["training_gpus"] == 64
    assert p.settings["generation_gpus"] > 0 and p.settings["training_gpus"] > 0
    no_training = baseline(job(stages={"generate": 30.0}))
    assert predict_stream(no_training, PlanMode.ASYNC).step_s is None


def test_agentic_gives_verl_the_non_clairvoyant_policy_and_heddles_oracle():
    p = predict_agentic(baseline())
    assert set(p.policies) == {"verl (even, FCFS)", "non-clairvoyant (even, expected remaining turns)",
                               "Heddle oracle (presorted, longest remaining)"}
    assert p.policies["verl (even, FCFS)"] == 1.0
    assert p.policies["Heddle oracle (presorted, longest remaining)"] < 1.0  # long trajectories spread out
    assert p.label == "SIMULATED" and p.settings["placement"].startswith("presorted")
    none = predict_agentic(baseline(job(trajectories=False)))
    assert none.step_s is None and "trajectory" in none.note


def test_agentic_takes_the_median_of_drawn_slices_steadier_than_one_slice():
    base = baseline()
    one = [predict_agentic(base, seed=s, trajectories=0).ratio for s in range(5)]
    drawn = [predict_agentic(base, seed=s) for s in range(5)]
    assert drawn[0].settings["slice"].endswith("median of 4 draws")  # 8 x 16 trajectories a slice, 512 in all
    assert "median of 1 draws" in predict_agentic(base, trajectories=0).settings["slice"]
    spread = [max(r) - min(r) for r in (one, [p.ratio for p in drawn])]
    assert spread[1] < 0.6 * spread[0]  # seeded: 0.0042 against 0.0101 here
    assert all(p.bound_s <= p.step_s for p in drawn)


def test_serving_reports_latency_and_makespan_of_fcfs_the_learned_index_and_srpt():
    base = baseline(c=replace(cluster(), slots=16))  # 64 requests an instance queue for 16 slots
    p = predict_serving(base)
    assert p.policies["mean latency, oracle (SRPT)"] < p.policies["mean latency, FCFS"] == 1.0
    assert set(p.policies) == {f"{what}, {who}" for what in ("mean latency", "makespan")
                               for who in ("FCFS", "non-clairvoyant (expected remaining)", "oracle (SRPT)")}
    assert p.ratio == pytest.approx(
        1 + (p.policies["makespan, non-clairvoyant (expected remaining)"] - 1) * base.generate_s / p.default_s)
    roomy = predict_serving(baseline())  # every request fits the slots: no queue, no policy matters
    assert roomy.policies["mean latency, oracle (SRPT)"] == roomy.ratio == 1.0


def test_overlap_hides_tp_collectives_and_has_nothing_to_hide_at_tp_1():
    p = predict_overlap(baseline())
    assert p.ratio < 1 and p.bound_s == pytest.approx(baseline().step.step_s)  # bound: every collective hidden
    assert p.default_s > p.step_s > p.bound_s
    assert set(p.settings["chunks per rank (fwd/bwd)"]) == {"qkv", "proj", "fc1", "fc2"}
    tp1 = predict_overlap(baseline(c=cluster(tp=1)))
    assert tp1.step_s is None and "tp = 1" in tp1.note


def test_resilience_picks_youngs_interval_and_gains_more_the_more_often_the_cluster_fails():
    base = baseline()
    p = predict_resilience(base)
    mtbf = FAILURES["gpu_mtbf_hours"] * 3600 / 64
    assert young_interval_s(10, mtbf, 1.0) == pytest.approx((2 * 10 * mtbf) ** 0.5)
    assert p.settings["snapshot_every (steps)"] == round((2 * 10 * mtbf) ** 0.5 / base.step.step_s)
    assert p.ratio < 1 and p.bound_s == base.step.step_s
    flaky = predict_resilience(baseline(c=cluster(failures=FAILURES | {"gpu_mtbf_hours": 5_000})))
    assert flaky.ratio < p.ratio
    assert predict_resilience(baseline(c=cluster(failures=None))).step_s is None
    half = {k: v for k, v in FAILURES.items() if k not in ("snapshot_s", "recover_s")}
    assert "snapshot_s" in predict_resilience(baseline(c=cluster(failures=half))).note


def test_a_cluster_that_fails_faster_than_it_restarts_gets_a_reason_not_a_division_by_zero():
    """64 GPUs at 50 GPU-hours each fail every 2,812 s: verl's 900 s restart fits, a 3,000 s
    one does not; resilience's 120 s recovery does, a 3,000 s one does not."""
    verl = predict_resilience(baseline(c=cluster(failures=FAILURES | {"gpu_mtbf_hours": 50, "restart_s": 3000})))
    assert verl.step_s is None and "never progress" in verl.note and "restart_s (3000 s)" in verl.note
    ours = predict_resilience(baseline(c=cluster(failures=FAILURES | {"gpu_mtbf_hours": 50, "recover_s": 3000})))
    assert ours.step_s is None and "resilience's recover_s (3000 s)" in ours.note
    assert predict_resilience(baseline(c=cluster(failures=FAILURES | {"gpu_mtbf_hours": 50}))).ratio < 1


def test_composable_sets_sit_beside_the_plugins(plan):
    rows = {r.name: r for r in plan.rows}
    for members in SETS:
        row = rows[" + ".join(members)]
        assert row.step_s is not None and row.label == "SIMULATED"
    async_set = rows["stream_generation (async) + overlap + resilience"]
    base, resilience = plan.baseline, rows["resilience"]
    # the set's default: verl's with the TP collectives exposed (overlap's) and verl's failures (resilience's)
    assert async_set.default_s == pytest.approx(rows["overlap"].default_s * resilience.default_s / base.step.step_s)
    # inside the set each member helps: the same set with the collectives left exposed is slower
    exposed = rows["overlap"].default_s - base.step.step_s
    factor = 1 + exposed / base.train_s
    without = predict_stream(base, PlanMode.ASYNC, train_factor=factor, default_train_factor=factor,
                             default_s=rows["overlap"].default_s)
    assert async_set.step_s < without.step_s * resilience.step_s / base.step.step_s
    assert async_set.step_s < without.step_s * resilience.default_s / base.step.step_s


def test_a_sensitivity_line_per_plugin_names_the_input_that_moves_it_most(plan):
    rows = {r.name: r for r in plan.rows}
    assert rows["resilience"].sensitivity.startswith("GPU MTBF")
    for r in rows.values():
        if r.step_s is not None and " + " not in r.name:
            assert r.sensitivity, r.name
    assert not rows["stage_fusion"].sensitivity


def test_ten_thousand_gpus_with_every_plugin_and_the_sensitivity_answer_in_under_a_minute():
    c = replace(cluster(10_000), requests_per_step=256 * 2500)  # 256 requests an instance, as verl's batches go
    start = time.perf_counter()
    p = plan_plugins(job(), c)
    assert time.perf_counter() - start < 120  # goal: a minute; 17 to 35 s here, twice that with the cores shared
    assert p.baseline.step.instances == 2500 and p.baseline.step.simulated == 64
    assert p.baseline.step.requests_per_instance == 256
    assert all(r.step_s is not None for r in p.rows if r.name.startswith(("stream", "agentic", "overlap")))


def test_the_command_prints_each_plugin_and_its_json(tmp_path, capsys, monkeypatch):
    from rlweave.plan import command

    monkeypatch.setattr(command, "record", lambda directory: job())
    path = tmp_path / "cluster.toml"
    path.write_text('[gpu]\nkind = "H100_SXM"\ncount = 64\n[model]\nparams_b = 7.0\nlayers = 28\nhidden = 3584\n'
                    '[parallelism]\ntp = 4\npp = 1\ndp = 16\nrollout_tp = 4\n'
                    '[recorded]\ngpu = "A100_80GB"\ngpus = 8\nparams_b = 7.0\n')
    assert main(["trace", "--cluster", str(path), "--sample", "8", "--no-sensitivity"]) == 0
    out = capsys.readouterr().out
    assert "per plugin on 64 GPUs" in out and "no prediction" in out and "SIMULATED" in out
    assert "resilience: no [failures] in the cluster file" in out
    assert main(["trace", "--cluster", str(path), "--sample", "8", "--json", "--no-sensitivity"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {r["name"]: r for r in data["plugins"]}
    assert names["overlap"]["label"] == "MODELLED" and names["overlap"]["ratio"] < 1
    assert names["stage_fusion"]["ratio"] is None and "slice" in data["assumptions"]


def test_the_plan_draws_one_png_and_names_the_extra_without_matplotlib(tmp_path, capsys, monkeypatch):
    from rlweave.plan import command

    monkeypatch.setattr(command, "record", lambda directory: job())
    monkeypatch.setattr(command, "load_cluster", lambda path: cluster())
    png = tmp_path / "plan.png"
    assert main(["trace", "--cluster", "c.toml", "--sample", "8", "--no-sensitivity", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["trace", "--cluster", "c.toml", "--sample", "8", "--no-sensitivity", "--png", str(png)]) == 2
    assert "--png needs matplotlib, which comes with the bench extra" in capsys.readouterr().err
