"""``rlweave bench moe``: its rlweave row is the plugin's hooks' plan, and bad input loses
nothing (a trace the measured part cannot replay still gets its modelled result; a malformed
trace is one line naming the file and the fields)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from rlweave.benchmarks import moe
from rlweave.plugins.replay_balance.loads import expert_loads
from rlweave.plugins.replay_balance.planner import home_of, plan_step, static_home


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    moe.add_arguments(parser)
    args = parser.parse_args(list(argv))
    args.seed, args.out = 0, "bench-results"
    return args


def fine_grained_trace(path, experts=64, top_k=8, micro_batches=2, tokens=256):
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(experts, top_k, replace=False, p=np.r_[[8.0] * 4, [1.0] * (experts - 4)] / (experts + 28))
                    for _ in range(micro_batches * tokens)])[:, None, :]
    np.savez(path, topk_ids=ids, microbatch_offsets=np.arange(micro_batches + 1) * tokens)
    return ids


def test_the_rlweave_row_is_the_step_plan_the_hooks_return():
    """The bench asks the hooks; their step layout is plan_step's, and the modelled time the bench
    scores for it is the one plan_step chose it by."""
    args = bench_args("--ep", "16", "--micro-batches", "4", "--tokens", "512", "--layers", "1",
                      "--measured-steps", "0", "--experts", "32")
    ids, offsets = moe.synthetic_trace(np.random.default_rng(3), args)
    plan = moe.plan_through_hooks(ids, offsets, 32, 16, args)
    load = expert_loads(ids, offsets, 32)[:, 0]
    direct = plan_step(load, plan.topology, static_home(plan.topology), moe.CostModel())
    np.testing.assert_array_equal(plan.step.physical_to_logical[0], direct.layout)
    np.testing.assert_array_equal(np.stack([p for p, _ in plan.microbatches[0]]), direct.physical_to_logical)
    scores = moe.score_layer(load, load.sum(axis=0), plan, 0, moe.CostModel())
    assert scores["rlweave"]["step_s"] == pytest.approx(direct.time_s, rel=1e-12)
    np.testing.assert_array_equal(home_of(plan.step.physical_to_logical[0], plan.topology), direct.home)


def test_a_trace_the_measured_part_can_replay_is_replayed_with_its_own_experts_and_top_k(tmp_path):
    fine_grained_trace(tmp_path / "fine.npz")
    args = bench_args("--trace", str(tmp_path / "fine.npz"), "--ep", "8", "16", "--measured-steps", "2")
    ids, _, experts = moe.load_trace(args.trace, args.experts)
    assert (experts, ids.shape[2]) == (64, 8)
    assert moe.measured_shape(args, ids, experts) == (64, 8)


def test_a_trace_the_measured_part_cannot_replay_keeps_the_modelled_result(tmp_path):
    """Nine experts fit three ranks of the model but not Megatron's EP=2: one line says so."""
    fine_grained_trace(tmp_path / "nine.npz", experts=9, top_k=2)
    args = bench_args("--trace", str(tmp_path / "nine.npz"), "--ep", "3", "--ranks-per-node", "3",
                      "--measured-steps", "2")
    result = moe.run(args)
    assert result.headline["rlweave_max_mean_load"] < result.headline["static_max_mean_load"]
    assert result.headline["measured_ep2_speedup"] is None
    assert result.headline["measured_ep2_skipped"] == ("EP=2 replays the trace's 9 experts top-2, which needs an "
                                                       "even number of experts above top-k")
    assert ["2", "measured (Megatron, gloo)", f"not measured: {result.headline['measured_ep2_skipped']}", "", "",
            ""] in result.rows


def test_ep_sizes_that_cannot_hold_the_experts_are_skipped_with_one_line(tmp_path, capsys):
    fine_grained_trace(tmp_path / "eight.npz", experts=8, top_k=2)
    result = moe.run(bench_args("--trace", str(tmp_path / "eight.npz"), "--ep", "2", "4", "16",
                                "--ranks-per-node", "4", "--measured-steps", "0"))
    assert sorted(result.details["per_ep"]) == ["2", "4"]
    assert "EP=16 skipped: 8 experts do not divide over 16 ranks" in capsys.readouterr().err


@pytest.mark.parametrize(("arrays", "message"), [
    ({"topk_ids": np.zeros((4, 2), dtype=int), "microbatch_offsets": np.array([0, 4])}, "expected topk_ids int"),
    ({"topk_ids": np.zeros((4, 1, 2), dtype=int)}, "microbatch_offsets"),
    ({"topk_ids": np.zeros((4, 1, 2), dtype=int), "microbatch_offsets": np.array([0, 3])}, "must rise from 0 to 4"),
    ({"topk_ids": np.full((4, 1, 2), 70), "microbatch_offsets": np.array([0, 4])}, "pass the model's expert count"),
])
def test_a_malformed_trace_is_one_line_naming_the_file(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SystemExit, match=message) as error:
        moe.load_trace(tmp_path / "bad.npz", 64)
    assert "bad.npz" in str(error.value)


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.int32])
def test_the_measured_part_replays_a_trace_of_any_integer_dtype_as_gather_indices(tmp_path, dtype):
    """A routing capture may store int16 ids; Megatron's RouterReplay gathers with what the
    measured part hands it, and torch's gather takes int64 only."""
    import torch

    from rlweave.benchmarks import moe_measured

    ids = fine_grained_trace(tmp_path / "wide.npz", experts=8, top_k=2)
    np.savez(tmp_path / "narrow.npz", topk_ids=ids.astype(dtype), microbatch_offsets=np.array([0, 256, 512]))
    opts = moe_measured.parse([str(tmp_path / "out.json"), "--trace", str(tmp_path / "narrow.npz"),
                               "--tokens", "128", "--micro-batches", "2"])
    routing = moe_measured.step_routing(opts, 0, skewed=True)
    np.testing.assert_array_equal(routing, ids[:256, 0])
    scores = torch.arange(256 * 8, dtype=torch.float32).reshape(256, 8)
    torch.gather(scores, 1, torch.as_tensor(routing))  # raises for any index dtype but int64
