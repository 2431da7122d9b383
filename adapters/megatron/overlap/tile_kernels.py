"""rlweave's Triton kernels with FLUX's tile-level signal protocol (FLUX Alg. 1-3).

``ag_gemm``: ``C = A @ B`` over the gathered ``A``, whose row chunks arrive one by one (over the
copy engine, each followed by its int32 flag). Every output tile spins on the flags of exactly
the chunks its rows lie in, then runs its main loop; tiles go in arrival order (the local
shard's rows first, then rank+1's, ...: the m-tile order is rotated to ``first_row``), grouped by
``GROUP_M`` for L2 reuse. The local chunk's flag is set before launch, so its tiles never wait.

``gemm_rs``: ``C = A @ B`` whose epilogue writes each finished tile to the buffer of the rank
that owns its rows (``dst_ptrs[owner]``: a peer's buffer through its P2P address, or a local
stand-in) and then adds one to that owner's flag of the tile's row group
(``flag_ptrs[owner] + group``): a group is complete when its flag reaches the number of
column tiles. Tiles start with owner rank+1's rows, so ranks do not write to one owner at once.

Spins are bounded (``max_spin``): a tile that gives up counts itself in ``timeouts`` and goes
on, so a lost signal shows as a wrong result and a nonzero count instead of a hung device.
Both run under ``TRITON_INTERPRET=1`` on CPU tensors (the tests), where flags are set first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tile_coords(pid, M, N, first_row, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return (pid_m + first_row // BM) % num_m, pid_n


@triton.jit
def _mainloop(a_ptr, b_ptr, rm, rn, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # Triton's CPU interpreter computes bf16 dots wrongly (3.9): run them in fp32
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def ag_gemm_kernel(a_ptr, b_ptr, c_ptr, flags_ptr, timeouts_ptr, M, N, K, shard_rows, chunk_rows, first_row,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, max_spin,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   UPCAST: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, first_row, BM, BN, GROUP_M)
    row0 = pid_m * BM
    row1 = tl.minimum(row0 + BM, M) - 1
    per_shard = tl.cdiv(shard_rows, chunk_rows)
    for shard in range(row0 // shard_rows, row1 // shard_rows + 1):
        lo = tl.maximum(row0, shard * shard_rows) - shard * shard_rows
        hi = tl.minimum(row1, shard * shard_rows + shard_rows - 1) - shard * shard_rows
        for chunk in range(lo // chunk_rows, hi // chunk_rows + 1):
            flag = flags_ptr + shard * per_shard + chunk
            spins = 0
            while (tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0) & (spins < max_spin):
                spins += 1
            if spins >= max_spin:
                tl.atomic_add(timeouts_ptr, 1)
    rm = row0 + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = _mainloop(a_ptr, b_ptr, rm, rn, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BM, BN, BK, UPCAST)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def gemm_rs_kernel(a_ptr, b_ptr, dst_ptrs, flag_ptrs, M, N, K, block_rows, group_rows, first_row,
                   slot_row, stride_am, stride_ak, stride_bk, stride_bn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   UPCAST: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, first_row, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = _mainloop(a_ptr, b_ptr, rm, rn, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BM, BN, BK, UPCAST)
    # Epilogue: the tile goes to its owner's buffer, row by row (a tile may span two owners).
    owner = rm // block_rows
    local = rm - owner * block_rows
    first_owner = (pid_m * BM) // block_rows
    last_owner = (tl.minimum(pid_m * BM + BM, M) - 1) // block_rows
    for o in range(first_owner, last_owner + 1):
        dst = tl.load(dst_ptrs + o).to(tl.pointer_type(a_ptr.dtype.element_ty))
        rows = (owner == o) & (rm < M)
        tl.store(dst + (slot_row + local)[:, None] * N + rn[None, :], acc.to(a_ptr.dtype.element_ty),
                 mask=rows[:, None] & (rn[None, :] < N))
        flags = tl.load(flag_ptrs + o).to(tl.pointer_type(tl.int32))
        lo = tl.maximum(pid_m * BM, o * block_rows) - o * block_rows
        hi = tl.minimum(tl.minimum(pid_m * BM + BM, M), (o + 1) * block_rows) - 1 - o * block_rows
        for group in range(lo // group_rows, hi // group_rows + 1):
            tl.atomic_add(flags + group, 1, sem="release", scope="sys")


def launch_config(on_gpu: bool) -> dict:
    """Tile sizes: Hopper-friendly on GPU; small ones under the interpreter."""
    if on_gpu:
        return dict(BM=128, BN=128, BK=64, GROUP_M=8, UPCAST=False, num_warps=8, num_stages=3)
    return dict(BM=16, BN=16, BK=16, GROUP_M=2, UPCAST=True)


def ag_gemm(a: torch.Tensor, b: torch.Tensor, flags: torch.Tensor, shard_rows: int, chunk_rows: int,
            first_row: int, out: torch.Tensor | None = None, max_spin: int = 1 << 20,
            config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` over the gathered ``a`` (``shard_rows`` rows per rank, each shard in chunks of
    ``chunk_rows``): every tile waits on ``flags[shard * chunks_per_shard + chunk]`` of its rows.
    Returns the output and the count of waits that timed out."""
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=a.dtype, device=a.device) if out is None else out
    timeouts = torch.zeros(1, dtype=torch.int32, device=a.device)
    cfg = config or launch_config(a.is_cuda)
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    ag_gemm_kernel[grid](a, b, out, flags, timeouts, M, N, K, shard_rows, chunk_rows, first_row, a.stride(0),
                         a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), max_spin, **cfg)
    return out, timeouts


def gemm_rs(a: torch.Tensor, b: torch.Tensor, dst_ptrs: torch.Tensor, flag_ptrs: torch.Tensor, world: int,
            rank: int, group_rows: int, slot_row: int, config: dict | None = None) -> None:
    """``a @ b`` whose tiles land in ``dst_ptrs[owner]`` (rows ``slot_row + local row``, row
    length ``b.shape[1]``), each raising ``flag_ptrs[owner][row group]`` by one."""
    M, K = a.shape
    N = b.shape[1]
    block_rows = M // world
    cfg = config or launch_config(a.is_cuda)
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    gemm_rs_kernel[grid](a, b, dst_ptrs, flag_ptrs, M, N, K, block_rows, group_rows,
                         ((rank + 1) % world) * block_rows, slot_row, a.stride(0), a.stride(1),
                         b.stride(0), b.stride(1), **cfg)


def rs_group_targets(M: int, N: int, world: int, group_rows: int, config: dict) -> list[list[int]]:
    """Per owner and row group, the flag value at which the group is complete: one increment
    per (tile, group) pair, i.e. column tiles x the m-tiles that cover the group."""
    bm, num_n = config["BM"], triton.cdiv(N, config["BN"])
    block = M // world
    targets = [[0] * triton.cdiv(block, group_rows) for _ in range(world)]
    for pid_m in range(triton.cdiv(M, bm)):
        r0, r1 = pid_m * bm, min(pid_m * bm + bm, M) - 1
        for owner in range(r0 // block, r1 // block + 1):
            lo, hi = max(r0, owner * block) - owner * block, min(r1, owner * block + block - 1) - owner * block
            for group in range(lo // group_rows, hi // group_rows + 1):
                targets[owner][group] += num_n
    return targets


def pointer_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=tensors[0].device)
