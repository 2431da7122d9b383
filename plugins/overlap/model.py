"""Timeline model of a collective+GEMM: sequential, decomposed (chunked GEMMs on a second
stream, as Megatron-era overlap and torch's async TP do) and tile-level (FLUX: one GEMM whose
tiles wait for, or hand off, exactly their rows).

The GEMM stream and the link are two resources; each piece of work starts when its inputs are
there and its resource is free. FLUX's metrics (Sec. 2.3): ``ECT = time - GEMM_nonsplit`` (the
fastest unsplit GEMM) and ``E_overlap = 1 - ECT / ECT_sequential``.

Shapes: ``ag_gemm`` multiplies the gathered ``[m, k]`` input by a ``[k, n]`` weight shard;
``gemm_rs`` multiplies ``[m, k]`` (k sharded) by ``[k, n]`` and reduce-scatters the ``[m, n]``
partial, so each rank keeps ``m / tp`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.plugins.overlap.schedule import split_rows

METHODS = ("sequential", "decomposed", "tile")


@dataclass(frozen=True)
class DeviceProfile:
    """What the model needs to know about a device and its links.

    A GEMM of ``m`` rows takes ``launch_s + 2 m n k (1 + gemm_half_rows / m) / (gemm_flops e)``:
    on a GPU (``sm_count`` > 0) ``e`` is the last wave's fill, ``tiles / (waves * sm_count)`` with
    ``gemm_tile``-square output tiles, so a piece of fewer rows under-fills the device (the
    split-GEMM penalty); on a CPU ``e`` is 1 and ``gemm_half_rows`` alone models small pieces. A transfer of ``B`` bytes takes ``link_latency_s + B / link_bps`` on
    the link one rank receives on; the library's collective (the sequential baseline) moves
    ``(tp-1)/tp`` of the gathered or reduced tensor at ``collective_bps``. ``memory_bps``: local
    adds. ``overlap_slowdown``: how much slower a GEMM runs while transfers run beside it (they
    share memory bandwidth, or, on CPU, the cores). ``tile_efficiency``: the tile kernel's
    GEMM speed against the fastest unsplit GEMM. ``min_chunk_rows``: the smallest piece worth
    sending (a GEMM tile's rows on GPU).
    """

    name: str
    source: str
    gemm_flops: float
    gemm_half_rows: float
    launch_s: float
    link_bps: float
    link_latency_s: float
    collective_bps: float
    memory_bps: float
    overlap_slowdown: float = 0.0
    tile_efficiency: float = 1.0
    min_chunk_rows: int = 1
    sm_count: int = 0
    gemm_tile: int = 128


@dataclass(frozen=True)
class Shape:
    op: str  # "ag_gemm" or "gemm_rs"
    m: int
    n: int
    k: int
    tp: int
    dtype_bytes: int = 2


@dataclass(frozen=True)
class Prediction:
    method: str
    chunks_per_rank: int
    time_s: float
    gemm_nonsplit_s: float
    sequential_s: float

    @property
    def ect_s(self) -> float:
        return self.time_s - self.gemm_nonsplit_s

    @property
    def e_overlap(self) -> float:
        base = self.sequential_s - self.gemm_nonsplit_s
        return 1.0 - self.ect_s / base if base > 0 else 0.0


def wave_fill(p: DeviceProfile, m: int, n: int) -> float:
    """The share of the device's multiprocessors a GEMM's output tiles keep busy (1 on CPU)."""
    if p.sm_count <= 0:
        return 1.0
    tiles = -(-m // p.gemm_tile) * -(-n // p.gemm_tile)
    return tiles / (-(-tiles // p.sm_count) * p.sm_count)


def gemm_s(p: DeviceProfile, m: int, n: int, k: int) -> float:
    if m <= 0:
        return 0.0
    return p.launch_s + 2.0 * m * n * k * (1.0 + p.gemm_half_rows / m) / (p.gemm_flops * wave_fill(p, m, n))


def transfer_s(p: DeviceProfile, nbytes: float) -> float:
    return p.link_latency_s + nbytes / p.link_bps


def sequential_s(p: DeviceProfile, s: Shape) -> float:
    """The library collective, then the unsplit GEMM (or the GEMM, then the collective)."""
    moved = s.m * (s.k if s.op == "ag_gemm" else s.n) * s.dtype_bytes * (s.tp - 1) / s.tp
    return gemm_s(p, s.m, s.n, s.k) + p.link_latency_s + moved / p.collective_bps


def _pieces(s: Shape, chunks: int) -> list[int]:
    """Row counts of the ``tp * chunks`` pieces in schedule order."""
    return [rows for block in split_rows(s.m, s.tp) for rows in split_rows(block, chunks)]


def _ag_decomposed(p: DeviceProfile, s: Shape, chunks: int, tile: bool) -> float:
    """Own pieces first; remote piece ``q`` arrives after ``q`` transfers on the link. The
    GEMM runs slower (``overlap_slowdown``) while the link is busy."""
    pieces = _pieces(s, chunks)
    arrivals, link_end = [], 0.0
    for i, rows in enumerate(pieces):
        if i >= chunks:
            link_end += transfer_s(p, rows * s.k * s.dtype_bytes)
        arrivals.append(link_end if i >= chunks else 0.0)
    full = gemm_s(p, s.m, s.n, s.k)
    clock = p.launch_s if tile else 0.0
    for rows, arrival in zip(pieces, arrivals):
        work = (full - p.launch_s) * rows / s.m / p.tile_efficiency if tile else gemm_s(p, rows, s.n, s.k)
        start = max(clock, arrival)
        clock = start + work * (1.0 + (p.overlap_slowdown if start < link_end else 0.0))
    return clock


def _rs_decomposed(p: DeviceProfile, s: Shape, chunks: int) -> float:
    """Ring accumulation: the piece of step ``t`` is sent once computed, once the neighbour's
    accumulator of that piece (its step ``t-1``) is in, and once the link is free."""
    pieces = _pieces(s, chunks)
    remote = len(pieces) - chunks
    gemm_end, link_end, done = 0.0, 0.0, 0.0
    sent: list[float] = []
    for i, rows in enumerate(pieces):
        gemm_end += gemm_s(p, rows, s.n, s.k) * (1.0 + (p.overlap_slowdown if i else 0.0))
        nbytes = rows * s.n * s.dtype_bytes
        ready = max(gemm_end, sent[i - chunks] if i >= chunks else 0.0) + 3 * nbytes / p.memory_bps
        if i < remote:
            link_end = max(ready, link_end) + transfer_s(p, nbytes)
            sent.append(link_end)
        else:
            done = max(done, ready)
    return done


def _rs_tile(p: DeviceProfile, s: Shape, chunks: int) -> float:
    """One GEMM writes each finished tile group to its owner (remote groups first); the owner
    sums the ``tp`` partials of its block once all are in."""
    pieces = _pieces(s, chunks)
    remote = len(pieces) - chunks
    work = (gemm_s(p, s.m, s.n, s.k) - p.launch_s) / p.tile_efficiency
    clock, link_end = p.launch_s, 0.0
    for i, rows in enumerate(pieces):
        clock += work * rows / s.m * (1.0 + (p.overlap_slowdown if i < remote else 0.0))
        if i < remote:
            link_end = max(clock, link_end) + transfer_s(p, rows * s.n * s.dtype_bytes)
    block_bytes = s.m / s.tp * s.n * s.dtype_bytes
    return max(clock, link_end) + (s.tp + 1) * block_bytes / p.memory_bps


def predict(p: DeviceProfile, s: Shape, method: str, chunks_per_rank: int = 1) -> Prediction:
    """Predicted time of ``method`` for ``s``, beside the unsplit GEMM and the sequential
    baseline (its ECT and E_overlap follow)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {METHODS}")
    if s.op not in ("ag_gemm", "gemm_rs"):
        raise ValueError(f"unknown op {s.op!r}")
    seq = sequential_s(p, s)
    if method == "sequential" or s.tp == 1:
        time = seq
    elif s.op == "ag_gemm":
        time = _ag_decomposed(p, s, chunks_per_rank, tile=method == "tile")
    elif method == "tile":
        time = _rs_tile(p, s, chunks_per_rank)
    else:
        time = _rs_decomposed(p, s, chunks_per_rank)
    return Prediction(method, chunks_per_rank, time, gemm_s(p, s.m, s.n, s.k), seq)


def split_gemm_penalty(p: DeviceProfile, s: Shape, chunks_per_rank: int) -> float:
    """How much longer the ``tp * chunks_per_rank`` piece GEMMs take than the unsplit one."""
    pieces = _pieces(s, chunks_per_rank)
    return sum(gemm_s(p, rows, s.n, s.k) for rows in pieces) / gemm_s(p, s.m, s.n, s.k) - 1.0
