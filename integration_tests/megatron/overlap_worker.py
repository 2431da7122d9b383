"""One rank of a TP=world_size gloo group: rlweave's overlapped linears against Megatron's plain
ones, and a transformer layer from rlweave's spec against Megatron's, on the same weights and
inputs. Writes what it saw to ``<out>/rank<r>.pt``.

Backends: ``ring`` (asked through the real overlap plugin, ``rlweave.overlap.backend=ring`` with
uneven pieces: ``chunks_per_rank=2`` of 5-row shards), and ``symm_mem`` with torch's own
reference implementations of the symmetric-memory ops standing in for their CUDA kernels (no
CUDA here), through a test plugin that answers with symm_mem plans.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ranks import start_ranks

SHARD, BATCH, HIDDEN, HEADS = 5, 3, 36, 4  # uneven on purpose: 5-row shards in 2 pieces


def config(world: int, dtype: torch.dtype):
    from rlweave.adapters.megatron.overlap.cpu import tp_config

    return tp_config(world, HIDDEN, 14 * world, HEADS, dtype)


def linear_pair(kind: str, cfg, ours_cls, ref_cls):
    init = torch.nn.init.normal_
    if kind == "column":
        args = dict(config=cfg, init_method=init, bias=True, gather_output=False)
        size = (HIDDEN, cfg.ffn_hidden_size)
    else:
        args = dict(config=cfg, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False)
        size = (cfg.ffn_hidden_size, HIDDEN)
    torch.manual_seed(7)
    ref = ref_cls(*size, **args)
    ours = ours_cls(*size, **args)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run_linear(layer, x: torch.Tensor) -> dict:
    inp = x.clone().requires_grad_(True)
    out, _ = layer(inp)
    (out.float() * torch.linspace(-1, 1, out.shape[-1])).square().sum().backward()
    return {"out": out.detach(), "dx": inp.grad.detach(),
            "grads": {n: p.grad.detach().clone() for n, p in layer.named_parameters()}}


def linears(world: int, rank: int) -> dict:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from rlweave.adapters.megatron.overlap.linears import OverlapColumnParallelLinear, OverlapRowParallelLinear

    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        cfg = config(world, dtype)
        torch.manual_seed(100 + rank)
        x_col = torch.randn(SHARD, BATCH, HIDDEN, dtype=dtype)  # sequence-parallel shard
        x_row = torch.randn(SHARD * world, BATCH, cfg.ffn_hidden_size // world, dtype=dtype)
        for kind, ours_cls, ref_cls, x in (("column", OverlapColumnParallelLinear, ColumnParallelLinear, x_col),
                                            ("row", OverlapRowParallelLinear, RowParallelLinear, x_row)):
            ref, ours = linear_pair(kind, cfg, ours_cls, ref_cls)
            results[(kind, str(dtype))] = {"ref": run_linear(ref, x), "ours": run_linear(ours, x),
                                           "plans": dict(ours.__dict__.get("_overlap_plans", {}))}
    return results


def ops_both_gather_dims(world: int, rank: int) -> dict:
    """The backends' collective+GEMMs along dims 0 and 1 against all_gather / reduce_scatter
    followed by matmul."""
    from rlweave.adapters.megatron.overlap.ring import RingOps
    from rlweave.plugins.overlap.schedule import schedule

    group = dist.group.WORLD
    ops = {"ring": RingOps(), "symm_mem": symm_mem_reference_ops()}
    out = {}
    torch.manual_seed(rank)
    b_ag, b_rs = torch.randn(HIDDEN, 11), torch.randn(HIDDEN, 13)
    for dim in (0, 1):
        shard = [SHARD, BATCH, HIDDEN] if dim == 0 else [BATCH, SHARD, HIDDEN]
        a = torch.randn(*shard)
        full = [torch.empty_like(a) for _ in range(world)]
        dist.all_gather(full, a)
        gathered = torch.cat(full, dim)
        rs_in = torch.randn(*[s * world if d == dim else s for d, s in enumerate(shard)])
        partials = [torch.empty_like(torch.matmul(rs_in, b_rs)) for _ in range(world)]
        dist.all_gather(partials, torch.matmul(rs_in, b_rs))
        rs_ref = sum(p.chunk(world, dim)[rank] for p in partials)
        for name, impl in ops.items():
            y, g = impl.all_gather_matmul(a, b_ag, schedule("ag_gemm", rank, world, 2), group, dim, True)
            z = impl.matmul_reduce_scatter(rs_in, b_rs, schedule("gemm_rs", rank, world, 3), group, dim)
            out[(name, dim)] = {"ag": (y, torch.matmul(gathered, b_ag)), "gathered": (g, gathered),
                                "rs": (z, rs_ref)}
    return out


def symm_mem_reference_ops():
    """torch's reference implementations of the two symmetric-memory ops (the functions behind
    their Meta registrations: functional collectives, then matmul), in place of the CUDA
    kernels."""
    from torch.distributed import _symmetric_memory as symm

    from rlweave.adapters.megatron.overlap.symm_mem import SymmMemOps

    return SymmMemOps(symm._fused_all_gather_matmul_fallback, symm._fused_matmul_reduce_scatter_fallback)


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """A per-token LayerNorm whose parameters are marked ``sequence_parallel`` (their gradients
    are summed over the TP group, as Megatron's finalize does for apex's LayerNorm)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5):  # noqa: ANN001
        super().__init__(hidden_size, eps=eps)
        for p in self.parameters():
            p.sequence_parallel = True


def layer_training(world: int, rank: int) -> dict:
    """Two SGD steps of one transformer layer from Megatron's spec and from rlweave's."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    from rlweave.adapters.megatron import layer_spec

    cfg = config(world, torch.float32)
    specs = [get_gpt_layer_local_spec(), layer_spec()]
    for spec in specs:  # Megatron's CPU LayerNorm refuses sequence parallelism; apex's is GPU-only
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
    torch.manual_seed(11)
    ref, ours = (build_module(spec, config=cfg, layer_number=1) for spec in specs)
    ours.load_state_dict(ref.state_dict())
    classes = sorted({type(m).__name__ for m in ours.modules() if "Parallel" in type(m).__name__})
    shared = sorted(n for n, p in ours.named_parameters() if getattr(p, "sequence_parallel", False))
    seq = SHARD * world  # attention sees the gathered sequence; Megatron's default mask is made on CUDA
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    losses = {}
    for name, layer in (("ref", ref), ("ours", ours)):
        optim = torch.optim.SGD(layer.parameters(), lr=0.05)
        losses[name] = []
        for step in range(2):
            torch.manual_seed(1000 * step + rank)
            x = torch.randn(SHARD, BATCH, HIDDEN)
            out, _ = layer(x, attention_mask=causal)
            loss = out.square().mean()
            optim.zero_grad()
            loss.backward()
            for p in layer.parameters():  # Megatron's finalize: sequence-parallel params' grads over TP
                if getattr(p, "sequence_parallel", False):
                    dist.all_reduce(p.grad)
            optim.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses[name].append(total.item() / world)
    return {"losses": losses, "classes": classes, "sequence_parallel_params": shared,
            "params": {n: (p.detach().clone(), dict(ours.named_parameters())[n].detach().clone())
                       for n, p in ref.named_parameters()}}


def run(rank: int, world: int, out: str, port: int, mode: str) -> None:
    from rlweave.adapters.megatron.overlap.cpu import init_tensor_parallel

    init_tensor_parallel(rank, world, port)
    from rlweave.host import get_host

    if mode == "symm_mem":
        from rlweave.adapters.megatron.overlap import linears as linears_module

        linears_module._OPS["symm_mem"] = symm_mem_reference_ops()
    results = {"mode": mode, "host_active": get_host().active, "linears": linears(world, rank)}
    if mode == "ring":
        results["ops"] = ops_both_gather_dims(world, rank)
        results["layer"] = layer_training(world, rank)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world, out, port, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_ranks(run, world, out, port, mode)
