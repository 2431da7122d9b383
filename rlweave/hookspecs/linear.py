"""Tensor-parallel linears (Megatron-core ColumnParallelLinear / RowParallelLinear)."""

from __future__ import annotations

from rlweave.hookspecs import hookspec
from rlweave.types import LinearInfo, TPLinearPlan


@hookspec(firstresult=True)
def rlweave_tp_linear_impl(linear: LinearInfo) -> TPLinearPlan | None:
    """How one sequence-parallel TP linear runs its collective and GEMM for one input shape:
    the overlap backend and each direction's chunk schedule.

    Called by rlweave's Megatron linears (``rlweave.adapters.megatron.overlap``, put in the
    layer spec by ``rlweave.adapters.megatron.layer_spec`` while a plugin implements this hook)
    at the first forward of each input shape, on every TP rank; the answer is cached per shape.
    Every rank must get the same backend and chunk counts for the same shape. ``None``:
    Megatron's own collective followed by its GEMM.
    """
