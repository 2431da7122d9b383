"""ReLibra's Megatron MoE layer (rlweave.replay_balance enabled) on gloo, EP=1, 2 and 4 CPU
processes, against Megatron's own MoELayer with the same logical weights under the same
replayed skewed routing: outputs, input and weight gradients and the weights after Adam steps
agree, with micro-batch replicas (copied per micro-batch) and with step replicas (copied once,
kept over the step's micro-batches, their gradients folded after its last backward); every
routed token is computed exactly once; plans keep within the slots per rank; an optimizer step
before the step's last backward is refused; and ``rlweave bench moe --json`` plans exactly
what the layer ran for the same trace and topology."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from balance_worker import MICRO_BATCHES, TOKENS, skewed_routing
from test_megatron_adapter import run_ranks

ENABLED = {"RLWEAVE__REPLAY_BALANCE__ENABLE": "true"}


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def merged(ranks, step, key, who):
    out = {}
    for rank in ranks:
        out.update(rank["steps"][step][key][who])
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_balanced_layer_equals_megatron_and_computes_every_token_once(world_size, tmp_path):
    # EP=4 as two nodes of two ranks: micro-batch replicas stay in a node, step replicas cross.
    nodes = {"RLWEAVE__REPLAY_BALANCE__RANKS_PER_NODE": "2"}
    ranks = run_ranks(world_size, tmp_path, script="balance_worker.py", **ENABLED, **nodes)
    check_against_megatron(ranks, world_size)
    if world_size > 1:
        check_plans_equal_the_bench(ranks, world_size, tmp_path)


@pytest.mark.timeout(300)
def test_alltoall_dispatcher_with_cpu_stand_in_for_cuda_streams(tmp_path):
    """Megatron's alltoall dispatcher (uneven all-to-all over the physical slots); its CUDA
    side stream is replaced for CPU by rlweave.adapters.megatron.cpu.alltoall_without_cuda_streams."""
    ranks = run_ranks(2, tmp_path, script="balance_worker.py", BALANCE_DISPATCHER="alltoall", **ENABLED)
    check_against_megatron(ranks, 2)


def check_step(ranks, step):
    """One step of ``ranks`` (an EP group): every micro-batch's output and input gradient, the
    router gradient, and each logical expert's gradient and weights after Adam equal Megatron's."""
    for rank in ranks:
        record = rank["steps"][step]
        for mb in record["micro_batches"]:
            close(mb["rlweave"]["output"], mb["reference"]["output"])
            close(mb["rlweave"]["input_grad"], mb["reference"]["input_grad"])
        close(record["router_grad"]["rlweave"], record["router_grad"]["reference"])
        assert record["spare_grads_cleared"]  # an optimizer never steps a replica
    for key in ("expert_grads", "weights_after_step"):
        ours, reference = merged(ranks, step, key, "rlweave"), merged(ranks, step, key, "reference")
        assert sorted(ours) == sorted(reference) == list(range(8))  # each expert owned once
        for e in reference:
            for a, b in zip(ours[e], reference[e], strict=True):
                close(a, b)


def check_against_megatron(ranks, world_size):
    assert all(rank["class"] == "ReplayBalancedMoELayer" for rank in ranks)
    for step in range(2):
        check_step(ranks, step)

    slots = len(ranks[0]["tokens_seen"][0]["tokens_per_slot"])
    home_slots = 8 // world_size
    replica_tokens = {"micro-batch": 0, "step": 0}
    for i, seen in enumerate(ranks[0]["tokens_seen"]):
        step, mb = divmod(i, MICRO_BATCHES)
        placement, layout = seen["placement"], seen["step_layout"]
        assert placement.size == world_size * slots  # the plan fits the slots of every rank
        per_slot = torch.cat([rank["tokens_seen"][i]["tokens_per_slot"] for rank in ranks]).numpy()
        routed = ranks[0]["routing"][step][mb * TOKENS : (mb + 1) * TOKENS]
        per_expert = np.bincount(placement[placement >= 0], weights=per_slot[placement >= 0], minlength=8)
        np.testing.assert_array_equal(per_expert, np.bincount(routed.ravel(), minlength=8))
        assert per_slot[placement < 0].sum() == 0
        homes = placement.reshape(world_size, slots)[:, :home_slots]
        assert sorted(homes.ravel().tolist()) == list(range(8))
        np.testing.assert_array_equal(placement[layout >= 0], layout[layout >= 0])  # the step's layout kept
        spare = np.arange(placement.size) % slots >= home_slots
        replica_tokens["step"] += int(per_slot[spare & (layout >= 0)].sum())
        replica_tokens["micro-batch"] += int(per_slot[spare & (layout < 0)].sum())
    for layer, counts in enumerate(ranks[0]["two_layer_counts"]):  # layer l got micro-batch l's routing
        routed = ranks[0]["routing"][1][layer * TOKENS : (layer + 1) * TOKENS]
        np.testing.assert_array_equal(counts.numpy(), np.bincount(routed.ravel(), minlength=8))
    if world_size == 1:
        return  # one rank: nothing to replicate onto or move to
    assert replica_tokens["micro-batch"] > 0 and replica_tokens["step"] > 0  # both kinds took tokens
    if world_size == 2:  # one node: step 2 began by moving experts with weights and Adam state (the
        # weights after the second Adam step above would differ otherwise); at EP=4 step replicas
        # across the nodes pay better than moves
        assert all(rank["steps"][1]["moved"] > 0 for rank in ranks)
    for rank in ranks:
        weights_changed, unfolded = rank["early_optimizer_step"]
        assert "weights changed since its step replicas were copied" in weights_changed
        assert "ran the backward of 1 of the 2 micro-batches" in unfolded


def check_plans_equal_the_bench(ranks, world_size, tmp_path):
    """``rlweave bench moe --json`` on the layer's second step (its trace, the layer's topology:
    one spare slot, two ranks per node, the layer's expert bytes) gives the step layout and every
    micro-batch placement the layer ran."""
    routing = skewed_routing(11, world_size)
    trace = tmp_path / "step.npz"
    np.savez(trace, topk_ids=routing[:, None, :], microbatch_offsets=np.arange(MICRO_BATCHES + 1) * TOKENS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    out = subprocess.run([sys.executable, "-m", "rlweave.cli", "bench", "moe", "--json", "--trace", str(trace),
                          "--experts", "8", "--ep", str(world_size), "--ranks-per-node", "2", "--spare-slots", "1",
                          "--expert-bytes", str(64 * 32 * 2 * 4), "--measured-steps", "0", "--out", str(tmp_path)],
                         env=env, timeout=120, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rlweave_max_mean_load" in json.loads(out.stdout)
    plan = json.loads((tmp_path / "moe.json").read_text())["details"]["rlweave_plans"][str(world_size)]
    step_seen = ranks[0]["tokens_seen"][MICRO_BATCHES:]  # the second step's micro-batches
    np.testing.assert_array_equal(plan["step"]["physical_to_logical"][0], step_seen[0]["step_layout"])
    for bench, seen in zip(plan["microbatches"][0], step_seen, strict=True):
        np.testing.assert_array_equal(bench["physical_to_logical"], seen["placement"])
        np.testing.assert_allclose(bench["token_share"], seen["share"], rtol=0, atol=1e-12)


@pytest.mark.timeout(300)
def test_impossible_slot_budget_is_one_clear_error(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run_ranks(1, tmp_path, script="balance_worker.py", RLWEAVE__REPLAY_BALANCE__SLOTS_PER_RANK="7", **ENABLED)
    assert "rlweave.replay_balance.slots_per_rank=7" in failure.value.stderr
    assert "raise slots_per_rank to at least 8" in failure.value.stderr
