"""Test plugin: answers every TP linear with a ``symm_mem`` plan, so the linears run the
symmetric-memory backend (with torch's reference ops in place of the CUDA kernels on CPU)."""

from __future__ import annotations

from rlweave.hookspecs import hookimpl
from rlweave.plugins.overlap.schedule import schedule
from rlweave.types import LinearInfo, TPLinearPlan


@hookimpl
def rlweave_tp_linear_impl(linear: LinearInfo) -> TPLinearPlan:
    fwd, bwd = ("ag_gemm", "gemm_rs") if linear.kind == "column" else ("gemm_rs", "ag_gemm")
    r, w = linear.tp_rank, linear.tp_size
    return TPLinearPlan("symm_mem", schedule(fwd, r, w, 1), schedule(bwd, r, w, 1))
