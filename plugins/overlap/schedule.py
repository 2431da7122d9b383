"""The ring schedule of an overlapped collective+GEMM (FLUX Sec. 3: communication order).

Data flows one way round the ring: every rank receives from rank+1 and sends to rank-1 at
every step, so at any moment each rank reads a different peer. AllGather+GEMM multiplies its
own shard first (its signal is set before the GEMM starts), then the shards of rank+1, rank+2,
... in the order they arrive. GEMM+ReduceScatter computes the partial of output block rank+1
first and its own block last: the partial for block ``b`` travels ``b-1 -> b-2 -> ... -> b``,
each rank adding its own partial on the way (the order gloo's ring reduce-scatter sums in,
measured: so on gloo the ring's result equals Megatron's bit for bit).
"""

from __future__ import annotations

from rlweave.types import CommGemmSchedule

OPS = ("ag_gemm", "gemm_rs")


def ring_peers(rank: int, world: int) -> tuple[int, int]:
    """(recv_from, send_to) of ``rank``: the next rank and the previous one."""
    return (rank + 1) % world, (rank - 1) % world


def step_order(op: str, rank: int, world: int) -> tuple[int, ...]:
    """Per ring step, the shard ``rank`` multiplies (``ag_gemm``) or the output block whose
    partial it computes (``gemm_rs``)."""
    if op == "ag_gemm":
        return tuple((rank + s) % world for s in range(world))
    if op == "gemm_rs":
        return tuple((rank + 1 + s) % world for s in range(world))
    raise ValueError(f"unknown op {op!r}; one of {OPS}")


def split_rows(rows: int, pieces: int) -> tuple[int, ...]:
    """Sizes of ``pieces`` near-equal row pieces of ``rows`` (the first ones one row larger),
    as ``torch.tensor_split`` cuts them."""
    base, extra = divmod(rows, pieces)
    return tuple(base + (i < extra) for i in range(pieces))


def chunk_candidates(rows_per_rank: int, min_rows: int, max_chunks: int) -> list[int]:
    """Pieces per rank's shard worth trying: FLUX tunes the communication tile from the whole
    shard (M / N_TP) down by halving to the GEMM tile; here 1, 2, 4, ... while a piece keeps at
    least ``min_rows`` rows (and at least one)."""
    out, c = [], 1
    while c <= max_chunks and (c == 1 or rows_per_rank // c >= max(min_rows, 1)):
        out.append(c)
        c *= 2
    return out


def schedule(op: str, rank: int, world: int, chunks_per_rank: int, *, predicted_s: float = 0.0,
             sequential_s: float = 0.0) -> CommGemmSchedule:
    recv_from, send_to = ring_peers(rank, world)
    return CommGemmSchedule(op, chunks_per_rank, step_order(op, rank, world), recv_from, send_to,
                            predicted_s, sequential_s)
