"""The ``symm_mem`` backend: torch's fused symmetric-memory ops (CUDA; torch's own pipeline
of one piece per rank on alternating streams, so the schedule's chunk count does not apply)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist

from rlweave.types import CommGemmSchedule


class SymmMemOps:
    """``all_gather`` / ``reduce_scatter``: the op implementations, torch.ops.symm_mem's by
    default (tests on CPU pass torch's own reference fallbacks of the same ops)."""

    def __init__(self, all_gather: Callable | None = None, reduce_scatter: Callable | None = None):
        self._all_gather = all_gather
        self._reduce_scatter = reduce_scatter
        self._enabled: set[str] = set()

    def _group_name(self, group: dist.ProcessGroup) -> str:
        name = group.group_name
        if name not in self._enabled and self._all_gather is None:
            from torch.distributed import _symmetric_memory as symm

            enable = getattr(symm, "enable_symm_mem_for_group", None)
            if enable is not None:  # needed before torch 2.8; deprecated (a no-op) after
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    enable(name)
            self._enabled.add(name)
        return name

    def all_gather_matmul(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                          group: dist.ProcessGroup, gather_dim: int = 0,
                          return_gathered: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        op = self._all_gather or torch.ops.symm_mem.fused_all_gather_matmul
        gathered, outs = op(a, [b], gather_dim, self._group_name(group), return_A=return_gathered)
        return outs[0], gathered

    def matmul_reduce_scatter(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                              group: dist.ProcessGroup, scatter_dim: int = 0) -> torch.Tensor:
        op = self._reduce_scatter or torch.ops.symm_mem.fused_matmul_reduce_scatter
        return op(a, b, "sum", scatter_dim, self._group_name(group))
