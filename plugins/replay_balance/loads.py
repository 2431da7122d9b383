"""Expert loads from routing traces, and rank loads under a placement."""

from __future__ import annotations

import numpy as np


def expert_loads(topk_ids: np.ndarray, bounds: tuple[int, ...] | np.ndarray, num_experts: int) -> np.ndarray:
    """Tokens routed to each expert, per micro-batch and layer.

    topk_ids: int [tokens, layers, top_k] of logical expert ids.
    bounds: token offsets [0, ..., tokens], one micro-batch per interval.
    Returns int64 [micro_batches, layers, num_experts].
    """
    bounds = np.asarray(bounds)
    tokens, layers, _ = topk_ids.shape
    if bounds[0] != 0 or bounds[-1] != tokens or np.any(np.diff(bounds) < 0):
        raise ValueError(f"micro-batch bounds must rise from 0 to {tokens}, got {bounds.tolist()}")
    mb_of_token = np.searchsorted(bounds, np.arange(tokens), side="right") - 1
    flat = (mb_of_token[:, None, None] * layers + np.arange(layers)[None, :, None]) * num_experts + topk_ids
    counts = np.bincount(flat.ravel(), minlength=(len(bounds) - 1) * layers * num_experts)
    return counts.reshape(len(bounds) - 1, layers, num_experts)


def rank_loads(load: np.ndarray, physical_to_logical: np.ndarray, token_share: np.ndarray,
               slots_per_rank: int) -> np.ndarray:
    """Tokens each rank computes.

    load: [..., num_experts] expert loads; physical_to_logical, token_share: [num_slots]
    (slot s of rank s // slots_per_rank serves token_share[s] of its expert's tokens; -1 = empty).
    Returns [..., num_ranks].
    """
    used = physical_to_logical >= 0
    per_slot = np.zeros(load.shape[:-1] + physical_to_logical.shape, dtype=float)
    per_slot[..., used] = load[..., physical_to_logical[used]] * token_share[used]
    return per_slot.reshape(load.shape[:-1] + (-1, slots_per_rank)).sum(axis=-1)


def imbalance(rank_load: np.ndarray) -> np.ndarray:
    """max / mean over the last axis (1.0 = perfectly balanced; empty loads count as 1.0)."""
    mean = rank_load.mean(axis=-1)
    return np.where(mean > 0, rank_load.max(axis=-1) / np.maximum(mean, 1e-12), 1.0)
