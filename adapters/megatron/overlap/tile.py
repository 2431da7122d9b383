"""The ``tile`` backend on CUDA peers: FLUX's protocol with rlweave's Triton kernels.

AllGather+GEMM: each rank puts its shard in its row block of a symmetric-memory buffer; the copy
engine (a side stream) pulls the peers' blocks into the local buffer chunk by chunk in ring
order, setting one int32 flag after each chunk, while :func:`.tile_kernels.ag_gemm` runs on the
compute stream with every tile spinning on its chunks' flags. GEMM+ReduceScatter:
:func:`.tile_kernels.gemm_rs` writes each finished tile straight into its owner's symmetric
buffer (through the P2P address) and raises the owner's group flag; after a device-side barrier
each rank sums the partials of its block.

This path needs several GPUs of one node, which no rlweave test machine has: the first call of
each shape is checked against the plain collective and GEMM and refused with a clear error if
they differ, so a fault shows at once rather than in a loss curve.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlweave.adapters.megatron.overlap import tile_kernels as tk
from rlweave.adapters.megatron.overlap.ring import restore, rows_first
from rlweave.types import CommGemmSchedule


@functools.cache
def _cuda_driver() -> Any | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def stream_write_flag(flag: torch.Tensor, one: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Set ``flag`` (one int32 element) to 1 on ``stream`` after the copies before it: with the
    driver's ``cuStreamWriteValue32`` (as FLUX), else with a 4-byte copy (also the copy engine)."""
    driver = _cuda_driver()
    if driver is not None:
        rc = driver.cuStreamWriteValue32_v2(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(flag.data_ptr()),
                                            ctypes.c_uint32(1), ctypes.c_uint(0))
        if rc == 0:
            return
    with torch.cuda.stream(stream):
        flag.copy_(one, non_blocking=True)


def stream_wait_flag(flag: torch.Tensor, value: int, stream: torch.cuda.Stream) -> bool:
    """Make ``stream`` wait until ``flag >= value`` (``cuStreamWaitValue32``, GEQ); False when
    the driver cannot, so the caller picks another way."""
    driver = _cuda_driver()
    if driver is None:
        return False
    rc = driver.cuStreamWaitValue32_v2(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(flag.data_ptr()),
                                       ctypes.c_uint32(value), ctypes.c_uint(0))  # CU_STREAM_WAIT_VALUE_GEQ
    return rc == 0


@dataclass
class _Workspace:
    buffer: torch.Tensor
    handle: Any


class TileOps:
    """The ``tile`` backend (CUDA, NCCL group of one node's GPUs with peer access)."""

    def __init__(self) -> None:
        self._workspaces: dict[tuple, _Workspace] = {}
        self._checked: set[tuple] = set()
        self._copy_stream: torch.cuda.Stream | None = None

    def _workspace(self, group: dist.ProcessGroup, key: str, shape: tuple, dtype: torch.dtype) -> _Workspace:
        from torch.distributed import _symmetric_memory as symm

        name = (group.group_name, key, shape, dtype)
        if name not in self._workspaces:
            buffer = symm.empty(shape, dtype=dtype, device=torch.cuda.current_device())
            self._workspaces[name] = _Workspace(buffer, symm.rendezvous(buffer, group.group_name))
        return self._workspaces[name]

    def _check(self, key: tuple, got: torch.Tensor, want: Any) -> None:
        if key in self._checked:
            return
        expected = want()
        if not torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2):
            err = (got.float() - expected.float()).abs().max().item()
            raise RuntimeError(f"rlweave.overlap tile backend: {key[0]} of shape {key[1:]} differs from the plain "
                               f"collective + GEMM by up to {err:.3g}; set +rlweave.overlap.backend=symm_mem "
                               f"(or ring) and report this device")
        self._checked.add(key)

    def all_gather_matmul(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                          group: dist.ProcessGroup, gather_dim: int = 0,
                          return_gathered: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = rows_first(a, gather_dim)
        world, rank, (shard, k) = group.size(), group.rank(), x.shape
        ws = self._workspace(group, "ag", (world * shard, k), x.dtype)
        ws.buffer[rank * shard:(rank + 1) * shard].copy_(x)
        pieces = max(1, min(sched.chunks_per_rank, shard))
        chunk = -(-shard // pieces)
        per_shard = -(-shard // chunk)
        flags = torch.zeros(world * per_shard, dtype=torch.int32, device=x.device)
        flags[rank * per_shard:(rank + 1) * per_shard] = 1
        one = torch.ones(1, dtype=torch.int32, device=x.device)
        ws.handle.barrier()  # every shard is in its owner's buffer
        compute = torch.cuda.current_stream()
        copy = self._copy_stream = self._copy_stream or torch.cuda.Stream(priority=-1)
        copy.wait_stream(compute)
        out, timeouts = tk.ag_gemm(ws.buffer, b, flags, shard, chunk, rank * shard)
        with torch.cuda.stream(copy):
            for src in sched.order[1:]:
                peer = ws.handle.get_buffer(src, ws.buffer.shape, ws.buffer.dtype)
                for c in range(per_shard):
                    lo, hi = src * shard + c * chunk, min(src * shard + (c + 1) * chunk, (src + 1) * shard)
                    ws.buffer[lo:hi].copy_(peer[lo:hi], non_blocking=True)
                    stream_write_flag(flags[src * per_shard + c:src * per_shard + c + 1], one, copy)
        compute.wait_stream(copy)
        gathered = ws.buffer.clone() if return_gathered else None
        ws.handle.barrier()  # no peer refills its block before everyone has pulled it
        shape = list(a.shape)
        shape[gather_dim] *= world
        key = ("all_gather_matmul", *shape, b.shape[1])
        if key not in self._checked and timeouts.item():
            raise RuntimeError(f"rlweave.overlap tile backend: {timeouts.item()} tile waits for input chunks "
                               f"timed out; set +rlweave.overlap.backend=symm_mem (or ring)")
        self._check(key, out, lambda: _plain_all_gather(x, group) @ b)
        result = restore(out, shape[:-1] + [b.shape[1]], gather_dim)
        return result, restore(gathered, shape, gather_dim) if return_gathered else None

    def matmul_reduce_scatter(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                              group: dist.ProcessGroup, scatter_dim: int = 0) -> torch.Tensor:
        x = rows_first(a, scatter_dim)
        world, rank = group.size(), group.rank()
        block, n = x.shape[0] // world, b.shape[1]
        pieces = max(1, min(sched.chunks_per_rank, block))
        group_rows = -(-block // pieces)
        ws = self._workspace(group, "rs", (world * block, n), x.dtype)
        flag_ws = self._workspace(group, "rs_flags", (world, -(-block // group_rows)), torch.int32)
        flag_ws.buffer.zero_()
        ws.handle.barrier()
        peers = [ws.handle.get_buffer(o, ws.buffer.shape, ws.buffer.dtype) for o in range(world)]
        peer_flags = [flag_ws.handle.get_buffer(o, flag_ws.buffer.shape, torch.int32)[rank] for o in range(world)]
        tk.gemm_rs(x, b, tk.pointer_table(peers), tk.pointer_table(peer_flags), world, rank, group_rows,
                   rank * block)
        ws.handle.barrier()  # every peer's partial of my block is in my buffer
        out = ws.buffer.view(world, block, n).float().sum(0).to(x.dtype)
        shape = list(a.shape)
        shape[scatter_dim] //= world
        self._check(("matmul_reduce_scatter", *shape, n), out, lambda: _plain_reduce_scatter(x @ b, group))
        return restore(out, shape[:-1] + [n], scatter_dim)


def _plain_all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((x.shape[0] * group.size(), *x.shape[1:]))
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _plain_reduce_scatter(y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out = y.new_empty((y.shape[0] // group.size(), *y.shape[1:]))
    dist.reduce_scatter_tensor(out, y.contiguous(), group=group)
    return out
