from __future__ import annotations

import pytest

from rlweave.benchmarks.arithmetic_task import compute_score, rows
from rlweave.benchmarks.verl_baseline import steady_summary
from rlweave.benchmarks.verl_runs import VerlJob, parse_steps, verl_command


def test_parse_steps_reads_verls_console_logger_lines():
    log = ("(TaskRunnerV1 pid=1) step:1 - actor/pg_loss:-0.5 - timing_s/step:3.0 - note:abc\n"
           "noise\n(TaskRunnerV1 pid=1) step:2 - actor/pg_loss:0.25 - timing_s/step:2.0\n")
    assert parse_steps(log) == {1: {"actor/pg_loss": -0.5, "timing_s/step": 3.0},
                                2: {"actor/pg_loss": 0.25, "timing_s/step": 2.0}}


def test_a_verl_job_becomes_verls_command_line_with_its_overrides_last(tmp_path):
    """What the job says reaches verl's command line; its overrides come after the mode's (so
    they win), and with two ranks each micro-batch holds a rank's share."""
    job = VerlJob("grpo", steps=3, save_freq=2, seed=5, ranks=2, extra=("trainer.val_before_train=True",))
    cmd = verl_command(job, tmp_path)
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    for item in ("trainer.total_training_steps=3", "trainer.save_freq=2", "data.seed=5", "trainer.n_gpus_per_node=2",
                 "trainer.experiment_name=grpo"):
        assert item in cmd, item
    assert cmd.index("trainer.val_before_train=True") > cmd.index("trainer.val_before_train=False")
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    assert cmd.index(f"{micro}=4") > cmd.index(f"{micro}=8")
    assert (tmp_path / "data").is_dir()


def test_a_step_line_that_ray_forwarded_in_pieces_is_put_back_together():
    """Seen in a CI-like run: Ray cut the TaskRunner's step line inside a key, with a worker's
    line between the pieces."""
    task, worker = "\x1b[36m(TaskRunnerV1 pid=7)\x1b[0m ", "\x1b[36m(WorkerDict pid=9)\x1b[0m "
    log = (f"{task}step:3 - global_seqlen/min:173.0 - global_seqlen/max\n"
           f"{worker}INFO:2026-12-03 15:48:17,999:[Rank 1] Saved model to /dev/shm/x.pt\n"
           f"{task}2026-12-03 15:48:15,550 - WARNING - transfer_queue.utils.common - target_num_threads 8\n"
           f"{task}:175.0 - actor/pg_loss:-5.9e-08 -\n"
           f"{task} timing_s/step:2.5\n"
           f"{task}'Final validation metrics: None'\n"
           f"{task}step:4 - actor/pg_loss:0.25\n"
           f"{task}Training Progress: 100%\n")
    assert parse_steps(log) == {3: {"global_seqlen/min": 173.0, "global_seqlen/max": 175.0, "actor/pg_loss": -5.9e-08,
                                    "timing_s/step": 2.5},
                                4: {"actor/pg_loss": 0.25}}


def test_reward_varies_within_a_group_and_rewards_the_answer():
    assert compute_score("x", "the answer is 42", "42") > 1.0
    assert compute_score("x", "no digits here", "42") == 0.0
    assert compute_score("x", "7 and 8", "42") != compute_score("x", "7 and 88", "42")


def test_prompts_are_deterministic_per_seed():
    assert rows(4, "train", 0) == rows(4, "train", 0) != rows(4, "train", 1)


def test_steady_summary_skips_the_first_step():
    steps = {1: {"timing_s/step": 30.0, "timing_s/gen": 25.0},
             2: {"timing_s/step": 2.0, "timing_s/gen": 1.0, "timing_s/update_actor": 0.5},
             3: {"timing_s/step": 4.0, "timing_s/gen": 3.0, "timing_s/update_actor": 0.5}}
    summary = steady_summary(steps)
    assert summary["seconds_per_step"] == 3.0 and summary["first_step_seconds"] == 30.0
    assert summary["stage_share"] == {"gen": round(2.0 / 3.0, 4), "update_actor": round(0.5 / 3.0, 4)}


def test_moe_bench_on_a_synthetic_and_a_file_trace(tmp_path):
    import argparse

    import numpy as np

    from rlweave.benchmarks import moe

    parser = argparse.ArgumentParser()
    moe.add_arguments(parser)
    args = parser.parse_args(["--ep", "8", "16", "--micro-batches", "2", "--tokens", "256", "--layers", "1",
                              "--measured-steps", "0"])
    args.seed = 0
    result = moe.run(args)
    h = result.headline
    assert h["rlweave_max_mean_load"] < h["static_max_mean_load"]
    assert h["measured_ep2_speedup"] is None  # --measured-steps 0: said in the table, not hidden
    assert moe.plot(result, tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"

    ids, offsets = moe.synthetic_trace(np.random.default_rng(1), args)
    np.savez(tmp_path / "trace.npz", topk_ids=ids, microbatch_offsets=offsets)
    args.trace = tmp_path / "trace.npz"
    assert moe.run(args).headline["planner_ms_per_layer"] >= 0


def span(name, ts, dur, worker, **args):
    return {"name": name, "ph": "X", "ts": ts * 1e6, "dur": dur * 1e6, "worker": worker, "args": args}


def test_stream_bench_idle_is_measured_over_the_steady_steps_only():
    from rlweave.benchmarks.stream import idle_fractions, steady_spans

    events = [span("iteration", 0, 5, "vllm-engine-abcd", running=4, tokens=4),  # step 1: start-up
              {"name": "step_end", "ph": "i", "ts": 5e6},
              span("iteration", 5, 2, "vllm-engine-abcd", running=4, tokens=4),
              span("update_actor", 8, 1, "actor"), span("old_log_prob", 8.5, 1, "actor"),
              span("generate", 5, 5, "rollout"),  # the trainer waiting: not busy work
              {"name": "step_end", "ph": "i", "ts": 10e6}]
    spans = steady_spans(events)
    assert {e["worker"] for e in spans} == {"window", "engine abcd", "actor"}
    assert idle_fractions(spans) == {"engine abcd": 0.6, "actor": 0.7}


def test_stream_bench_profiles_the_engine_from_its_decode_iterations():
    from rlweave.benchmarks.stream import engine_profile

    # start-to-start: 2 running for 10 ms (5 ms of it between iterations), 4 running for 20 ms;
    # then a prefill (not a decode rate) and a long pause (idle, not decoding).
    events = [span("iteration", 0, 0.005, "e", running=2, tokens=2), span("iteration", 0.010, 0.020, "e", running=4, tokens=4),
              span("iteration", 0.030, 0.05, "e", running=4, tokens=300), span("iteration", 0.080, 0.01, "e", running=1, tokens=1),
              span("iteration", 5.0, 0.01, "e", running=1, tokens=1)]
    profile = engine_profile(events, slots=5)
    assert profile.batch_sizes == (1, 2, 3, 4, 5)
    assert profile.tokens_per_s == pytest.approx((100.0, 200.0, 200.0, 200.0, 250.0))


def test_stream_bench_sets_the_engine_profile_at_the_measured_busy_time():
    """Worked by hand: an engine whose every iteration takes 0.1 s (10 x b tokens/s at batch b,
    4 slots) keeps busy 0.6 s on one group of lengths [4, 6] (6 iterations), and 1.0 s on
    [4, 6] and [10, 2] (10: the longest sequence); mean 0.8 s. The verl sync run measured its
    engine busy 40% of a 3 s step, 1.2 s: the profile is 1.5 times slower at every batch size."""
    import numpy as np

    from rlweave.benchmarks.stream import at_measured_busy, engine_busy_s
    from rlweave.plugins.stream_generation.planner import GenerationProfile, simulate_generation

    sync = {"step_s": 3.0, "idle": {"actor": 0.7, "engine ab50": 0.6}}
    assert engine_busy_s(sync) == pytest.approx(1.2)
    profile = GenerationProfile((1, 2, 3, 4), (10.0, 20.0, 30.0, 40.0))
    draws = [np.array([[4.0, 6.0]]), np.array([[4.0, 6.0], [10.0, 2.0]])]
    assert [float(simulate_generation(d, [profile])[1].sum()) for d in draws] == pytest.approx([0.6, 1.0])
    slowed = at_measured_busy(profile, sync, draws)
    assert slowed.tokens_per_s == pytest.approx((10 / 1.5, 20 / 1.5, 30 / 1.5, 40 / 1.5))
    assert np.mean([simulate_generation(d, [slowed])[1].sum() for d in draws]) == pytest.approx(1.2)


def test_stream_bench_lengths_file_is_checked(tmp_path):
    import argparse

    from rlweave.benchmarks.stream import lognormal_lengths, workload

    assert lognormal_lengths(0, 8) == lognormal_lengths(0, 8) != lognormal_lengths(1, 8)
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"output_len": 12, "prompt": "a"}\n{"output_lens": [3, 5], "prompt": "b"}\n')
    bad.write_text('{"output_len": 0}\n')
    lengths, prompts, _ = workload(argparse.Namespace(lengths=str(good), seed=0, prompts=2, group=3))
    assert (lengths, prompts) == ([[12, 12, 12], [3, 5, 3]], ["a", "b"])
    with pytest.raises(SystemExit, match="bad.jsonl:1: output lengths must be positive"):
        workload(argparse.Namespace(lengths=str(bad), seed=0, prompts=2, group=3))


def test_stream_bench_report_predicts_the_disaggregated_runs_and_simulates_balanced_splits():
    import argparse
    import math

    from rlweave.benchmarks.stream import (ASYNC_DISAGG, ASYNC_PIPELINED, BALANCE_DEVICES, ONPOLICY_DISAGG,
                                           ONPOLICY_PIPELINED, PINNED_ASYNC as PINNED, SYNC_ROLLOUT_LP, Setup,
                                           report)

    def run(step_s: float, gen_s: float, push_s: float) -> dict:
        return {"step_s": step_s, "samples_per_s": 32 / step_s, "verl_step_s": step_s, "dispatch_s": 0.1,
                "delivery_s": 0.1, "rollout_push_s": 0.1, "idle": {"actor": 0.3, "engine e": 0.2},
                "staleness": {}, "stale_dropped": 0, "dynamic_batches_per_step": 2.0, "first_step_s": 10.0,
                "calibration_ms": 9.0,
                "stage_s": {"reward": 0.0, "old_log_prob": 0.1, "ref": 0.0, "adv": 0.05, "update_actor": 0.6,
                            "gen": gen_s, "update_weights": push_s}}

    runs = {"verl sync": run(3.0, 2.0, 0.05), SYNC_ROLLOUT_LP: run(2.8, 2.0, 0.05),
            ONPOLICY_DISAGG: run(2.0, 0.8, 0.05), ASYNC_DISAGG: run(1.8, 0.2, 0.1),
            ONPOLICY_PIPELINED: run(1.7, 0.6, 0.05), ASYNC_PIPELINED: run(1.5, 0.1, 0.1)}
    runs[ASYNC_PIPELINED]["cpu"] = {"cores_busy": [0.97, 1.0], "floor_step_s": 1.45,
                                    "cpu_s_per_step": {"engine": 1.0, "trainer": 0.6, "host": 1.3}}
    engine = [span("iteration", i * 0.02, 0.01, "e", running=1 + i % 8, tokens=1 + i % 8) for i in range(200)]
    lengths = [[n] * 4 for n in [4, 8, 16, 32, 64, 118, 20, 30] * 2]
    result = report([runs], [engine], lengths, Setup(8, 4, 2, 8, 118), argparse.Namespace(seed=0, lengths=None, steps=6))
    assert math.isfinite(result.headline["pipelined_planner_error_async"])
    # Without the 50 ms poll run its ratios are absent, not an error.
    assert result.headline["disaggregated_onpolicy_vs_fast_poll"] is None
    assert result.headline["pipelined_async_speedup"] == 2.0
    simulated = result.details["planner"]["balanced_plans_simulated"]
    assert sorted(simulated) == sorted(BALANCE_DEVICES)
    assert all(p["engines"] + p["trainers"] <= devices for devices, p in simulated.items())
    assert sum(row[0].startswith("planner SIMULATED") for row in result.rows) == len(BALANCE_DEVICES)
    assert {len(row) for row in result.rows} == {len(result.rows[0])}
    assert [row[-1] for row in result.rows if row[0] == ASYNC_PIPELINED] == ["97% 100%; 1.00/0.60/1.30; 1.45"]
    assert result.details["profile"]["pools"][0]["training"]["seconds_per_sample"] > 0  # for `rlweave plan stream`

    # Two interleaved rounds: medians with their range; a ratio whose range reaches across 1 is
    # within the drift, and a lead is a goal only when every round shows it.
    slow = {label: dict(r, step_s=r["step_s"] * 1.2, samples_per_s=r["samples_per_s"] / 1.2) for label, r in runs.items()}
    slow[ASYNC_DISAGG] = dict(runs[ASYNC_DISAGG], step_s=3.9, samples_per_s=32 / 3.9)  # slower than verl sync here
    runs[PINNED] = slow[PINNED] = run(2.1, 0.2, 0.1)
    two = report([runs, slow], [engine, engine], lengths, Setup(8, 4, 2, 8, 118),
                 argparse.Namespace(seed=0, lengths=None, steps=6))
    h = two.headline
    assert h["rounds"] == 2 and h["pipelined_async_speedup"] == 2.0  # the same in both rounds
    assert "disaggregated_async_speedup" in h["within_drift"] and "pipelined_async_speedup" not in h["within_drift"]
    assert two.details["spread"]["disaggregated_async_speedup"] == [round(3.0 * 1.2 / 3.9, 3), round(3.0 / 1.8, 3)]
    assert h["goals"]["async_ahead_of_separate_async_pinned"] is False  # behind in the second round
    assert h["goals"]["onpolicy_1.5x_verl_sync"] is True  # 1.5x in both rounds
    assert any("within drift" in row[3] for row in two.rows if row[0] == ASYNC_DISAGG)


def test_cpu_sampler_counts_the_run_process_tree_by_role():
    import subprocess
    import sys
    import time

    from rlweave.benchmarks.cpu_usage import CpuSampler, role_of

    assert (role_of("VLLM::EngineCore"), role_of("ray::WorkerDict.update_actor"), role_of("ray::TaskRunner")) == (
        "engine", "trainer", "host")
    # A parent that sleeps and a child that spins: the tree's CPU is the child's, about one core.
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"])
    sampler = CpuSampler(interval_s=0.1)
    sampler.start(parent.pid)
    time.sleep(1.0)
    start = time.time()
    time.sleep(1.5)
    end = time.time()
    parent.wait()
    sampler.stop()
    window = sampler.window(start, end)
    # The window is read from samples inside the span asked for, never beyond it.
    assert 0.0 < window.seconds <= end - start
    assert window.cpu_s["engine"] == window.cpu_s["trainer"] == 0.0
    # One spinning thread: some CPU however loaded the machine is, and at most a core.
    assert 0.05 < window.cpu_s["host"] <= 1.1 * window.seconds
    assert max(window.cores_busy) > 0.0 and window.floor_s == window.cpu_s["host"] / len(window.cores_busy)
    with pytest.raises(ValueError, match="fewer than two CPU samples"):
        sampler.window(end + 10, end + 11)


def test_cpu_window_counts_a_late_seen_process_from_its_first_sample_and_a_new_one_from_zero():
    from rlweave.benchmarks.cpu_usage import _Sample, window_of

    cores = [(0.0, 0.0)], [(1.0, 2.0)], [(2.0, 4.0)]
    first = _Sample(10.0, cores[0], {1: ("engine", 5.0, 0.0)})
    # pid 2 ran before the window but was missed by the first sample; pid 3 started inside it
    middle = _Sample(11.0, cores[1], {1: ("engine", 5.5, 0.0), 2: ("host", 40.0, 1.0), 3: ("trainer", 0.2, 10.5)})
    last = _Sample(12.0, cores[2], {1: ("engine", 6.0, 0.0), 2: ("host", 40.5, 1.0), 3: ("trainer", 0.7, 10.5)})
    window = window_of([first, middle, last])
    assert window.seconds == 2.0 and window.cores_busy == (0.5,)
    assert window.cpu_s == {"engine": 1.0, "trainer": 0.7, "host": 0.5}
