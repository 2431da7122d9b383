"""ReLibra's layers in verl's training engine: verl's own ``make_megatron_module`` (vanilla-mbridge
path, the actor's wrapper config: Megatron DDP with the distributed optimizer) and verl's own
``MegatronEngine._build_optimizer`` keep the layer's spare (replica) slots out of DDP's buffers
and the optimizer once rlweave's layer-spec patch is applied, so the model trains: two steps at
EP 2 x expert-data-parallel 2 (gloo, four CPU processes), every expert moved between them with
its distributed-optimizer shards and micro-batch replicas in the second, equal to upstream's
model built and trained by the same verl functions (fp32 tolerance). The DDP settings the layer
cannot run under are refused at the build, naming verl's key."""

from __future__ import annotations

import pytest
import torch

from test_megatron_adapter import run_ranks
from test_verl_expert_export import close, logical_experts


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(4, tmp_path_factory.mktemp("verl_ddp"), script="verl_ddp_worker.py",
                     RLWEAVE__REPLAY_BALANCE__ENABLE="true")


@pytest.mark.timeout(300)
def test_verls_engine_build_holds_spare_slots_out_of_ddp_and_the_optimizer(ranks):
    for rank in ranks:
        assert rank["classes"] == ["ReplayBalancedMoELayer"] * 2
        # held out while verl's bridge wrapped DDP, released once verl built the optimizer
        assert rank["ddp_states"] == {"built": ["held out"] * 2, "optimizer_built": ["released"] * 2}
        assert rank["spares_outside_ddp"] and rank["spares_train"]
        # the optimizer steps what upstream's does: the owners, no replica slot
        assert rank["optimizer_params"]["rlweave"] == rank["optimizer_params"]["reference"]


@pytest.mark.timeout(300)
def test_verl_built_relibra_model_trains_like_upstreams_with_moves_and_replicas(ranks):
    assert all(rank["moved"] > 0 for rank in ranks)
    assert sum(rank["replica_slots"] for rank in ranks) > 0  # replicas served tokens in the second step
    for step in range(2):
        upstream = logical_experts([rank["steps"][step]["reference"] for rank in ranks], key="experts")
        for rank in ranks:
            ours, reference = rank["steps"][step]["rlweave"], rank["steps"][step]["reference"]
            close(ours["logits"], reference["logits"])
            close(torch.tensor(ours["grad_norm"]), torch.tensor(reference["grad_norm"]))
            assert ours["dense"].keys() == reference["dense"].keys()
            for name, weight in reference["dense"].items():
                close(ours["dense"][name], weight)
            for layer_ours, layer_upstream in zip(ours["experts"], upstream, strict=True):
                assert len(layer_ours) == len(layer_upstream) // 2  # EP 2: half the experts each
                for expert, weights in layer_ours.items():  # wherever the move put it
                    for a, b in zip(weights, layer_upstream[expert], strict=True):
                        close(a, b)
    # the move put experts where upstream's positional layout does not: the check above is by id
    assert any(rank["steps"][1]["rlweave"]["experts"][0].keys() != rank["steps"][1]["reference"]["experts"][0].keys()
               for rank in ranks)


@pytest.mark.timeout(300)
def test_settings_the_layer_cannot_run_under_are_refused_at_verls_build(ranks):
    for rank in ranks:
        ddp, layer_wise = rank["refusals"]
        assert ddp.startswith("rlweave.replay_balance does not support Megatron DDP's overlap_grad_reduce=True")
        assert ddp.endswith("set actor_rollout_ref.actor.megatron.override_ddp_config.overlap_grad_reduce=False "
                            "(critic.megatron.… for a critic)")
        assert "verl's engine asked for use_layer_wise_distributed_optimizer=True" in layer_wise
