"""Scale's first cut: verl's sync step on 1,024 and 10,000 GPUs answers in well under a minute,
moves the obvious way with each input, samples instances at scale and says so, and labels every
figure SIMULATED or MODELLED."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlweave.plan import ASSUMPTIONS, JobRecord, parse_cluster, predict_step
from rlweave.plan.command import main
from rlweave.plan.record import Iterations
from rlweave.plan.scale import _tail, target_engine
from rlweave.sim import EngineModel

RECORDED_STAGES = {"generate": 30.0, "old_log_prob": 4.0, "ref": 4.0, "update_actor": 12.0, "weight_sync": 2.0,
                   "reward": 1.0}


def job(lengths: np.ndarray | None = None) -> JobRecord:
    """A job recorded on 8 A100s, one engine per GPU, 512 requests a step."""
    rng = np.random.default_rng(1)
    lengths = rng.lognormal(6.0, 0.8, 4096).astype(int) + 1 if lengths is None else lengths
    engine = EngineModel(base_s=0.02, per_seq_s=0.0002, slots=128, prefill_s_per_token=2e-6)
    empty = Iterations(np.zeros(0, int), np.zeros(0, int), np.zeros(0))
    return JobRecord("synthetic", {1: dict(RECORDED_STAGES), 2: dict(RECORDED_STAGES)}, lengths[:1024], empty,
                     tuple(f"e{i}" for i in range(8)), 128, engine, 200.0, ())


def cluster(gpus: int = 1024, kind: str = "H100_SXM", params_b: float = 7.0, **job_section) -> object:
    rollout_tp = 4 if gpus % 4 == 0 else 1
    return parse_cluster({
        "gpu": {"kind": kind, "count": gpus},
        "model": {"params_b": params_b, "layers": 28, "hidden": 3584},
        "parallelism": {"tp": 1, "pp": 1, "dp": gpus, "rollout_tp": rollout_tp},
        "recorded": {"gpu": "A100_80GB", "gpus": 8, "params_b": 7.0, "rollout_tp": 1},
        **({"job": job_section} if job_section else {})})


@pytest.mark.parametrize("gpus", [1024, 10_000])
def test_the_step_at_scale_answers_in_well_under_a_minute_and_labels_every_figure(gpus):
    start = time.perf_counter()
    p = predict_step(job(), cluster(gpus))
    assert time.perf_counter() - start < 20
    assert p.instances == gpus // 4 and p.simulated == 64  # sampled, not every instance
    assert p.requests_per_instance == 4 * 512 // 8  # weak scaling: the recorded requests per GPU, 4 GPUs each
    assert p.stages["generate"].label == "SIMULATED"
    assert {f.label for name, f in p.stages.items() if name != "generate"} == {"MODELLED"}
    assert set(p.stages) == set(RECORDED_STAGES)
    assert p.step_s == pytest.approx(sum(f.seconds for f in p.stages.values()))
    assert p.stages["generate"].seconds >= p.sample_max_s  # the tail of all instances, not of the sample


def test_a_faster_gpu_gives_a_shorter_step_and_each_stage_moves_its_way():
    a100, h100, h200 = (predict_step(job(), cluster(kind=k)) for k in ("A100_80GB", "H100_SXM", "H200_SXM"))
    assert a100.step_s > h100.step_s > h200.step_s
    assert h100.stages["generate"].seconds > h200.stages["generate"].seconds  # bandwidth: 3.35 vs 4.8 TB/s
    assert h100.stages["update_actor"].seconds == h200.stages["update_actor"].seconds  # same FLOP/s
    h20 = predict_step(job(), cluster(kind="H20"))
    assert h20.stages["generate"].seconds < h100.stages["generate"].seconds  # more bandwidth...
    assert h20.stages["update_actor"].seconds > 6 * h100.stages["update_actor"].seconds  # ...6.7x fewer FLOP/s
    assert h20.stages["reward"].seconds == RECORDED_STAGES["reward"]  # host stage: as recorded


def test_a_bigger_model_longer_responses_or_more_requests_give_a_longer_step():
    base = predict_step(job(), cluster())
    bigger = predict_step(job(), cluster(params_b=70.0))
    assert bigger.step_s > base.step_s
    assert bigger.stages["update_actor"].seconds == pytest.approx(10 * base.stages["update_actor"].seconds)
    assert predict_step(job(job().output_lengths * 2), cluster()).stages["generate"].seconds > \
        base.stages["generate"].seconds
    more = predict_step(job(), cluster(requests_per_step=2 * 1024 * 512 // 8))
    assert more.stages["generate"].seconds > base.stages["generate"].seconds
    assert more.stages["update_actor"].seconds == pytest.approx(2 * base.stages["update_actor"].seconds)


def test_the_target_engine_scales_decode_by_bandwidth_and_prefill_by_flops():
    engine = target_engine(job().engine, cluster(kind="H100_SXM"))  # TP4 of 7B vs TP1 of 7B: a quarter per GPU
    assert engine.per_seq_s == pytest.approx(0.0002 * 2.039 / 3.35 / 4)
    assert engine.prefill_s_per_token == pytest.approx(2e-6 * 312 / 989 / 4)
    assert engine.slots == 128


def test_the_tail_is_exact_when_every_instance_is_simulated_and_above_the_sample_otherwise():
    spans = np.array([10.0, 11.0, 12.0, 13.0])
    assert _tail(spans, 4) == 13.0
    assert _tail(spans, 1000) > 13.0
    assert "sampled-tail" in ASSUMPTIONS and "decode-bandwidth" in ASSUMPTIONS


def test_the_command_prints_a_table_and_refuses_a_bad_cluster(tmp_path, capsys):
    from test_plan_record import fire_job  # a trace the tracing plugin really writes

    from rlweave import host
    from rlweave.config import settings_from_overrides
    from rlweave.tracing import tracer

    h = host.activate(settings_from_overrides(["+rlweave.tracing.enable=true",
                                               f"++rlweave.tracing.dir={tmp_path / 't'}"]), export_env=False)
    try:
        fire_job(h)
    finally:
        tracer.disable()
    (tmp_path / "c.toml").write_text(
        '[gpu]\nkind = "H200_SXM"\ncount = 1024\n[model]\nparams_b = 7.0\nlayers = 28\nhidden = 3584\n'
        '[parallelism]\ntp = 1\npp = 1\ndp = 1024\nrollout_tp = 4\n'
        '[recorded]\ngpu = "A100_80GB"\ngpus = 1\nparams_b = 0.5\n')
    from rlweave.cli import main as rlweave

    for command in (main, lambda argv: rlweave(["plan", *argv])):  # python -m rlweave.plan, rlweave plan
        assert command([str(tmp_path / "t"), "--cluster", str(tmp_path / "c.toml")]) == 0
        out = capsys.readouterr().out
        assert "generate" in out and "SIMULATED" in out and "MODELLED" in out and "assumptions:" in out
    with pytest.raises(SystemExit):  # rlweave plan stream is still the pool planner
        rlweave(["plan", "stream", "--help"])
    assert "usage: rlweave plan stream" in capsys.readouterr().out
    (tmp_path / "c.toml").write_text('[gpu]\nkind = "B300"\n')
    assert main([str(tmp_path / "t"), "--cluster", str(tmp_path / "c.toml")]) == 2
    assert "[gpu] kind = 'B300'" in capsys.readouterr().err
