"""Splitting replicated experts' tokens among their slots, for a placement that is fixed.

Re-splitting costs nothing (no weight moves), so every micro-batch gets the best split of its
own loads: the one minimising the busiest rank. The set of rank loads reachable by splitting is
the base polytope of a polymatroid, where the point of least sum of squares also has the least
maximum (Fujishige's lexicographically optimal base). Coordinate descent finds it: each sweep
re-levels one replicated expert's tokens over its ranks by water-filling, the others held still.
"""

from __future__ import annotations

import numpy as np


def water_fill(base: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Share ``amount`` [n] over the columns of ``base`` [n, h] so the lowest of ``base + x`` rise
    to one level. Returns x >= 0 [n, h] with rows summing to ``amount``."""
    ordered = np.sort(base, axis=-1)
    levels = (amount[..., None] + np.cumsum(ordered, axis=-1)) / np.arange(1, base.shape[-1] + 1)
    fits = np.ones(levels.shape, dtype=bool)  # filling the k lowest stays below the next column
    np.less_equal(levels[..., :-1], ordered[..., 1:], out=fits[..., :-1])
    flat = levels.reshape(-1, levels.shape[-1])
    level = flat[np.arange(len(flat)), fits.reshape(flat.shape).argmax(axis=1)].reshape(levels.shape[:-1] + (1,))
    return np.maximum(level - base, 0.0)


def holders(physical_to_logical: np.ndarray, slots_per_rank: int) -> dict[int, np.ndarray]:
    """Slots [h] of each expert held more than once (owner first: slots in id order)."""
    used = np.nonzero(physical_to_logical >= 0)[0]
    counts = np.bincount(physical_to_logical[used])
    return {int(e): used[physical_to_logical[used] == e] for e in np.nonzero(counts > 1)[0]}


def split_shares(load: np.ndarray, physical_to_logical: np.ndarray, slots_per_rank: int,
                 start: np.ndarray | None = None, sweeps: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The best token split of each micro-batch for one layout.

    load: [M, E] tokens per expert; physical_to_logical: [R*S] (-1 empty, each expert at most once
    per rank); start: a split [M, R*S] to improve on (default: even among an expert's slots).
    Returns (token_share [M, R*S], rank_load [M, R]).
    """
    load = np.asarray(load, dtype=float)
    p2l = np.asarray(physical_to_logical)
    ranks = p2l.size // slots_per_rank
    share = np.zeros((load.shape[0], p2l.size))
    used = p2l >= 0
    replicated = holders(p2l, slots_per_rank)
    single = used & ~np.isin(p2l, list(replicated))
    share[:, single] = 1.0
    for e, slots in replicated.items():
        share[:, slots] = 1.0 / len(slots) if start is None else start[:, slots]
    rank_load = (np.where(used, load[:, np.maximum(p2l, 0)], 0.0) * share).reshape(len(load), ranks, -1).sum(-1)
    for _ in range(sweeps if replicated else 0):
        before = rank_load.copy()
        for e, slots in replicated.items():
            owner_ranks = slots // slots_per_rank
            mine = load[:, e : e + 1] * share[:, slots]
            x = water_fill(rank_load[:, owner_ranks] - mine, load[:, e])
            rank_load[:, owner_ranks] += x - mine
            share[:, slots] = np.divide(x, load[:, e : e + 1], out=share[:, slots], where=load[:, e : e + 1] > 0)
        if np.abs(rank_load - before).max() <= 1e-3 * max(rank_load.mean(), 1.0):  # settled to 0.1%
            break
    return share, rank_load
