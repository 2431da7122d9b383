"""GPU check, run on a lent NVIDIA machine (see scripts/gpu_check.sh): rlweave's Megatron MoE
layer on CUDA with NCCL, no CPU shims.

1. Equivalence: Megatron's ``MoELayer`` and rlweave's ``RlweaveMoELayer`` (built through
   ``rlweave.adapters.megatron.layer_spec`` with a routing listener registered) give identical
   outputs and gradients on the same weights and input.
2. Timing (CUDA events, median of timed iterations after warm-up): forward+backward of both
   layers, i.e. what the routing hook costs on a GPU when a plugin listens (it copies each
   layer's routing to the host).
Writes ``$OUT/gpu_check.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import types

import torch
import torch.distributed as dist

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 8192, 2048, 2048, 8, 2


def listener_plugin() -> types.ModuleType:
    from rlweave.hookspecs import hookimpl

    plugin = types.ModuleType("gpu_check_routing_listener")
    plugin.calls = 0

    @hookimpl
    def rlweave_routing_recorded(trace):  # noqa: ANN001
        plugin.calls += 1

    plugin.rlweave_routing_recorded = rlweave_routing_recorded
    sys.modules[plugin.__name__] = plugin
    return plugin


def timed(layer, x, iters: int = 30, warmup: int = 5) -> float:
    times = []
    for i in range(warmup + iters):
        inp = x.detach().clone().requires_grad_(True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out, _ = layer(inp)
        out.float().square().mean().backward()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
        layer.zero_grad(set_to_none=True)
    return statistics.median(times)


def main() -> None:
    plugin = listener_plugin()
    os.environ["RLWEAVE_PLUGIN_MODULES"] = plugin.__name__
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from rlweave.adapters.megatron import layer_spec, moe_submodules
    from rlweave.host import get_host

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)  # Megatron's CUDA RNG trackers (expert-parallel too)
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=16,
        num_moe_experts=EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=FFN,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, add_bias_linear=False,
        params_dtype=torch.bfloat16, bf16=True, gradient_accumulation_fusion=False,
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
    )
    torch.manual_seed(0)
    reference = MoELayer(config, submodules=moe_submodules(EXPERTS)).cuda()
    ours = layer_spec(num_experts=EXPERTS).submodules.mlp(config=config).cuda()
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(TOKENS // 2, 2, HIDDEN, device="cuda", dtype=torch.bfloat16)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "class": type(ours).__name__, "host_active": get_host().active}
    grads = {}
    for name, layer in (("megatron", reference), ("rlweave", ours)):
        inp = x.clone().requires_grad_(True)
        out, _ = layer(inp)
        out.float().square().mean().backward()
        grads[name] = (out.detach(), inp.grad.detach(), {n: p.grad.detach().clone() for n, p in layer.named_parameters()})
        layer.zero_grad(set_to_none=True)
    (o1, g1, p1), (o2, g2, p2) = grads["megatron"], grads["rlweave"]
    results["outputs_equal"] = bool(torch.equal(o1, o2))
    results["input_grads_equal"] = bool(torch.equal(g1, g2))
    results["param_grads_max_abs_diff"] = max(float((p1[k].float() - p2[k].float()).abs().max()) for k in p1)
    calls_before = plugin.calls
    results["megatron_fwd_bwd_ms"] = timed(reference, x)
    results["rlweave_fwd_bwd_ms_with_routing_listener"] = timed(ours, x)
    results["routing_hook_calls"] = plugin.calls - calls_before
    results["rlweave_vs_megatron_time"] = results["rlweave_fwd_bwd_ms_with_routing_listener"] / results["megatron_fwd_bwd_ms"]
    results["shape"] = {"tokens": TOKENS, "hidden": HIDDEN, "ffn": FFN, "experts": EXPERTS, "top_k": TOP_K, "dtype": "bf16"}
    from rlweave.benchmarks.moe_gpu_calibration import calibrate_token_s

    # The replay_balance cost model's per-token expert time (CostModel.token_s), measured.
    results["replay_balance_token_calibration"] = calibrate_token_s()
    print(json.dumps(results, indent=2))
    with open(os.path.join(os.environ.get("OUT", "."), "gpu_check.json"), "w") as f:
        json.dump(results, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
