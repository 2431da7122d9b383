"""Autograd of the overlapped linears: the forward's collective+GEMM runs on a backend, and the
backward swaps the two (FLUX Sec. 2.1).

Column-parallel, ``y = AG(x) @ W^T``: the input gradient is ``RS(dy @ W)`` (GEMM+ReduceScatter)
while the AllGather of ``x`` for the weight gradient runs beside it, as Megatron re-gathers it
instead of keeping the gathered input. Row-parallel, ``y = RS(x @ W^T)``: the input gradient is
``AG(dy) @ W`` (AllGather+GEMM), and the gathered ``dy`` it returns gives the weight gradient.
Weight and bias gradients are Megatron's own expressions, so they match it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlweave.types import TPLinearPlan


def weight_grad(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, accumulate: bool) -> torch.Tensor | None:
    """``dy^T x`` over 2-D views, as Megatron computes it; with gradient-accumulation fusion it
    is added to ``weight.main_grad`` instead, and Megatron's placeholder is returned."""
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    grad = dy2.t().matmul(x2)
    if not (accumulate and hasattr(weight, "main_grad")):
        return grad
    weight.main_grad.add_(grad)
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    return make(weight.main_grad.shape, dtype=x.dtype, device=x.device)


def bias_grad(dy: torch.Tensor, needed: bool) -> torch.Tensor | None:
    return dy.reshape(-1, dy.shape[-1]).sum(dim=0) if needed else None


class AllGatherLinear(torch.autograd.Function):
    """Column-parallel with sequence parallelism: ``AG(x) @ W^T + bias``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ops: Any,
                plan: TPLinearPlan, group: dist.ProcessGroup, accumulate: bool) -> torch.Tensor:
        out, _ = ops.all_gather_matmul(x, weight.t(), plan.forward, group)
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(x, weight)
        ctx.ops, ctx.plan, ctx.group, ctx.accumulate, ctx.has_bias = ops, plan, group, accumulate, bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        need_w = ctx.needs_input_grad[1]
        if need_w:
            gathered = x.new_empty((x.shape[0] * ctx.group.size(), *x.shape[1:]))
            handle = dist.all_gather_into_tensor(gathered, x.contiguous(), group=ctx.group, async_op=True)
        dx = ctx.ops.matmul_reduce_scatter(dy, weight, ctx.plan.backward, ctx.group)
        dw = None
        if need_w:
            handle.wait()
            dw = weight_grad(dy, gathered, weight, ctx.accumulate)
        return dx, dw, bias_grad(dy, ctx.has_bias and ctx.needs_input_grad[2]), None, None, None, None


class MatmulReduceScatterLinear(torch.autograd.Function):
    """Row-parallel with sequence parallelism: ``RS(x @ W^T)`` (bias added by the caller)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, ops: Any, plan: TPLinearPlan,
                group: dist.ProcessGroup, accumulate: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.ops, ctx.plan, ctx.group, ctx.accumulate = ops, plan, group, accumulate
        return ops.matmul_reduce_scatter(x, weight.t(), plan.forward, group)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        need_w = ctx.needs_input_grad[1]
        dx, gathered = ctx.ops.all_gather_matmul(dy.contiguous(), weight, ctx.plan.backward, ctx.group,
                                                 return_gathered=need_w)
        dw = weight_grad(gathered, x, weight, ctx.accumulate) if need_w else None
        return dx, dw, None, None, None, None
