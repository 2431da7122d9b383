"""verl's own Megatron model build (``make_megatron_module``, vanilla-mbridge path, as its engine
calls it with ``vanilla_mbridge=True``) builds rlweave's layers once rlweave's verl entry point
has applied ``rlweave.patches.verl_megatron_layer_spec`` (replay_balance or overlap enabled), and
upstream's with both off. With ReLibra's layers, one forward and backward equals upstream's
model with the same weights (gloo, EP=2, CPU processes; no expert moves, micro-batch replicas
only). TransformerEngine, which mbridge's own spec needs, cannot be installed on CPU: the
worker's unpatched builds take the local backend in its place (``te_stand_in``), and the patch
does the same where TE is absent. The patch's Megatron-Bridge branch runs on a stand-in provider
only: Megatron-Bridge needs Python 3.12 and CUDA packages; verl's Megatron-Bridge build is refused
while ReLibra places experts (positional expert names), not with overlap alone."""

from __future__ import annotations

import pytest
import torch

from rlweave.patches.verl_megatron_layer_spec import MEGATRON_BRIDGE_NAMES
from test_megatron_adapter import run_ranks

def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(300)
def test_replay_balance_layers_built_by_verls_mbridge_path_equal_upstreams_model(tmp_path):
    ranks = run_ranks(2, tmp_path, script="verl_layer_spec_worker.py", RLWEAVE__REPLAY_BALANCE__ENABLE="true")
    for rank in ranks:
        assert rank["patched"]  # by rlweave's verl entry point
        assert rank["classes"]["mlp"] == ["ReplayBalancedMoELayer"] * 2
        assert rank["classes_reference"]["mlp"] == ["MoELayer"] * 2
        # upstream's weights load strictly: the spare slots (replicas) have nothing to load
        assert rank["unexpected"] == [] and rank["missing"] == []
        assert rank["homes"] == [[0, 1, -1, 2, 3, -1]] * 2  # Megatron's layout: no expert moved
        # the Megatron-Bridge branch (provider.transformer_layer_spec), on a stand-in provider
        assert rank["megatron_bridge"] == {"mlp": ["ReplayBalancedMoELayer"] * 2, "restored": True}
        # ... which verl's build does not reach while experts move: Megatron-Bridge names them by position
        assert rank["megatron_bridge_build"] == f"NotImplementedError: {MEGATRON_BRIDGE_NAMES}"
        close(rank["rlweave"]["logits"], rank["reference"]["logits"])
        assert rank["rlweave"]["grads"].keys() == rank["reference"]["grads"].keys()
        for name, grad in rank["reference"]["grads"].items():
            close(rank["rlweave"]["grads"][name], grad)
    assert sum(rank["replica_slots"] for rank in ranks) > 0  # a replica took part in the step


@pytest.mark.timeout(300)
def test_overlap_linears_built_by_verls_mbridge_path(tmp_path):
    [rank] = run_ranks(1, tmp_path, script="verl_layer_spec_worker.py", RLWEAVE__OVERLAP__ENABLE="true")
    assert rank["patched"]
    assert rank["classes"]["mlp"] == ["MoELayer"] * 2
    # every spec linear is overlap's; GPTModel builds its output layer itself, outside the spec
    assert rank["classes"]["linears"] == ["ColumnParallelLinear", "OverlapColumnParallelLinear",
                                          "OverlapRowParallelLinear"]
    # overlap alone is not refused on Megatron-Bridge's path: verl goes on to import it (absent here)
    assert "megatron.bridge" in rank["megatron_bridge_build"]
    assert MEGATRON_BRIDGE_NAMES not in rank["megatron_bridge_build"]


@pytest.mark.timeout(300)
def test_disabled_leaves_verls_model_build_to_upstream(tmp_path):
    [rank] = run_ranks(1, tmp_path, script="verl_layer_spec_worker.py")
    assert not rank["patched"]
    assert rank["classes"] == {"mlp": ["MoELayer"] * 2, "linears": ["ColumnParallelLinear", "RowParallelLinear"]}


@pytest.mark.timeout(300)
def test_replay_balance_on_a_dense_model_is_refused_at_the_build(tmp_path):
    [rank] = run_ranks(1, tmp_path, script="verl_layer_spec_worker.py", TINY_MODEL="tiny-llama",
                       RLWEAVE__REPLAY_BALANCE__ENABLE="true")
    assert rank["error"] == (
        "NotImplementedError: rlweave: mbridge's layer spec (_get_transformer_layer_spec) has no MoELayer for "
        "ReplayBalancedMoELayer to replace (rlweave.replay_balance balances the experts of Megatron's MoE layers; "
        "the model has none); use a MoE model or disable rlweave.replay_balance")
