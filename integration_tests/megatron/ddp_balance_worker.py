"""One rank of ReLibra's layer under Megatron's DistributedDataParallel and optimizer at EP=2 x
expert-data-parallel 2 (four gloo processes), against Megatron's own MoELayer under the same.

Both layers are wrapped in Megatron's DDP (fp32 gradient buffers, no overlap) and stepped by
Megatron's optimizer (``get_megatron_optimizer``: Adam, gradient clipping; the distributed
optimizer with ``DISTRIBUTED_OPTIMIZER=1`` in the environment, else the non-distributed one;
bf16 weights with fp32 main parameters kept by the optimizer with ``BF16=1``, else fp32);
ReLibra's spare slots are held out of both (``balanced_ddp``). Three training steps, as Megatron's
training loop runs them: ``zero_grad_buffer``, ``rebalance_step`` (moves with ``main_grad`` and
Adam state, step replicas), two micro-batches of forward+backward through DDP,
``finalize_model_grads`` (DDP's reduction over the expert-data-parallel group), the optimizer
step. The two EP groups replay different skewed routings (edp_balance_worker); a third step's
makes the homes of step 0's layout hot, so experts move again with Adam state (under the
distributed optimizer: its main-parameter and Adam shards, which the expert-data-parallel ranks
own in other pieces of the new slot). Expert gradients are read after ``finalize_model_grads``
(the non-distributed optimizer: all-reduced) or before it (the distributed one reduce-scatters,
so a slot holds a reduced range only where this rank owns it). Then the refusals:
``overlap_grad_reduce``, ``overlap_param_gather``, a layer DDP wrapped with its spare slots, and
under the distributed optimizer a move without it. Writes ``<out>/rank<r>.pt``.

Usage: ddp_balance_worker.py WORLD_SIZE OUT PORT   (WORLD_SIZE 4)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from balance_worker import EXPERTS, FFN, HIDDEN, TOP_K, load_same_weights
from edp_balance_worker import EP, train_step
from ranks import start_ranks

# Step 0 moves EP rank 0's hot experts 0-3 apart, to the homes [0 2 5 7 | 1 3 4 6]; step 2 makes
# rank 0's new homes hot (0-3 renamed 0 2 5 7), so experts move again, now with Adam state.
HOT_ON_RANK0_HOMES = np.array([0, 2, 5, 7, 1, 3, 4, 6])
DISTRIBUTED = os.environ.get("DISTRIBUTED_OPTIMIZER") == "1"
DTYPE = torch.bfloat16 if os.environ.get("BF16") == "1" else torch.float32


def megatron_stack(module, config, **ddp_settings):
    """Megatron's DDP around ``module`` and Megatron's optimizer over it."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, **ddp_settings)
    ddp = DistributedDataParallel(config, ddp_config, module)
    optimizer_config = OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0, bf16=DTYPE == torch.bfloat16,
                                       fp16=False, params_dtype=DTYPE,
                                       use_distributed_optimizer=ddp_config.use_distributed_optimizer)
    return ddp, get_megatron_optimizer(optimizer_config, [ddp])


def owned_experts(reference, ours, grads: bool = False) -> dict:
    """Both layers' experts owned by this rank, by logical id: weights, or DDP's ``main_grad``."""
    return {
        "reference": {e: [(p.main_grad if grads else p).detach().clone()
                          for p in reference.experts.local_experts[i].parameters()]
                      for i, e in enumerate(reference.local_expert_indices)},
        "rlweave": {e: [t.clone() for t in tensors] for e, tensors in ours.logical_expert_state(grads).items()},
    }


def refusals(config) -> list[str]:
    """What building or running the layer under the settings it cannot support says."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from rlweave.adapters.megatron import layer_spec
    from rlweave.adapters.megatron.balanced_ddp import hold_out_spare_slots, release_spare_slots

    errors = []
    for settings in ({"overlap_grad_reduce": True}, {"use_distributed_optimizer": True, "overlap_param_gather": True}):
        layer = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config)
        hold_out_spare_slots(layer)
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(**settings), layer)
        try:
            release_spare_slots([ddp])
        except NotImplementedError as error:
            errors.append(str(error))
    layer = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), layer)  # spare slots in DDP
    try:
        ddp(torch.randn(4, 2, HIDDEN))
    except NotImplementedError as error:
        errors.append(str(error))
    return errors


def run(rank: int, world_size: int, out: str, port: int) -> None:
    from rlweave.adapters.megatron.cpu import ddp_without_cuda, init_expert_parallel

    init_expert_parallel(rank, world_size, port, ep=EP)
    with ddp_without_cuda():
        train(rank, out)
    dist.destroy_process_group()


def train(rank: int, out: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.adapters.megatron.balanced_ddp import hold_out_spare_slots, release_spare_slots
    from rlweave.adapters.megatron.balanced_moe import _expert_data_parallel_group
    from rlweave.adapters.megatron.cpu import moe_config

    config = moe_config(EXPERTS, TOP_K, HIDDEN, FFN, EP, params_dtype=DTYPE, bf16=DTYPE == torch.bfloat16)
    reference = MoELayer(config, submodules=moe_submodules(EXPERTS))
    ours = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config)
    load_same_weights(reference, ours, torch.Generator().manual_seed(1234))
    for layer in (reference, ours):  # the micro-batches are made in fp32
        layer.register_forward_pre_hook(lambda module, args: (args[0].to(DTYPE), *args[1:]))
    ddp = {"reference": megatron_stack(reference, config, use_distributed_optimizer=DISTRIBUTED)}
    hold_out_spare_slots(ours)
    ddp["rlweave"] = megatron_stack(ours, config, use_distributed_optimizer=DISTRIBUTED)
    release_spare_slots([ddp["rlweave"][0]])
    replica = dist.get_rank(_expert_data_parallel_group(None))
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    spare_tokens = []
    ours.experts.register_forward_pre_hook(
        lambda module, args: spare_tokens.append(int(args[1][ours.home_slots:].sum())))
    results: dict = {
        "replica": replica, "steps": [], "distributed": DISTRIBUTED, "dtype": DTYPE,
        "optimizer_params": {name: sum(len(g["params"]) for g in opt.param_groups) for name, (_, opt) in ddp.items()},
        "spares_outside_ddp": not any(hasattr(p, "main_grad") for p in ours.spare_params()),
    }
    for step in range(3):
        for model, optimizer in ddp.values():
            model.zero_grad_buffer()
            optimizer.zero_grad()
        record = train_step(step, (rank, replica, ep_rank), (ddp["reference"][0], ddp["rlweave"][0]), ours,
                            ddp["rlweave"][1], HOT_ON_RANK0_HOMES if step == 2 else None)
        if DISTRIBUTED:
            record["expert_grads"] = owned_experts(reference, ours, grads=True)
        for model, _ in ddp.values():
            finalize_model_grads([model])
        record["spare_grads_cleared"] = all(p.grad is None for p in ours.spare_params())
        record["router_grad"] = {"reference": reference.router.weight.main_grad.clone(),
                                 "rlweave": ours.router.weight.main_grad.clone()}
        if not DISTRIBUTED:
            record["expert_grads"] = owned_experts(reference, ours, grads=True)
        record["grad_norm"] = {name: optimizer.step()[1] for name, (_, optimizer) in ddp.items()}
        record["weights_after_step"] = owned_experts(reference, ours)
        results["steps"].append(record)
    results["spare_tokens"] = spare_tokens
    results["refusals"] = refusals(config)
    if DISTRIBUTED:
        try:
            layout, homes = ours.physical_to_logical.copy(), ours._home_slot_ids()
            layout[homes] = layout[homes][::-1]
            ours.move_homes(layout)  # no optimizer: the expert's shards would stay behind
        except NotImplementedError as error:
            results["refusals"].append(str(error))
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
