"""Megatron's ColumnParallelLinear / RowParallelLinear with the collective+GEMM overlapped.

The subclasses keep Megatron's constructor, parameters, initialisation and (sharded) state
dict, so a checkpoint moves between them and Megatron's own. On the first forward of each input
shape they ask ``rlweave_tp_linear_impl`` for a plan (backend and chunk schedules) and cache it;
with no plan, or outside the case they handle (sequence parallelism on, no expert-parallel
communication, no deferred embedding wgrad, no GTP remat, no CPU offloading), Megatron's own
code runs unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from rlweave.adapters.megatron.overlap.functions import AllGatherLinear, MatmulReduceScatterLinear
from rlweave.adapters.megatron.overlap.probe import probe
from rlweave.host import get_host
from rlweave.types import LinearInfo, TPLinearPlan

_OPS: dict[str, Any] = {}


def backend_ops(name: str) -> Any:
    """The implementation of the backend a plan names (built once per process)."""
    if name not in _OPS:
        if name == "ring":
            from rlweave.adapters.megatron.overlap.ring import RingOps as cls
        elif name == "symm_mem":
            from rlweave.adapters.megatron.overlap.symm_mem import SymmMemOps as cls
        elif name == "tile":
            from rlweave.adapters.megatron.overlap.tile import TileOps as cls
        else:
            raise ValueError(f"rlweave_tp_linear_impl answered an unknown backend {name!r}")
        _OPS[name] = cls()
    return _OPS[name]


class _Planned:
    """Asks the hook once per input shape and dtype."""

    _overlap_kind: str

    def _overlap_plan(self, x: torch.Tensor, tokens: int) -> TPLinearPlan | None:
        plans = self.__dict__.setdefault("_overlap_plans", {})
        key = (tokens, x.dtype, x.device.type)
        if key not in plans:
            group = self.tp_group
            info = LinearInfo(self._overlap_kind, self.input_size, self.output_size, group.size(),
                              group.rank(), True, tokens, x.element_size(), probe(group, x.device))
            plans[key] = get_host().hook.rlweave_tp_linear_impl(linear=info)
        return plans[key]

    def _overlap_applies(self) -> bool:
        return (self.sequence_parallel and not self.explicit_expert_comm and _gtp_remat_size(self) == 1
                and self.config._cpu_offloading_context is None and self.tp_group.size() > 1)


def _gtp_remat_size(linear: Any) -> int:
    """Megatron compat: megatron-core 0.19 added GTP weight remat (``gtp_remat_size``); 0.18's
    linears have no such attribute and never remat, which is size 1."""
    return getattr(linear, "gtp_remat_size", 1)


class OverlapColumnParallelLinear(_Planned, ColumnParallelLinear):
    """``ColumnParallelLinear`` whose AllGather+GEMM (and backward GEMM+ReduceScatter) overlap."""

    _overlap_kind = "column"

    def _forward_impl(self, input, weight, *args, **kwargs):  # noqa: ANN001, ANN202 (Megatron's signature)
        plan = None
        if (self._overlap_applies() and kwargs.get("sequence_parallel") and not args
                and kwargs.get("grad_output_buffer") is None):
            plan = self._overlap_plan(input, math.prod(input.shape[:-1]) * self.tp_group.size())
        if plan is None:
            return super()._forward_impl(input, weight, *args, **kwargs)
        return AllGatherLinear.apply(input, weight, kwargs.get("bias"), backend_ops(plan.backend), plan,
                                     self.tp_group, bool(kwargs.get("gradient_accumulation_fusion")))


class OverlapRowParallelLinear(_Planned, RowParallelLinear):
    """``RowParallelLinear`` whose GEMM+ReduceScatter (and backward AllGather+GEMM) overlap."""

    _overlap_kind = "row"

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        plan = None
        if self._overlap_applies() and self.input_is_parallel:
            plan = self._overlap_plan(input_, math.prod(input_.shape[:-1]))
        if plan is None:
            return super().forward(input_)
        output = MatmulReduceScatterLinear.apply(input_, self.weight, backend_ops(plan.backend), plan,
                                                 self.tp_group, self.gradient_accumulation_fusion)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None
