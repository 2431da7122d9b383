"""The decomposed ring over torch.distributed point-to-point (gloo and NCCL).

Each rank's shard (AllGather) or output block (ReduceScatter) is cut into
``schedule.chunks_per_rank`` row pieces. Every step, each piece goes to ``send_to`` while the
next one comes from ``recv_from`` (one batched send/recv pair, so NCCL pairs them and gloo runs
them on its own threads), and the GEMM of the piece that is there runs meanwhile.

AllGather+GEMM: ``AG(a) @ b``, the own shard first, then rank+1's, ... as they arrive.
GEMM+ReduceScatter: ``RS(a @ b)``, block rank+1's partial first; each rank adds its partial to
the accumulator from ``recv_from`` and passes it on, so block ``b`` is summed
``b-1, b-2, ..., b`` as gloo's ring reduce-scatter sums it (on gloo: equal results, not just close).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlweave.types import CommGemmSchedule


def rows_first(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as a 2-D ``[rows, features]`` tensor whose rows run along ``dim`` first (a view
    when ``dim`` is 0 and ``t`` is contiguous)."""
    t = t.movedim(dim, 0) if dim else t
    return t.contiguous().reshape(-1, t.shape[-1])


def restore(rows: torch.Tensor, like_shape: list[int], dim: int) -> torch.Tensor:
    """Inverse of :func:`rows_first` for a tensor of ``like_shape`` with ``dim`` moved first."""
    moved = [like_shape[dim], *like_shape[:dim], *like_shape[dim + 1:]] if dim else like_shape
    out = rows.view(*moved)
    return out.movedim(0, dim) if dim else out


def piece_bounds(rows: int, pieces: int) -> list[tuple[int, int]]:
    sizes = [len(p) for p in torch.arange(rows).tensor_split(pieces)]
    starts = [sum(sizes[:i]) for i in range(pieces)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def _exchange(send: torch.Tensor, recv: torch.Tensor, sched: CommGemmSchedule,
              group: dist.ProcessGroup) -> list[dist.Work]:
    ops = [dist.P2POp(dist.isend, send, dist.get_global_rank(group, sched.send_to), group),
           dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, sched.recv_from), group)]
    return dist.batch_isend_irecv(ops)


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


class RingOps:
    """The ``ring`` backend."""

    def all_gather_matmul(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                          group: dist.ProcessGroup, gather_dim: int = 0,
                          return_gathered: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        world = group.size()
        x = rows_first(a, gather_dim)
        shard = x.shape[0]
        gathered = x.new_empty((world * shard, x.shape[1]))
        out = x.new_empty((world * shard, b.shape[1]))
        pieces = piece_bounds(shard, min(sched.chunks_per_rank, max(shard, 1)))
        order = sched.order
        gathered[order[0] * shard:(order[0] + 1) * shard].copy_(x)
        pending: dict[tuple[int, int], list[dist.Work]] = {}
        for step, src in enumerate(order):
            for j, (lo, hi) in enumerate(pieces):
                if step:
                    _wait(pending.pop((step, j)))
                piece = gathered[src * shard + lo:src * shard + hi]
                if step < world - 1:
                    nxt = order[step + 1] * shard
                    pending[(step + 1, j)] = _exchange(piece, gathered[nxt + lo:nxt + hi], sched, group)
                torch.matmul(piece, b, out=out[src * shard + lo:src * shard + hi])
        shape = list(a.shape)
        shape[gather_dim] *= world
        result = restore(out, shape[:-1] + [b.shape[1]], gather_dim)
        return result, restore(gathered, shape, gather_dim) if return_gathered else None

    def matmul_reduce_scatter(self, a: torch.Tensor, b: torch.Tensor, sched: CommGemmSchedule,
                              group: dist.ProcessGroup, scatter_dim: int = 0) -> torch.Tensor:
        world = group.size()
        x = rows_first(a, scatter_dim)
        if x.shape[0] % world:
            raise ValueError(f"{x.shape[0]} rows along dim {scatter_dim} do not split over {world} ranks")
        block = x.shape[0] // world
        out = x.new_empty((block, b.shape[1]))
        pieces = piece_bounds(block, min(sched.chunks_per_rank, max(block, 1)))
        pending: dict[tuple[int, int], tuple[list[dist.Work], torch.Tensor]] = {}
        for step, dst in enumerate(sched.order):
            for j, (lo, hi) in enumerate(pieces):
                last = step == world - 1
                part = torch.matmul(x[dst * block + lo:dst * block + hi], b, out=out[lo:hi] if last else None)
                if step:
                    works, acc = pending.pop((step, j))
                    _wait(works)
                    part.add_(acc)
                if not last:
                    acc = torch.empty_like(part)
                    pending[(step + 1, j)] = (_exchange(part, acc, sched, group), acc)
        shape = list(a.shape)
        shape[scatter_dim] //= world
        return restore(out, shape[:-1] + [b.shape[1]], scatter_dim)
