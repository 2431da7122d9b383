"""ReLibra's layer under Megatron's DistributedDataParallel and optimizer (EP=2 x expert-data-
parallel 2, four gloo processes), against Megatron's MoELayer under the same, with Megatron's
non-distributed and distributed optimizer: spare slots are out of DDP's buffers and the
optimizer, replica gradients land in the owners' ``main_grad`` before ``finalize_model_grads``
reduces them, and moves carry ``main_grad`` and Adam state (the distributed optimizer's fp32
main-parameter and Adam shards, owned by other expert-data-parallel ranks at the new slot);
outputs, input, router and expert gradients, the gradient norm and the weights after Megatron's
optimizer step equal Megatron's, with experts moved and replicas serving tokens.
``overlap_grad_reduce``, ``overlap_param_gather``, a DDP holding the spare slots and a move under
the distributed optimizer without it are refused, each with one message."""

from __future__ import annotations

import pytest
import torch

from test_megatron_adapter import run_ranks
from test_replay_balance import check_step

ENABLED = {"RLWEAVE__REPLAY_BALANCE__ENABLE": "true"}


@pytest.fixture(scope="module", params=["optimizer", "distributed_optimizer"])
def ranks(request, tmp_path_factory):
    """One run of the four ranks per optimizer (about a minute on two cores), read by both tests."""
    env = ENABLED | ({"DISTRIBUTED_OPTIMIZER": "1"} if request.param == "distributed_optimizer" else {})
    runs = run_ranks(4, tmp_path_factory.mktemp(request.param), script="ddp_balance_worker.py", **env)
    assert all(rank["distributed"] == (request.param == "distributed_optimizer") for rank in runs)
    return runs


@pytest.mark.timeout(300)
def test_balanced_layer_under_megatron_ddp_and_optimizer_equals_megatron(ranks):
    for rank in ranks:
        assert rank["spares_outside_ddp"]  # no main_grad buffer for a spare slot
        optimizer = rank["optimizer_params"]
        assert optimizer["rlweave"] == optimizer["reference"]  # owners and router only
    for step in range(3):
        for replica in range(2):
            check_step([rank for rank in ranks if rank["replica"] == replica], step)
        for rank in ranks:
            norm = rank["steps"][step]["grad_norm"]
            torch.testing.assert_close(norm["rlweave"], norm["reference"], rtol=1e-5, atol=1e-6)
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
