"""One rank of ReLibra's layer at EP=2 x expert-data-parallel 2 (four gloo processes) against
Megatron's own MoELayer on the same process groups.

The two EP groups (data-parallel replicas) replay different skewed routings: replica 0's hot
experts are 0 and 1 in its first micro-batch, replica 1's are 2 and 3 (both in EP rank 0's
block), so each group alone would plan a different layout. Two training steps, each begun by
``rebalance_step`` (moves and step replicas), two micro-batches of forward+backward, then
what Megatron's DDP does: expert gradients averaged over the expert-data-parallel group, the
router's over all ranks; then Adam on both layers. Writes ``<out>/rank<r>.pt``.

Usage: edp_balance_worker.py WORLD_SIZE OUT PORT   (WORLD_SIZE 4)
"""

from __future__ import annotations

import os
import sys

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
    forward_backward,
    load_same_weights,
    logical_experts,
    skewed_routing,
)
from ranks import start_ranks

EP = 2
SWAP = np.array([2, 3, 0, 1, 4, 5, 6, 7])  # replica 1: the other pair of EP rank 0's block is hot first


def replica_routing(step: int, replica: int) -> np.ndarray:
    """The EP group's replayed top-2 ids [M * TOKENS, 2] of one step."""
    rows = skewed_routing(10 + step + 100 * replica, EP)
    return SWAP[rows] if replica else rows


def average(params: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """What Megatron's DDP does to a gradient: the mean over the ranks of ``group`` (a parameter
    without one has a zero gradient buffer there)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
        p.grad /= dist.get_world_size(group)


def train_step(step: int, where: tuple[int, int, int], layers: tuple, balanced, optimizer,
               relabel: np.ndarray | None = None) -> dict:
    """One step on this rank (``where``: global rank, replica, EP rank): ``rebalance_step`` of the
    ReLibra layer ``balanced`` with ``optimizer``, then each micro-batch's forward+backward through
    ``layers`` (Megatron's and ReLibra's, or their DDP wrappers). ``relabel`` renames the experts
    of the step's routing. Returns the step's record."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from rlweave.adapters.megatron.balanced_moe import rebalance_step

    rank, replica, ep_rank = where
    per = TOKENS // EP
    rows = replica_routing(step, replica)
    rows = rows if relabel is None else relabel[rows]
    local = np.concatenate([rows[m * TOKENS + ep_rank * per: m * TOKENS + (ep_rank + 1) * per]
                            for m in range(MICRO_BATCHES)])
    moved = rebalance_step(balanced, local[:, None, :], tuple(np.arange(MICRO_BATCHES + 1) * per), optimizer)
    record: dict = {"moved": moved, "layout": balanced.physical_to_logical.copy(), "micro_batches": []}
    for m in range(MICRO_BATCHES):
        torch.manual_seed(1000 * step + 100 * m + rank)
        x, g = torch.randn(per // 2, 2, HIDDEN), torch.randn(per // 2, 2, HIDDEN)
        idx = torch.as_tensor(local[m * per:(m + 1) * per])
        RouterReplay.set_replay_data([idx, idx])  # one RouterReplay per layer, in build order
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        record["micro_batches"].append(forward_backward(*layers, x, g))
    return record


def run(rank: int, world_size: int, out: str, port: int) -> None:
    from rlweave.adapters.megatron.cpu import init_expert_parallel, moe_config

    init_expert_parallel(rank, world_size, port, ep=EP)
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.adapters.megatron.balanced_moe import _expert_data_parallel_group

    config = moe_config(EXPERTS, TOP_K, HIDDEN, FFN, EP)
    reference = MoELayer(config, submodules=moe_submodules(EXPERTS))
    ours = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config)
    load_same_weights(reference, ours, torch.Generator().manual_seed(1234))
    optimizers = {"reference": torch.optim.Adam(reference.parameters(), lr=1e-2),
                  "rlweave": torch.optim.Adam(ours.parameters(), lr=1e-2)}
    expt_dp = _expert_data_parallel_group(None)  # Megatron's, on 0.18 and 0.19 alike
    replica = dist.get_rank(expt_dp)  # which EP group (data-parallel replica) this rank is in
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    spare_tokens = []
    ours.experts.register_forward_pre_hook(
        lambda module, args: spare_tokens.append(int(args[1][ours.home_slots:].sum())))
    results: dict = {"expt_dp_ranks": dist.get_process_group_ranks(expt_dp), "replica": replica, "steps": []}
    for step in range(2):
        record = train_step(step, (rank, replica, ep_rank), (reference, ours), ours, optimizers["rlweave"])
        record["spare_grads_cleared"] = all(
            p.grad is None for s in range(ours.home_slots, ours.slots_per_rank)
            for p in ours.experts.local_experts[s].parameters())
        average(list(reference.experts.parameters()), expt_dp)
        average([p for s in range(ours.home_slots) for p in ours.experts.local_experts[s].parameters()], expt_dp)
        average([reference.router.weight, ours.router.weight], dist.group.WORLD)
        record["router_grad"] = {"reference": reference.router.weight.grad.clone(),
                                 "rlweave": ours.router.weight.grad.clone()}
        record["expert_grads"] = logical_experts(reference, ours, grads=True)
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        record["weights_after_step"] = logical_experts(reference, ours)
        results["steps"].append(record)
    results["spare_tokens"] = spare_tokens
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
