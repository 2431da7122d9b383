"""verl's router replay drives ReLibra's Megatron MoE layers (rlweave.replay_balance enabled):
verl's own ``make_batch_generator`` and ``set_router_replay_data`` hand a step's and each
micro-batch's routing over, the plan is applied (experts moved and step replicas copied before
the step, replicas planned ahead per micro-batch and taking tokens), and outputs, input gradients and weights
after Adam equal Megatron's own MoE layers on gloo with EP=2 (CPU processes). verl's
Megatron engine is mocked: a namespace with the model, config and optimizer, marked as in a
training call (its worker needs a GPU). Under R3's replay mask the layers plan in their forward
instead, with the same result; with the flag off verl's functions are untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from test_megatron_adapter import run_ranks


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
def test_verl_router_replay_plans_and_matches_megatron_mocked_verl_engine(tmp_path):
    ranks = run_ranks(2, tmp_path, script="verl_replay_worker.py", VERL_PLATFORM="cpu",
                      RLWEAVE__REPLAY_BALANCE__ENABLE="true", RLWEAVE__REPLAY_BALANCE__RANKS_PER_NODE="2")
    assert all(rank["patched"] for rank in ranks)  # applied by rlweave's verl entry point
    for step in range(2):
        for rank in ranks:
            record = rank["steps"][step]
            for mb in record["micro_batches"]:
                assert all(mb["planned_ahead"])  # by set_router_replay_data, before the forward
                close(mb["rlweave"]["output"], mb["reference"]["output"])
                close(mb["rlweave"]["input_grad"], mb["reference"]["input_grad"])
        for layer in range(2):
            ours, reference = {}, {}
            for rank in ranks:
                ours.update(rank["steps"][step]["weights_after_step"]["rlweave"][layer])
                reference.update(rank["steps"][step]["weights_after_step"]["reference"][layer])
            assert sorted(ours) == sorted(reference) == list(range(8))
            for e in reference:
                for a, b in zip(ours[e], reference[e], strict=True):
                    close(a, b)
    # The step tier acted before each step: it moved experts (the second time with their Adam
    # state) or kept step replicas, whose gradients reached the owners before verl's optimizer step.
    for step in range(2):
        assert all(rank["steps"][step]["layers_moved"] or rank["steps"][step]["step_replicas"] for rank in ranks)
        assert all(rank["steps"][step]["step_replicas_left"] == 0 for rank in ranks)
    assert any(rank["steps"][step]["layers_moved"] for rank in ranks for step in range(2))
    assert any(rank["steps"][step]["step_replicas"] for rank in ranks for step in range(2))
    assert sum(rank["replica_tokens"] for rank in ranks) > 0  # and replicas took tokens
    for rank in ranks:  # R3: the replay mask leaves rows to the router, so the layers plan in the forward
        assert not any(rank["r3"]["planned_ahead"])
        close(rank["r3"]["rlweave"], rank["r3"]["reference"])


@pytest.mark.timeout(120)
def test_disabled_leaves_verls_router_replay_unpatched():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    code = ("import verl, verl.workers.engine.megatron.transformer_impl as m, "
            "verl.utils.megatron.router_replay_utils as u; "
            "assert m.set_router_replay_data is u.set_router_replay_data; "
            "assert m.make_batch_generator.__module__ == 'verl.utils.megatron.pipeline_parallel'; "
            "assert m.MegatronEngine.forward_backward_batch.__module__ == m.__name__")
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env | {"VERL_PLATFORM": "cpu"},
                   check=True, timeout=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("replaying", "forward_only", "step_tier"), [(True, False, True), (True, True, False),
                                                                      (False, False, False)])
def test_only_a_training_call_of_a_replaying_engine_rebalances(monkeypatch, replaying, forward_only, step_tier):
    """verl's forward_backward_batch stands in as a fake that hands two micro-batches to
    (patched) make_batch_generator, as the real one does; the step tier runs for training calls
    of an engine that replays routing, never for forward-only ones (log-probs)."""
    import verl.workers.engine.megatron.transformer_impl as impl

    from rlweave.adapters.verl import router_replay
    from rlweave.patches import verl_router_replay_hooks

    calls = []
    monkeypatch.setattr(router_replay, "rebalance_before_step", lambda *args: calls.append(args))
    monkeypatch.setattr(impl.MegatronEngine, "forward_backward_batch",
                        lambda self, data, loss_function, forward_only=False: impl.make_batch_generator(data, 1))
    revert = verl_router_replay_hooks.apply()
    try:
        engine = types.SimpleNamespace(enable_routing_replay=replaying, module=["chunk"], tf_config="cfg",
                                       optimizer="opt")
        batches = impl.MegatronEngine.forward_backward_batch(engine, ["mb0", "mb1"], None, forward_only)
        assert list(batches) == ["mb0", "mb1"]  # verl's make_batch_generator still builds the iterator
    finally:
        revert()
    assert calls == ([(["chunk"], ["mb0", "mb1"], "cfg", "opt")] if step_tier else [])


def test_a_verl_model_without_relibra_layers_is_refused_not_left_unbalanced():
    """verl 0.9 builds its Megatron model from Megatron's own spec: with the plugin on, the step
    stops with the cause and the fix instead of training unbalanced as if nothing were enabled."""
    from rlweave.adapters.verl import router_replay

    with pytest.raises(RuntimeError, match="no ReplayBalancedMoELayer.*layer_spec"):
        router_replay.rebalance_before_step(torch.nn.Linear(2, 2), [{"routed_experts": None}], None)
