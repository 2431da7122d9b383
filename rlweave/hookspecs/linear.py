"""Tensor-parallel linears (Megatron-core ColumnParallelLinear / RowParallelLinear)."""

from __future__ import annotations

from rlweave.hookspecs import hookspec
from rlweave.types import LinearInfo


@hookspec(firstresult=True)
def rlweave_tp_linear_impl(linear: LinearInfo) -> str | None:
    """Name of the implementation for one TP linear, e.g. an AllGather+GEMM overlap kernel.

    Called by the Megatron spec provider when it builds the layer. ``None``: Megatron's own.
    """
