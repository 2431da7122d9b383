"""Expert loads from routing traces."""

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
