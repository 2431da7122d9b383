"""The CPU part of ``rlweave bench overlap``: one rank of a TP=2 gloo group (run as
``python -m rlweave.benchmarks.overlap_cpu WORLD OUT PORT``).

Megatron's ColumnParallelLinear / RowParallelLinear and rlweave's (through the overlap plugin,
``backend=ring``, 2 pieces per 5-row shard) on the same weights and inputs, fp32: outputs and
gradients compared; forward+backward timed, interleaved (reported, and meaningless as overlap
figures: both cores compute and gloo's loopback copies need the same cores). It also measures
this machine's profile for the timeline model: GEMM time over m, and gloo point-to-point time
over message size. Rank 0 writes ``<OUT>/overlap-cpu.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

SHARD, BATCH, HIDDEN, FFN_PER_RANK = 5, 3, 36, 14


def fwd_bwd(layer, x: torch.Tensor) -> dict:
    inp = x.clone().requires_grad_(True)
    out, _ = layer(inp)
    out.square().sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    return {"out": out.detach(), "dx": inp.grad.detach(), **grads}


def equal_and_timed(world: int, rank: int) -> dict:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from rlweave.adapters.megatron.overlap.cpu import tp_config
    from rlweave.adapters.megatron.overlap.linears import OverlapColumnParallelLinear, OverlapRowParallelLinear

    cfg = tp_config(world, HIDDEN, FFN_PER_RANK * world, 4)
    out = {"max_abs_diff": 0.0, "times_s": {"megatron": [], "rlweave": []}}
    for kind, ours_cls, ref_cls, size, args in (
            ("column", OverlapColumnParallelLinear, ColumnParallelLinear, (HIDDEN, cfg.ffn_hidden_size),
             dict(bias=True, gather_output=False)),
            ("row", OverlapRowParallelLinear, RowParallelLinear, (cfg.ffn_hidden_size, HIDDEN),
             dict(bias=True, input_is_parallel=True, skip_bias_add=False))):
        torch.manual_seed(7)
        ref = ref_cls(*size, config=cfg, init_method=torch.nn.init.normal_, **args)
        ours = ours_cls(*size, config=cfg, init_method=torch.nn.init.normal_, **args)
        ours.load_state_dict(ref.state_dict())
        torch.manual_seed(100 + rank)
        rows = SHARD if kind == "column" else SHARD * world
        x = torch.randn(rows, BATCH, size[0] // (1 if kind == "column" else world))
        a, b = fwd_bwd(ref, x), fwd_bwd(ours, x)
        out["max_abs_diff"] = max(out["max_abs_diff"], *((a[k] - b[k]).abs().max().item() for k in a))
        out[f"{kind}_plans"] = [p.backend if p else None for p in ours.__dict__.get("_overlap_plans", {}).values()]
        for _ in range(5):  # interleaved
            for name, layer in (("megatron", ref), ("rlweave", ours)):
                dist.barrier()
                start = time.perf_counter()
                fwd_bwd(layer, x)
                out["times_s"][name].append(time.perf_counter() - start)
    return out


def profile(world: int, rank: int) -> dict:
    """GEMM seconds over m (n = k = 512) and gloo exchange seconds over bytes."""
    gemm, link = {}, {}
    b = torch.randn(512, 512)
    for m in (16, 64, 256, 1024):
        a = torch.randn(m, 512)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        gemm[m] = min(times)
    peer = (rank + 1) % world
    for nbytes in (1 << 14, 1 << 20, 1 << 23):
        send, recv = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        times = []
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
            for w in works:
                w.wait()
            times.append(time.perf_counter() - start)
        link[nbytes] = min(times)
    return {"gemm_s_by_m_512x512": gemm, "exchange_s_by_bytes": link}


def run(rank: int, world: int, out: str, port: int) -> None:
    from rlweave.adapters.megatron.overlap.cpu import init_tensor_parallel

    init_tensor_parallel(rank, world, port)
    result = {"equal": equal_and_timed(world, rank), "profile": profile(world, rank)}
    diffs = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(diffs, torch.tensor([result["equal"]["max_abs_diff"]]))
    result["equal"]["max_abs_diff"] = max(d.item() for d in diffs)
    if rank == 0:
        times = result["equal"]["times_s"]
        result["equal"]["median_s"] = {k: statistics.median(v) for k, v in times.items()}
        with open(os.path.join(out, "overlap-cpu.json"), "w") as f:
            json.dump(result, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    world, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.multiprocessing.spawn(run, args=(world, out, port), nprocs=world)
