"""Putting the overlapped linears into Megatron layer specs.

:class:`OverlapSpecProvider` is Megatron's ``LocalSpecProvider`` with rlweave's column- and
row-parallel linears, for spec builders that take a backend (``get_mlp_module_spec_for_backend``).
:func:`with_overlap_linears` swaps them into a spec that is already built (Megatron's local GPT
layer spec builds its provider inside), wherever Megatron's own linear classes appear.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.spec_utils import ModuleSpec

from rlweave.adapters.megatron.overlap.linears import OverlapColumnParallelLinear, OverlapRowParallelLinear

SWAPS = {ColumnParallelLinear: OverlapColumnParallelLinear, RowParallelLinear: OverlapRowParallelLinear}


class OverlapSpecProvider(LocalSpecProvider):
    def column_parallel_linear(self) -> type:
        return OverlapColumnParallelLinear

    def row_parallel_linear(self) -> type:
        return OverlapRowParallelLinear


def with_overlap_linears(spec: Any) -> Any:
    """``spec`` with every ``ColumnParallelLinear`` / ``RowParallelLinear`` slot (in
    ``ModuleSpec``\\s, submodule dataclasses and ``functools.partial`` builders) replaced."""
    if isinstance(spec, type):
        return SWAPS.get(spec, spec)
    if isinstance(spec, ModuleSpec):
        return dataclasses.replace(spec, module=with_overlap_linears(spec.module),
                                   submodules=with_overlap_linears(spec.submodules))
    if isinstance(spec, functools.partial):
        return functools.partial(with_overlap_linears(spec.func), *map(with_overlap_linears, spec.args),
                                 **{k: with_overlap_linears(v) for k, v in spec.keywords.items()})
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return dataclasses.replace(spec, **{f.name: with_overlap_linears(getattr(spec, f.name))
                                            for f in dataclasses.fields(spec) if f.init})
    return spec
