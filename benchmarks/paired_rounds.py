"""Paired rounds: telling a 2% cost from a machine whose speed drifts by 15% within minutes.

Each arm (an engine configuration) runs one short call per round, the arms' order rotated from
round to round (A D E, D E A, E A D, ...), so that every call of an arm stands next to a call of
the baseline made seconds earlier or later. The drift cancels in the ratio of the two, and the
rotation spreads whatever one call leaves behind for the next (a warm cache, a spinning thread)
evenly over the arms. The ratios' median over many rounds, with a bootstrap percentile range,
then decides a goal: met where the whole range clears it, missed where the whole range falls
short, undecided otherwise.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def rotated_order(arms: Sequence[str], rounds: int) -> list[list[str]]:
    """The arms' order in each of ``rounds`` rounds: round ``r`` starts at arm ``r mod len``."""
    if rounds < 1 or not arms:
        raise ValueError(f"paired rounds need at least one round and one arm (got {rounds} rounds, "
                         f"arms {list(arms)}): pass --rounds >= 1")
    n = len(arms)
    return [[arms[(r + i) % n] for i in range(n)] for r in range(rounds)]


def paired_ratios(arm_s: Sequence[float], base_s: Sequence[float]) -> list[float]:
    """Per round, the arm's speed relative to the baseline's: ``base_s / arm_s`` of the same
    work's seconds (1.0: as fast; 0.97: 3% slower). Both lists are indexed by round."""
    if len(arm_s) != len(base_s) or not arm_s:
        raise ValueError(f"paired ratios need one time per round in both arms (got {len(arm_s)} "
                         f"and {len(base_s)})")
    return [b / a for a, b in zip(arm_s, base_s, strict=True)]


def bootstrap_median_range(values: Sequence[float], level: float = 0.95, resamples: int = 4000,
                           seed: int = 0) -> tuple[float, float]:
    """The ``level`` percentile range of the median over ``resamples`` bootstrap resamples of
    ``values`` (rounds drawn with replacement); seeded, so a result file can be recomputed."""
    if not values:
        raise ValueError("a bootstrap range needs at least one value")
    rng, n = random.Random(seed), len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    low = medians[int(tail * (resamples - 1))]
    high = medians[int(round((1.0 - tail) * (resamples - 1)))]
    return low, high


def verdict(low: float, high: float, goal: float) -> str:
    """``met`` when the whole range is at or above ``goal``, ``missed`` when it is all below,
    ``undecided`` when the range straddles it (more rounds are needed)."""
    if low >= goal:
        return "met"
    return "missed" if high < goal else "undecided"


def summarise(ratios: Sequence[float], goal: float, seed: int = 0) -> dict[str, object]:
    """Median, bootstrap 95% range, the rounds' own 5-95th percentile spread, and the verdict."""
    low, high = bootstrap_median_range(ratios, seed=seed)
    ordered = sorted(ratios)
    spread = [ordered[int(0.05 * (len(ordered) - 1))], ordered[int(round(0.95 * (len(ordered) - 1)))]]
    return {"median": statistics.median(ratios), "range95": [low, high], "rounds_p5_p95": spread,
            "rounds": len(ratios), "goal": goal, "verdict": verdict(low, high, goal)}
