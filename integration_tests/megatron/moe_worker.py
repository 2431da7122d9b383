"""One rank of a Megatron-core MoE layer on gloo, built through rlweave's spec and through
Megatron's own, with the same weights and input. Writes what it saw to ``<out>/rank<r>.pt``."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

NUM_EXPERTS, TOP_K, HIDDEN = 8, 2, 64


def cpu_shims() -> None:
    """Megatron allocates on ``torch.cuda.current_device()`` (router.py:98, mappings.py); on a
    CPU-only test machine that device is the CPU. Stands in for a GPU, nothing else."""
    torch.cuda.current_device = lambda: "cpu"


def build(config, layer_cls_from_rlweave: bool):
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from rlweave.adapters.megatron import layer_spec, moe_submodules

    if layer_cls_from_rlweave:
        partial = layer_spec(num_experts=NUM_EXPERTS).submodules.mlp
        return partial(config=config)
    return MoELayer(config, submodules=moe_submodules(NUM_EXPERTS))


def run(rank: int, world_size: int, out: str, port: int) -> None:
    cpu_shims()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    from rlweave.host import get_host

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=world_size)
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=128, num_attention_heads=4,
        num_moe_experts=NUM_EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=128,
        moe_token_dispatcher_type="allgather", moe_grouped_gemm=False, add_bias_linear=False,
        use_cpu_initialization=True, params_dtype=torch.float32, gradient_accumulation_fusion=False,
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        expert_model_parallel_size=world_size,
    )
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
    torch.multiprocessing.spawn(run, args=(world_size, out, port), nprocs=world_size)
