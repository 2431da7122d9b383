"""Putting the overlapped linears into Megatron layer specs.

:class:`OverlapSpecProvider` is Megatron's ``LocalSpecProvider`` with rlweave's column- and
row-parallel linears, for spec builders that take a backend (``get_mlp_module_spec_for_backend``).
:func:`with_overlap_linears` swaps them into a spec that is already built (Megatron's local GPT
layer spec builds its provider inside), wherever Megatron's own linear classes appear.
"""

from __future__ import annotations

from typing import Any

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from rlweave.adapters.megatron.layer_swap import swap_classes
from rlweave.adapters.megatron.overlap.linears import OverlapColumnParallelLinear, OverlapRowParallelLinear

SWAPS = {ColumnParallelLinear: OverlapColumnParallelLinear, RowParallelLinear: OverlapRowParallelLinear}


class OverlapSpecProvider(LocalSpecProvider):
    def column_parallel_linear(self) -> type:
        return OverlapColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return OverlapRowParallelLinear


def with_overlap_linears(spec: Any) -> Any:
    """``spec`` with every ``ColumnParallelLinear`` / ``RowParallelLinear`` slot (in
    ``ModuleSpec``\\s, submodule dataclasses, lists and ``functools.partial`` builders) replaced."""
    return swap_classes(spec, SWAPS)
