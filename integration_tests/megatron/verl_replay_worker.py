"""One rank of verl's router replay driving ReLibra's Megatron MoE layers, on gloo.

``import verl`` loads rlweave through verl's entry point, which applies
``rlweave.patches.verl_router_replay_hooks`` (``rlweave.replay_balance`` is enabled). Then
verl's own functions hand the routing over as its Megatron engine does in a training call:
``make_batch_generator`` with the step's micro-batches (their jagged ``routed_experts``),
and per micro-batch ``set_router_replay_data(..., model=chunk)`` before the forward under
``REPLAY_FORWARD``. The engine itself is mocked (its model, config and optimizer in a
namespace, marked as in a training call): verl's Megatron worker needs a GPU.

A chunk of two ReLibra layers runs against a chunk of two Megatron ``MoELayer`` with the same
logical weights; both get the same replay data through the same verl function. Two steps, each
ending with an Adam step. Writes ``<out>/rank<r>.pt``.

Usage: verl_replay_worker.py WORLD_SIZE OUT PORT
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import torch
import torch.distributed as dist

from balance_worker import (
    EXPERTS,
    FFN,
    HIDDEN,
    MICRO_BATCHES,
    TOKENS,
    TOP_K,
    load_same_weights,
    local_slice,
    skewed_routing,
)
from ranks import start_ranks

LAYERS = 2


class Chunk(torch.nn.Module):
    """A model chunk as verl walks it: MoE layers under ``decoder``, numbered from 1."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.decoder = torch.nn.ModuleList(layers)
        for number, layer in enumerate(layers, start=1):
            layer.set_layer_number(number)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.decoder:
            hidden = hidden + layer(hidden)[0]
        return hidden


def micro_batches(step: int, rank: int, world_size: int) -> list:
    """This rank's micro-batches as verl's engine holds them: jagged ``routed_experts``
    [sequences, tokens, layers, k], two sequences per micro-batch; layer l replays its own
    skewed routing, hot on EP rank 0's experts in step 0 and on the next half in step 1 (so both
    steps move experts, the second with Adam state)."""
    from tensordict import TensorDict

    per_layer = [local_slice(skewed_routing(10 + step + 5 * layer, world_size), rank, world_size)
                 for layer in range(LAYERS)]
    routes = (np.stack(per_layer, axis=1) + step * EXPERTS // 2) % EXPERTS  # [M * per, layers, k]
    per = TOKENS // world_size
    out = []
    for m in range(MICRO_BATCHES):
        rows = torch.as_tensor(routes[m * per : (m + 1) * per])
        cut = per // 3 + 8 * m
        seqs = torch.nested.as_nested_tensor([rows[:cut], rows[cut:]], layout=torch.jagged)
        out.append(TensorDict({"routed_experts": seqs}, batch_size=[2]))
    return out


def r3_micro_batch(engine_module, config, reference, ours, rank: int, world_size: int) -> dict:
    """One R3 micro-batch as verl's forward_step sets it: rollout routes (one row short per
    sequence) aligned and masked by verl, so the last row of each sequence keeps the router's
    own choice and ReLibra plans inside the forward instead of ahead."""
    from verl.utils.megatron.router_replay_patch import RouterReplay, RouterReplayAction
    from verl.utils.megatron.router_replay_utils import align_r3_router_replay_data, build_r3_replay_mask

    routes = micro_batches(0, rank, world_size)[0]["routed_experts"]
    rollout = torch.nested.as_nested_tensor([seq[:-1] for seq in routes.unbind()], layout=torch.jagged)
    input_ids = torch.nested.as_nested_tensor([torch.zeros(len(seq), dtype=torch.int64) for seq in routes.unbind()],
                                              layout=torch.jagged)
    aligned = align_r3_router_replay_data(rollout, input_ids)
    mask = build_r3_replay_mask(input_ids, torch.ones(2, 8, dtype=torch.int64))
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    for chunk in (reference, ours):
        engine_module.set_router_replay_data(aligned, None, config, 0, replay_mask=mask, model=chunk)
    result: dict = {"planned_ahead": [layer._prepared is not None for layer in ours.decoder]}
    x = torch.randn(len(aligned.values()), 1, HIDDEN, generator=torch.Generator().manual_seed(rank))
    for name, chunk in (("reference", reference), ("rlweave", ours)):
        result[name] = chunk(x).detach()
    RouterReplay.clear_global_indices()
    RouterReplay.clear_global_router_replay_action()
    return result


def run(rank: int, world_size: int, out: str, port: int) -> None:
    import verl  # noqa: F401  (verl.plugins entry point: rlweave's adapter applies its patches)

    from rlweave.adapters.megatron.cpu import init_expert_parallel, moe_config

    init_expert_parallel(rank, world_size, port)
    import verl.workers.engine.megatron.transformer_impl as engine_module
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from verl.utils.megatron import router_replay_utils
    from verl.utils.megatron.router_replay_patch import RouterReplay, RouterReplayAction, apply_router_replay_patch

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.patches.verl_router_replay_hooks import training_call

    apply_router_replay_patch()  # what verl's MegatronEngine does when router replay is on
    config = moe_config(EXPERTS, TOP_K, HIDDEN, FFN, world_size, num_layers=LAYERS)
    reference = Chunk([MoELayer(config, submodules=moe_submodules(EXPERTS)) for _ in range(LAYERS)])
    ours = Chunk([layer_spec(num_experts=EXPERTS).submodules.mlp(config=config) for _ in range(LAYERS)])
    gen = torch.Generator().manual_seed(1234)
    for ref_layer, our_layer in zip(reference.decoder, ours.decoder, strict=True):
        load_same_weights(ref_layer, our_layer, gen)
    optimizers = {"reference": torch.optim.Adam(reference.parameters(), lr=1e-2),
                  "rlweave": torch.optim.Adam(ours.parameters(), lr=1e-2)}
    engine = types.SimpleNamespace(module=[ours], tf_config=config, optimizer=optimizers["rlweave"])
    replica_tokens = [0]

    def count_replica_tokens(module: torch.nn.Module, args: tuple) -> None:
        layer = next(m for m in ours.decoder if m.experts is module)
        replica_tokens[0] += int(args[1][layer.home_slots:].sum())

    for layer in ours.decoder:
        layer.experts.register_forward_pre_hook(count_replica_tokens)

    # The engine's name for verl's function now runs verl's own one, then rlweave's planning.
    wrapped = getattr(engine_module.set_router_replay_data, "__wrapped__", None)
    results: dict = {"patched": wrapped is router_replay_utils.set_router_replay_data, "steps": []}
    for step in range(2):
        batches = micro_batches(step, rank, world_size)
        owners_before = [layer.owner_slot() for layer in ours.decoder]
        with training_call(engine):  # the mocked engine's forward_backward_batch(forward_only=False)
            iterator = engine_module.make_batch_generator(batches, vpp_size=1)
        moved = sum(int((before != layer.owner_slot()).any())
                    for before, layer in zip(owners_before, ours.decoder, strict=True))
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        record: dict = {"layers_moved": moved, "step_replicas": sum(len(layer._step_replicas) for layer in ours.decoder),
                        "micro_batches": []}
        for m, batch in enumerate(iterator):
            for chunk in (reference, ours):
                engine_module.set_router_replay_data(batch["routed_experts"], None, config, 0, model=chunk)
            planned = [layer._prepared is not None for layer in ours.decoder]
            tokens = ours.decoder[0].router.router_replay.target_topk_idx.shape[0]
            torch.manual_seed(1000 * step + 100 * m + rank)
            x, g = torch.randn(tokens, 1, HIDDEN), torch.randn(tokens, 1, HIDDEN)
            mb: dict = {"planned_ahead": planned}
            for name, chunk in (("reference", reference), ("rlweave", ours)):
                inp = x.clone().requires_grad_(True)
                output = chunk(inp)
                (output * g).sum().backward()
                mb[name] = {"output": output.detach(), "input_grad": inp.grad.detach()}
            record["micro_batches"].append(mb)
        record["step_replicas_left"] = sum(len(layer._step_replicas) for layer in ours.decoder)
        RouterReplay.clear_global_indices()
        RouterReplay.clear_global_router_replay_action()
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        record["weights_after_step"] = {
            "reference": [{e: [p.detach().clone() for p in layer.experts.local_experts[i].parameters()]
                           for i, e in enumerate(layer.local_expert_indices)} for layer in reference.decoder],
            "rlweave": [{e: [p.clone() for p in params] for e, params in layer.logical_expert_state().items()}
                        for layer in ours.decoder],
        }
        results["steps"].append(record)
    results["replica_tokens"] = replica_tokens[0]
    results["r3"] = r3_micro_batch(engine_module, config, reference, ours, rank, world_size)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
