"""GPU check for rlweave.replay_balance (prepared like scripts/gpu_check.py; run it after it,
``timeout 300 python3 scripts/gpu_check_replay_balance.py``): ReLibra's Megatron MoE layer on
CUDA with NCCL, EP=1 (one GPU), no CPU shims.

1. Equivalence: Megatron's ``MoELayer`` and ``ReplayBalancedMoELayer`` (replay_balance enabled,
   so the logical->physical remap, the routing gather and the step hook all run on CUDA tensors)
   give equal outputs and gradients under a replayed skewed routing, fp32.
2. Timing (CUDA events, median after warm-up): forward+backward of both layers, i.e. what the
   remap, the EP-group routing gather and the per-micro-batch planner cost on a GPU. EP=1 has no
   other rank to replicate onto, so this is the layer's overhead, not its balancing gain (that
   needs EP >= 2 GPUs).
Writes ``$OUT/gpu_check_replay_balance.json``.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
import torch
import torch.distributed as dist

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 8192, 1024, 2048, 8, 2


def skewed_ids(tokens: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    p = np.ones(EXPERTS)
    p[:2] = 10.0
    ids = np.stack([rng.choice(EXPERTS, TOP_K, replace=False, p=p / p.sum()) for _ in range(tokens)])
    return torch.as_tensor(ids, device="cuda")


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29534", RLWEAVE__REPLAY_BALANCE__ENABLE="true")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.adapters.megatron.balanced_moe import rebalance_step
    from rlweave.adapters.megatron.cpu import moe_config

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)
    config = moe_config(EXPERTS, TOP_K, HIDDEN, FFN, 1, use_cpu_initialization=False, num_attention_heads=16)
    reference = MoELayer(config, submodules=moe_submodules(EXPERTS)).cuda()
    ours = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config).cuda()
    with torch.no_grad():
        ours.router.weight.copy_(reference.router.weight)
    ours.load_logical_expert_state({e: [p.detach() for p in m.parameters()]
                                    for e, m in enumerate(reference.experts.local_experts)})
    ids = skewed_ids(TOKENS)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "class": type(ours).__name__,
               "experts_moved": rebalance_step(ours, ids.cpu().numpy()[:, None, :], (0, TOKENS))}
    x = torch.randn(TOKENS // 2, 2, HIDDEN, device="cuda")

    def fwd_bwd(layer) -> tuple[torch.Tensor, torch.Tensor]:
        RouterReplay.set_replay_data([ids, ids])  # one RouterReplay per layer, in build order
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        inp = x.clone().requires_grad_(True)
        out, _ = layer(inp)
        out.square().mean().backward()
        return out.detach(), inp.grad.detach()

    (o1, g1), (o2, g2) = fwd_bwd(reference), fwd_bwd(ours)
    ours_grads = ours.logical_expert_state(grads=True)
    expert_diff = max(float((a.grad - b).abs().max()) for e, m in enumerate(reference.experts.local_experts)
                      for a, b in zip(m.parameters(), ours_grads[e], strict=True))
    results.update(outputs_max_abs_diff=float((o1 - o2).abs().max()), input_grads_max_abs_diff=float((g1 - g2).abs().max()),
                   expert_grads_max_abs_diff=expert_diff)
    times = {}
    for name, layer in (("megatron", reference), ("rlweave", ours)):
        samples = []
        for i in range(25):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fwd_bwd(layer)
            end.record()
            torch.cuda.synchronize()
            if i >= 5:
                samples.append(start.elapsed_time(end))
            layer.zero_grad(set_to_none=True)
        times[name] = statistics.median(samples)
    results.update(megatron_fwd_bwd_ms=times["megatron"], rlweave_fwd_bwd_ms=times["rlweave"],
                   rlweave_vs_megatron_time=times["rlweave"] / times["megatron"],
                   shape={"tokens": TOKENS, "hidden": HIDDEN, "ffn": FFN, "experts": EXPERTS, "top_k": TOP_K,
                          "dtype": "fp32", "ep": 1})
    print(json.dumps(results, indent=2))
    with open(os.path.join(os.environ.get("OUT", "."), "gpu_check_replay_balance.json"), "w") as f:
        json.dump(results, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
