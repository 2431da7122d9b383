"""ReLibra's layer under Megatron's DistributedDataParallel and optimizer (EP=2 x expert-data-
parallel 2, four gloo processes), against Megatron's MoELayer under the same, with Megatron's
non-distributed and distributed optimizer: spare slots are out of DDP's buffers and the
optimizer, replica gradients land in the owners' ``main_grad`` before ``finalize_model_grads``
reduces them, and moves carry ``main_grad`` and Adam state (the distributed optimizer's fp32
main-parameter and Adam shards, owned by other expert-data-parallel ranks at the new slot);
outputs, input, router and expert gradients, the gradient norm and the weights after Megatron's
optimizer step equal Megatron's, with experts moved and replicas serving tokens; with bf16
weights (the distributed optimizer's separate fp32 main-parameter shards move too) to bf16
precision.
``overlap_grad_reduce``, ``overlap_param_gather``, a DDP holding the spare slots and a move under
the distributed optimizer without it are refused, each with one message."""

from __future__ import annotations

import pytest
import torch

from test_megatron_adapter import run_ranks
from test_replay_balance import check_step, merged

ENABLED = {"RLWEAVE__REPLAY_BALANCE__ENABLE": "true"}


@pytest.fixture(scope="module", params=["optimizer", "distributed_optimizer", "distributed_optimizer_bf16"])
def ranks(request, tmp_path_factory):
    """One run of the four ranks per optimizer (about 20 s on two cores), read by both tests."""
    distributed, bf16 = request.param.startswith("distributed"), request.param.endswith("bf16")
    env = ENABLED | ({"DISTRIBUTED_OPTIMIZER": "1"} if distributed else {}) | ({"BF16": "1"} if bf16 else {})
    runs = run_ranks(4, tmp_path_factory.mktemp(request.param), script="ddp_balance_worker.py", **env)
    assert all(rank["distributed"] == distributed for rank in runs)
    assert all(rank["dtype"] == (torch.bfloat16 if bf16 else torch.float32) for rank in runs)
    return runs


def relative_error(actual, expected):
    actual, expected = actual.float(), expected.float()
    return float((actual - expected).norm() / expected.norm())


def check_bf16_step(ranks, step):
    """One step of an EP group with bf16 weights: outputs and gradients agree to bf16 precision
    (the replicas' share of an expert's tokens is summed in another order). Adam moves an
    element by about ``lr`` whatever its gradient's size, so an element whose gradient is near
    zero may flip sign and end ``2 * lr`` apart; all but a few elements agree within 1e-3 (a
    main parameter left behind by a move puts a whole expert off)."""
    for rank in ranks:
        record = rank["steps"][step]
        for mb in record["micro_batches"]:
            for key in ("output", "input_grad"):
                assert relative_error(mb["rlweave"][key], mb["reference"][key]) < 2e-2
        assert relative_error(record["router_grad"]["rlweave"], record["router_grad"]["reference"]) < 2e-2
        assert record["spare_grads_cleared"]
    ours, reference = (merged(ranks, step, "expert_grads", who) for who in ("rlweave", "reference"))
    assert sorted(ours) == sorted(reference) == list(range(8))
    for e in reference:
        for a, b in zip(ours[e], reference[e], strict=True):
            assert relative_error(a, b) < 2e-2
    ours, reference = (merged(ranks, step, "weights_after_step", who) for who in ("rlweave", "reference"))
    apart = torch.cat([(a.float() - b.float()).abs().reshape(-1)
                       for e in reference for a, b in zip(ours[e], reference[e], strict=True)])
    assert float((apart > 1e-3).float().mean()) < 0.01 and float(apart.max()) <= 2.5e-2


@pytest.mark.timeout(300)
def test_balanced_layer_under_megatron_ddp_and_optimizer_equals_megatron(ranks):
    bf16 = ranks[0]["dtype"] == torch.bfloat16
    for rank in ranks:
        assert rank["spares_outside_ddp"]  # no main_grad buffer for a spare slot
        optimizer = rank["optimizer_params"]
        assert optimizer["rlweave"] == optimizer["reference"]  # owners and router only
    for step in range(3):
        for replica in range(2):
            (check_bf16_step if bf16 else check_step)([rank for rank in ranks if rank["replica"] == replica], step)
        for rank in ranks:
            norm = rank["steps"][step]["grad_norm"]
            torch.testing.assert_close(norm["rlweave"], norm["reference"], rtol=1e-3 if bf16 else 1e-5, atol=1e-6)
    assert any(rank["steps"][0]["moved"] > 0 for rank in ranks)  # experts moved
    assert any(rank["steps"][2]["moved"] > 0 for rank in ranks)  # again, after an optimizer step (Adam state)
    assert sum(sum(rank["spare_tokens"]) for rank in ranks) > 0  # replicas served tokens


@pytest.mark.timeout(300)
def test_settings_the_layer_cannot_run_under_are_refused_with_one_message(ranks):
    overlap, gather, spares, *no_optimizer = ranks[0]["refusals"]
    assert "overlap_grad_reduce=True" in overlap and "set overlap_grad_reduce=False" in overlap
    assert "overlap_param_gather=True" in gather and "set overlap_param_gather=False" in gather
    assert "hold_out_spare_slots(model)" in spares and "release_spare_slots(ddp_chunks)" in spares
    if ranks[0]["distributed"]:
        assert len(no_optimizer) == 1 and "give rebalance_step the optimizer" in no_optimizer[0]
    else:
        assert not no_optimizer
