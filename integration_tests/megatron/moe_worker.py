"""One rank of a Megatron-core MoE layer on gloo, built through rlweave's spec and through
Megatron's own, with the same weights and input. Writes what it saw to ``<out>/rank<r>.pt``."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ranks import start_ranks

NUM_EXPERTS, TOP_K, HIDDEN = 8, 2, 64


def build(config, layer_cls_from_rlweave: bool):
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from rlweave.adapters.megatron import layer_spec, moe_submodules

    if layer_cls_from_rlweave:
        partial = layer_spec(num_experts=NUM_EXPERTS).submodules.mlp
        return partial(config=config)
    return MoELayer(config, submodules=moe_submodules(NUM_EXPERTS))


def run(rank: int, world_size: int, out: str, port: int) -> None:
    from rlweave.adapters.megatron.cpu import init_expert_parallel, moe_config
    from rlweave.host import get_host

    init_expert_parallel(rank, world_size, port)
    config = moe_config(NUM_EXPERTS, TOP_K, HIDDEN, 128, world_size, moe_enable_routing_replay=False)
    torch.manual_seed(1234)
    reference = build(config, layer_cls_from_rlweave=False)
    ours = build(config, layer_cls_from_rlweave=True)
    ours.load_state_dict(reference.state_dict())
    torch.manual_seed(100 + rank)
    x = torch.randn(16, 2, HIDDEN)
    results = {"class": type(ours).__name__, "host_active": get_host().active}
    for name, layer in (("reference", reference), ("rlweave", ours)):
        inp = x.clone().requires_grad_(True)
        output, _ = layer(inp)
        output.square().sum().backward()
        results[name] = {
            "output": output.detach(),
            "input_grad": inp.grad.detach(),
            "param_grads": {n: p.grad.detach().clone() for n, p in layer.named_parameters()},
        }
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
