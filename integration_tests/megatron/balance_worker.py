"""One rank of ReLibra's Megatron MoE layer against Megatron's own, on gloo.

Both layers get the same logical weights and replay the same skewed routing (hot experts of
EP rank 0, shifting between micro-batches). Two training steps of forward+backward per
micro-batch and an Adam step on both layers. The first step has micro-batch replicas only,
planned inside the forward; before the second, ``rebalance_step`` moves experts between ranks
with their weights and Adam state and copies step replicas (kept for both micro-batches, their
gradients folded into the owners after the second backward), and its micro-batches are planned
ahead with ``prepare_microbatch``. Then an Adam step taken after one of two announced
micro-batches: the next forward and ``rebalance_step`` refuse. Writes ``<out>/rank<r>.pt``.

Usage: balance_worker.py WORLD_SIZE OUT PORT  (BALANCE_DISPATCHER=allgather|alltoall)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from ranks import start_ranks

EXPERTS, TOP_K, HIDDEN, FFN = 8, 2, 32, 64
MICRO_BATCHES, TOKENS = 2, 384  # tokens per micro-batch, whole EP group


def skewed_routing(seed: int, ws: int) -> np.ndarray:
    """Global replayed top-2 ids [M * TOKENS, 2]: 85% of choices go to EP rank 0's block: 60% to
    two hot experts (a different pair each micro-batch) and 25% to the rest of the block, or all
    85% to the pair when the block holds only those two; 15% to the other ranks. Replicas alone cannot even this out (one spare
    slot per rank), so ReLibra's step plan also moves experts."""
    rng = np.random.default_rng(seed)
    block = EXPERTS // ws
    out = []
    for m in range(MICRO_BATCHES):
        hot = [(2 * m) % block, (2 * m + 1) % block] if block > 1 else [0, 1]
        warm = [e for e in range(block) if e not in hot]
        others = EXPERTS - len(hot) - len(warm)  # 0 at EP=1: the block is every expert
        weights = np.full(EXPERTS, 0.15 / max(others, 1))
        weights[hot] = (0.6 if warm else 0.85) / 2
        weights[warm] = 0.25 / max(len(warm), 1)
        p = weights / weights.sum()
        for _ in range(TOKENS):
            out.append(rng.choice(EXPERTS, size=TOP_K, replace=False, p=p))
    return np.array(out)


def local_slice(rows: np.ndarray, rank: int, ws: int) -> np.ndarray:
    """This rank's tokens of each micro-batch, micro-batch after micro-batch."""
    per = TOKENS // ws
    return np.concatenate([rows[m * TOKENS + rank * per : m * TOKENS + (rank + 1) * per]
                           for m in range(MICRO_BATCHES)])


def load_same_weights(reference: torch.nn.Module, ours: torch.nn.Module, gen: torch.Generator) -> None:
    """Give Megatron's MoE layer and ReLibra's the same random router and logical expert weights."""
    router_w = torch.randn(EXPERTS, HIDDEN, generator=gen)
    logical = {e: [torch.randn(FFN, HIDDEN, generator=gen) * 0.1, torch.randn(HIDDEN, FFN, generator=gen) * 0.1]
               for e in range(EXPERTS)}
    with torch.no_grad():
        for layer in (reference, ours):
            layer.router.weight.copy_(router_w)
        for i, e in enumerate(reference.local_expert_indices):
            for p, value in zip(reference.experts.local_experts[i].parameters(), logical[e], strict=True):
                p.copy_(value)
    ours.load_logical_expert_state(logical)


def forward_backward(reference: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    """One micro-batch through both layers (replay data set): output and input gradient of each."""
    mb = {}
    for name, layer in (("reference", reference), ("rlweave", ours)):
        inp = x.clone().requires_grad_(True)
        output, _ = layer(inp)
        (output * g).sum().backward()
        mb[name] = {"output": output.detach(), "input_grad": inp.grad.detach()}
    return mb


def logical_experts(reference: torch.nn.Module, ours: torch.nn.Module, grads: bool = False) -> dict:
    """Both layers' experts owned by this rank, by logical id: their weights, or gradients."""
    return {
        "reference": {e: [(p.grad if grads else p).detach().clone()
                          for p in reference.experts.local_experts[i].parameters()]
                      for i, e in enumerate(reference.local_expert_indices)},
        "rlweave": {e: [t.clone() for t in tensors] for e, tensors in ours.logical_expert_state(grads).items()},
    }


def early_optimizer_step(ours, optimizer, routing: np.ndarray, rank: int, world_size: int) -> list[str]:
    """A step announced with two micro-batches whose optimizer steps after the first: the next
    forward finds the owners' weights changed, and the next rebalance_step finds the step's
    replica gradients unfolded. Returns both errors (none when no step replica was kept)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    from rlweave.adapters.megatron.balanced_moe import rebalance_step

    per = TOKENS // world_size
    rebalance_step(ours, routing[:, None, :], tuple(np.arange(MICRO_BATCHES + 1) * per), optimizer)
    if not ours._step_replicas:
        return []
    errors = []
    for attempt in range(2):
        idx = torch.as_tensor(routing[:per])
        RouterReplay.set_replay_data([idx, idx])
        try:
            output, _ = ours(torch.randn(per // 2, 2, HIDDEN))
            output.sum().backward()
        except RuntimeError as error:
            errors.append(str(error))
        if attempt == 0:
            optimizer.step()  # too early: one of two micro-batches has run
    try:
        rebalance_step(ours, routing[:, None, :], tuple(np.arange(MICRO_BATCHES + 1) * per), optimizer)
    except RuntimeError as error:
        errors.append(str(error))
    return errors


def run(rank: int, world_size: int, out: str, port: int) -> None:
    from rlweave.adapters.megatron.cpu import alltoall_without_cuda_streams, init_expert_parallel, moe_config

    init_expert_parallel(rank, world_size, port)
    dispatcher = os.environ.get("BALANCE_DISPATCHER", "allgather")
    if dispatcher == "alltoall":
        alltoall_without_cuda_streams()
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.adapters.megatron.balanced_moe import prepare_microbatch, rebalance_step

    config = moe_config(EXPERTS, TOP_K, HIDDEN, FFN, world_size, moe_token_dispatcher_type=dispatcher)
    reference = MoELayer(config, submodules=moe_submodules(EXPERTS))
    ours = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config)
    load_same_weights(reference, ours, torch.Generator().manual_seed(1234))
    optimizers = {"reference": torch.optim.Adam(reference.parameters(), lr=1e-2),
                  "rlweave": torch.optim.Adam(ours.parameters(), lr=1e-2)}
    tokens_seen: list[dict] = []
    ours.experts.register_forward_pre_hook(
        lambda module, args: tokens_seen.append({"tokens_per_slot": args[1].clone(),
                                                 "placement": ours.last_physical_to_logical.copy(),
                                                 "share": ours.last_token_share.copy(),
                                                 "step_layout": ours.physical_to_logical.copy()}))
    per = TOKENS // world_size
    results: dict = {"class": type(ours).__name__, "steps": []}
    for step in range(2):
        routing = local_slice(skewed_routing(10 + step, world_size), rank, world_size)
        moved = rebalance_step(ours, routing[:, None, :], tuple(np.arange(MICRO_BATCHES + 1) * per),
                               optimizers["rlweave"]) if step else 0
        record: dict = {"moved": moved, "layout": ours.physical_to_logical.copy(), "micro_batches": []}
        for m in range(MICRO_BATCHES):
            torch.manual_seed(1000 * step + 100 * m + rank)
            x = torch.randn(per // 2, 2, HIDDEN)  # [seq, batch, hidden] -> per tokens
            g = torch.randn(per // 2, 2, HIDDEN)
            idx = torch.as_tensor(routing[m * per : (m + 1) * per])
            RouterReplay.set_replay_data([idx, idx])  # one RouterReplay per layer, in build order
            if step:  # step 1 plans ahead from the replay data; step 0 plans inside the forward
                prepare_microbatch(ours, routing[m * per : (m + 1) * per, None, :])
                assert ours._prepared is not None
            RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            mb = forward_backward(reference, ours, x, g)
            assert ours._prepared is None  # the forward used (and dropped) the prepared plan
            record["micro_batches"].append(mb)
        record["router_grad"] = {"reference": reference.router.weight.grad.clone(),
                                 "rlweave": ours.router.weight.grad.clone()}
        record["expert_grads"] = logical_experts(reference, ours, grads=True)
        record["spare_grads_cleared"] = all(
            p.grad is None for s in range(ours.home_slots, ours.slots_per_rank)
            for p in ours.experts.local_experts[s].parameters())
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        record["weights_after_step"] = logical_experts(reference, ours)
        results["steps"].append(record)
    results["tokens_seen"] = list(tokens_seen)
    results["early_optimizer_step"] = early_optimizer_step(ours, optimizers["rlweave"], routing, rank, world_size)
    # A model with two such layers: one gather hands each layer its own layer's routing.
    pair = torch.nn.ModuleList(layer_spec(num_experts=EXPERTS).submodules.mlp(config=config) for _ in range(2))
    prepare_microbatch(pair, np.stack([routing[:per], routing[per : 2 * per]], axis=1))
    results["two_layer_counts"] = [layer._prepared.counts.sum(dim=0) for layer in pair]
    results["routing"] = [skewed_routing(10 + step, world_size) for step in range(2)]
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
