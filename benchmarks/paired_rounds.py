"""Paired rounds: telling a 2% cost from a machine whose speed drifts by 15% within minutes.

Each arm (an engine configuration) runs one short call per round, the arms' order rotated from
round to round (A D E, D E A, E A D, ...), so that every call of an arm stands next to a call of
the baseline made seconds earlier or later. The drift cancels in the ratio of the two, and the
rotation spreads whatever one call leaves behind for the next (a warm cache, a spinning thread)
evenly over the arms. The ratios' median over many rounds, with a bootstrap percentile range,
then decides a goal: met where the whole range clears it, missed where the whole range falls
short, undecided otherwise. Where other work shares the machine, calls stall by up to 10x and
the median's range stays wide; the ratio of each arm's fastest calls (:func:`fastest_ratio`)
is then the sharper figure for a cost paid in every call, and blind to one paid in some calls
only (a periodic flush), which the median counts.

Where the rounds come from several sets of fresh processes, the sets differ by more than the
rounds within one do (seen: one set's median 1.05, the next's 0.98, for the same code), so the
range resamples the sets first and then the rounds within each set drawn (``clusters``): it
counts what a fresh process costs or gains by chance, and narrows with more sets, not with more
rounds in the same processes.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

FASTEST = 0.10  # the share of each arm's calls that ``fastest_ratio`` compares


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


def _bootstrap(statistic: Callable[[list[int]], float], rounds: int, level: float, resamples: int,
               seed: int, clusters: Sequence[int] | None = None) -> tuple[float, float]:
    """The ``level`` percentile range of ``statistic`` over bootstrap resamples of the rounds
    (indices drawn with replacement, the same rounds for every arm); with ``clusters`` (each
    round's set of processes), the sets are drawn first and then rounds within each. Seeded,
    so a result file can be recomputed."""
    if rounds < 1:
        raise ValueError("a bootstrap range needs at least one round")
    if clusters is not None and len(clusters) != rounds:
        raise ValueError(f"one cluster per round is needed (got {len(clusters)} for {rounds} rounds)")
    groups = [list(range(rounds))]
    if clusters is not None:
        groups = [[i for i in range(rounds) if clusters[i] == c] for c in sorted(set(clusters))]
    rng = random.Random(seed)
    values = sorted(statistic(_draw(rng, groups)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return values[int(tail * (resamples - 1))], values[int(round((1.0 - tail) * (resamples - 1)))]


def _draw(rng: random.Random, groups: list[list[int]]) -> list[int]:
    """One two-stage resample: groups with replacement, then each drawn group's rounds."""
    drawn = groups if len(groups) == 1 else rng.choices(groups, k=len(groups))
    return [i for group in drawn for i in rng.choices(group, k=len(group))]


def bootstrap_median_range(values: Sequence[float], level: float = 0.95, resamples: int = 4000,
                           seed: int = 0, clusters: Sequence[int] | None = None) -> tuple[float, float]:
    """The ``level`` percentile range of the median of ``values`` (one per round)."""
    return _bootstrap(lambda idx: statistics.median(values[i] for i in idx), len(values), level, resamples, seed,
                      clusters)


def lower_quantile(values: Sequence[float], share: float) -> float:
    """The value below which ``share`` of ``values`` lie (nearest rank, rounded down)."""
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


def fastest_ratio(arm_s: Sequence[float], base_s: Sequence[float], share: float = FASTEST) -> float:
    """The baseline's fastest calls over the arm's: ``lower_quantile(base_s) /
    lower_quantile(arm_s)``. A stall of a shared machine only ever slows a call; since the
    rotation gives every arm the same share of quiet moments, each arm's fastest calls are what
    it does when left alone."""
    return lower_quantile(base_s, share) / lower_quantile(arm_s, share)


def verdict(low: float, high: float, goal: float) -> str:
    """``met`` when the whole range is at or above ``goal``, ``missed`` when it is all below,
    ``undecided`` when the range straddles it (more rounds are needed)."""
    if low >= goal:
        return "met"
    return "missed" if high < goal else "undecided"


def summarise(ratios: Sequence[float], goal: float, seed: int = 0,
              clusters: Sequence[int] | None = None) -> dict[str, object]:
    """Median, bootstrap 95% range (over ``clusters`` then rounds, where given), the rounds' own
    5-95th percentile spread, and the verdict."""
    low, high = bootstrap_median_range(ratios, seed=seed, clusters=clusters)
    spread = [lower_quantile(ratios, 0.05), sorted(ratios)[int(round(0.95 * (len(ratios) - 1)))]]
    return {"median": statistics.median(ratios), "range95": [low, high], "rounds_p5_p95": spread,
            "rounds": len(ratios), "goal": goal, "verdict": verdict(low, high, goal)}


def summarise_fastest(arm_s: Sequence[float], base_s: Sequence[float], goal: float,
                      seed: int = 0, clusters: Sequence[int] | None = None) -> dict[str, object]:
    """:func:`fastest_ratio` with its bootstrap 95% range over paired rounds (over ``clusters``
    then rounds, where given), and the verdict."""
    if len(arm_s) != len(base_s):
        raise ValueError(f"the fastest calls need one time per round in both arms (got {len(arm_s)} "
                         f"and {len(base_s)})")
    low, high = _bootstrap(lambda idx: fastest_ratio([arm_s[i] for i in idx], [base_s[i] for i in idx]),
                           len(arm_s), 0.95, 4000, seed, clusters)
    return {"ratio": fastest_ratio(arm_s, base_s), "share": FASTEST, "range95": [low, high],
            "rounds": len(arm_s), "goal": goal, "verdict": verdict(low, high, goal)}
