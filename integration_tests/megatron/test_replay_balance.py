"""ReLibra's Megatron MoE layer (rlweave.replay_balance enabled) on gloo, EP=2 and EP=4 CPU
processes, against Megatron's own MoELayer with the same logical weights under the same
replayed skewed routing: outputs, input and weight gradients and the weights after Adam steps
agree; every routed token is computed exactly once; plans keep within the slots per rank."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

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
@pytest.mark.parametrize("world_size", [2, 4])
def test_balanced_layer_equals_megatron_and_computes_every_token_once(world_size, tmp_path):
    # EP=4 as two nodes of two ranks: replicas stay in a node, so the step plan moves experts
    # across nodes (EP=2: one node, where one spare slot per rank is too few).
    nodes = {"RLWEAVE__REPLAY_BALANCE__RANKS_PER_NODE": "2"}
    check_against_megatron(run_ranks(world_size, tmp_path, script="balance_worker.py", **ENABLED, **nodes),
                           world_size)


@pytest.mark.timeout(300)
def test_alltoall_dispatcher_with_cpu_stand_in_for_cuda_streams(tmp_path):
    """Megatron's alltoall dispatcher (uneven all-to-all over the physical slots); its CUDA
    side stream is replaced for CPU by rlweave.adapters.megatron.cpu.alltoall_without_cuda_streams."""
    ranks = run_ranks(2, tmp_path, script="balance_worker.py", BALANCE_DISPATCHER="alltoall", **ENABLED)
    check_against_megatron(ranks, 2)


def check_against_megatron(ranks, world_size):
    assert all(rank["class"] == "ReplayBalancedMoELayer" for rank in ranks)
    for step in range(2):
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
    # Step 2 began with a reorder: experts changed ranks, carrying weights and Adam state
    # (the weights after the second Adam step above would differ otherwise).
    assert all(rank["steps"][1]["moved"] > 0 for rank in ranks)

    slots = len(ranks[0]["tokens_seen"][0]["tokens_per_slot"])
    replicated = 0
    for i, seen in enumerate(ranks[0]["tokens_seen"]):
        step, mb = divmod(i, 2)
        placement = seen["placement"]
        assert placement.size == world_size * slots  # the plan fits the slots of every rank
        per_slot = torch.cat([rank["tokens_seen"][i]["tokens_per_slot"] for rank in ranks]).numpy()
        routed = ranks[0]["routing"][step][mb * 384 : (mb + 1) * 384]
        per_expert = np.bincount(placement[placement >= 0], weights=per_slot[placement >= 0], minlength=8)
        np.testing.assert_array_equal(per_expert, np.bincount(routed.ravel(), minlength=8))
        assert per_slot[placement < 0].sum() == 0
        homes = placement.reshape(world_size, slots)[:, : 8 // world_size]
        assert sorted(homes.ravel().tolist()) == list(range(8))
        replicated += int(per_slot[np.arange(placement.size) % slots >= 8 // world_size].sum())
    assert replicated > 0  # replicas did take tokens
    for layer, counts in enumerate(ranks[0]["two_layer_counts"]):  # layer l got micro-batch l's routing
        routed = ranks[0]["routing"][1][layer * 384 : (layer + 1) * 384]
        np.testing.assert_array_equal(counts.numpy(), np.bincount(routed.ravel(), minlength=8))


@pytest.mark.timeout(300)
def test_impossible_slot_budget_is_one_clear_error(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run_ranks(1, tmp_path, script="balance_worker.py", RLWEAVE__REPLAY_BALANCE__SLOTS_PER_RANK="7", **ENABLED)
    assert "rlweave.replay_balance.slots_per_rank=7" in failure.value.stderr
    assert "raise slots_per_rank to at least 8" in failure.value.stderr
