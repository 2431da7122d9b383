"""Which backend and how many pieces, per linear and input shape, from the timeline model.

A column-parallel linear's forward is an AllGather+GEMM and its input gradient a
GEMM+ReduceScatter; a row-parallel linear the other way round. For each backend the device runs,
the model predicts both directions with the best number of pieces per rank; ``auto`` takes the
fastest and keeps Megatron's own path (collective, then GEMM) where no backend beats it, as FLUX
loses at small m. A forced backend is used as asked, or refused with the reason.
"""

from __future__ import annotations

from rlweave.plugins.overlap.model import DeviceProfile, Prediction, Shape, predict
from rlweave.plugins.overlap.schedule import chunk_candidates, schedule
from rlweave.types import LinearInfo, TPLinearPlan

# Backend -> the model's method. torch's symmetric-memory ops cut one piece per rank.
METHOD = {"ring": "decomposed", "symm_mem": "decomposed", "tile": "tile"}
FIXED_CHUNKS = {"symm_mem": 1}
PREFERENCE = ("tile", "symm_mem", "ring")  # ties go to the finer-grained backend


class OverlapError(ValueError):
    """A backend was asked for that this device cannot run."""


def shapes(linear: LinearInfo) -> tuple[Shape, Shape]:
    """(forward, input-gradient) collective+GEMM shapes of one TP rank."""
    m, tp, b = linear.tokens, linear.tp_size, linear.dtype_bytes
    if linear.kind == "column":
        n_local = linear.output_size // tp
        return (Shape("ag_gemm", m, n_local, linear.input_size, tp, b),
                Shape("gemm_rs", m, linear.input_size, n_local, tp, b))
    if linear.kind == "row":
        k_local = linear.input_size // tp
        return (Shape("gemm_rs", m, linear.output_size, k_local, tp, b),
                Shape("ag_gemm", m, k_local, linear.output_size, tp, b))
    raise ValueError(f"unknown linear kind {linear.kind!r}; 'column' or 'row'")


def best(profile: DeviceProfile, shape: Shape, backend: str, max_chunks: int, fixed: int = 0) -> Prediction:
    """The backend's prediction with the number of pieces per rank that the model likes best
    (or ``fixed`` pieces)."""
    if backend in FIXED_CHUNKS or fixed:
        return predict(profile, shape, METHOD[backend], FIXED_CHUNKS.get(backend, fixed))
    options = chunk_candidates(shape.m // shape.tp, profile.min_chunk_rows, max_chunks)
    return min((predict(profile, shape, METHOD[backend], c) for c in options), key=lambda p: p.time_s)


def choose(linear: LinearInfo, profile: DeviceProfile, backend: str = "auto",
           max_chunks: int = 8, fixed_chunks: int = 0) -> TPLinearPlan | None:
    if not linear.sequence_parallel or linear.tp_size < 2:
        return None
    available = linear.device.backends
    if backend != "auto" and backend not in available:
        why = "; ".join(linear.device.missing) or "not offered by the adapter"
        raise OverlapError(
            f"rlweave.overlap.backend={backend} cannot run on {linear.device.name} "
            f"({linear.device.comm_backend}): {why}. It runs {', '.join(available) or 'none'}; "
            f"set rlweave.overlap.backend=auto or one of those.")
    fwd_shape, bwd_shape = shapes(linear)
    names = [b for b in PREFERENCE if b in available] if backend == "auto" else [backend]
    if not names:
        return None
    options = {b: (best(profile, fwd_shape, b, max_chunks, fixed_chunks),
                   best(profile, bwd_shape, b, max_chunks, fixed_chunks)) for b in names}
    chosen = min(names, key=lambda b: options[b][0].time_s + options[b][1].time_s)
    fwd, bwd = options[chosen]
    if backend == "auto" and fwd.time_s + bwd.time_s >= fwd.sequential_s + bwd.sequential_s:
        return None
    rank, world = linear.tp_rank, linear.tp_size
    return TPLinearPlan(
        chosen,
        schedule(fwd_shape.op, rank, world, fwd.chunks_per_rank, predicted_s=fwd.time_s,
                 sequential_s=fwd.sequential_s),
        schedule(bwd_shape.op, rank, world, bwd.chunks_per_rank, predicted_s=bwd.time_s,
                 sequential_s=bwd.sequential_s),
    )
