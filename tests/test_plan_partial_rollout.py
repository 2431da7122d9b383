"""StreamRL's planner in verl's ``fully_async_policy`` mode: a rollouter up to a fraction of a
sync window ahead, a trainer that takes whatever finished first, and partial rollout at the
parameter sync (:func:`simulate_fully_async`), on a case worked by hand and on properties."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.stream_generation.planner import (
    FullyAsync,
    GenerationProfile,
    HardwarePool,
    PlanMode,
    TrainingProfile,
    Workload,
    plan,
    simulate_fully_async,
)

# One engine of two slots whose every sequence makes a token a second, whatever the batch.
ENGINE = GenerationProfile((1, 2), (1.0, 2.0))


def _steps(staleness: float, partial: bool, sync_s: float = 0.0, windows: int = 4) -> float:
    """Sync windows of two one-sample groups, a short (1 token) then a long one (4 tokens); the
    trainer takes one group at a time (a local update), a second each."""
    batches = [np.array([[1], [4]])] * windows
    workload = Workload(batches[0], 1, weight_sync_s=sync_s)
    return simulate_fully_async(batches, [ENGINE], 1.0, workload, FullyAsync(staleness, partial)).step_s


def test_a_case_worked_by_hand():
    """Groups g0 (1 token), g1 (4), g2 (1), g3 (4), ... in windows of two.

    Staleness 0 (streaming alone): a window's two groups start together at the last sync; the
    trainer trains g0 from 1 to 2, waits for g1 (done at 4), trains it to 5 and syncs: 5 s.

    Staleness 0.5, partial rollout: the rollouter may start 3 groups before the first sync, so
    g2 takes g0's slot at 1 and is done at 2. The trainer takes what finished first: g0 (1-2),
    g2 (2-3), and syncs at 3 while g1 is still generating; g1 keeps its 3 tokens and is done at
    4. After the sync (quota 5) g3 starts at 3 (done at 7) and g4 at 4 when g1 frees its slot
    (done at 5): the trainer trains g1 (4-5) and g4 (5-6) and syncs at 6; then g5 (6-10) and
    g6 (7-8), trained 7-8 and 8-9 (g3, g6), sync at 9. Syncs at 3, 6, 9: 3 s a step.

    Staleness 0.5 without partial rollout: the sync at 3 waits for g1 (4), so g3 and g4 start at
    4 (done at 8 and 5); g1 (4-5), g4 (5-6), then the sync waits for g3 (8); g5 and g6 start at 8,
    g3 (8-9), g6 (9-10), the sync waits for g5 (12). Syncs at 4, 8, 12: 4 s a step.
    """
    assert _steps(0.0, partial=True) == pytest.approx(5.0)
    assert _steps(0.5, partial=True) == pytest.approx(3.0)
    assert _steps(0.5, partial=False) == pytest.approx(4.0)


def test_partial_rollout_keeps_the_tokens_made_before_the_sync():
    """A 1 s sync on the same case: g1 stops at 3 with 3 of its 4 tokens and ends at 5, a second
    after the sync, not 4 (nothing is generated again); g3 likewise stops at 7 and ends at 9;
    syncs end at 4, 8 and 12."""
    assert _steps(0.5, partial=True, sync_s=1.0) == pytest.approx(4.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_partial_rollout_never_waits_longer_and_is_moot_without_staleness(seed):
    rng = np.random.default_rng(seed)
    batches = [np.maximum(1, rng.lognormal(3, 1, (6, 2))).round() for _ in range(5)]
    engines = [GenerationProfile((1, 4), (1.0, 3.0))] * 2
    workload = Workload(batches[0], 2, weight_sync_s=2.0, following=tuple(batches[1:]))

    def step(staleness: float, partial: bool) -> float:
        return simulate_fully_async(batches, engines, 3.0, workload, FullyAsync(staleness, partial)).step_s

    assert step(0.0, True) == pytest.approx(step(0.0, False))  # at staleness 0 nothing is in flight at a sync
    for staleness in (0.3, 1.0):
        assert step(staleness, True) <= step(staleness, False) + 1e-9
    assert step(1.0, True) <= step(0.0, True) + 1e-9  # running ahead never makes the step longer here


def test_the_planner_searches_splits_in_fully_async_mode():
    lengths = np.array([[1, 2], [8, 9], [2, 3], [30, 2]])
    pool = HardwarePool("gpu", 4, GenerationProfile((1, 4), (1.0, 4.0)), TrainingProfile(0.5))
    workload = Workload(lengths, 1, weight_sync_s=1.0)
    best = plan([pool], workload, PlanMode.FULLY_ASYNC, policy=FullyAsync(0.5))
    assert best.mode is PlanMode.FULLY_ASYNC and sum(best.devices["gpu"]) <= 4
    colocated = plan([pool], workload, PlanMode.COLOCATED)
    assert best.step_s < colocated.step_s  # the long group's tail no longer holds every device
    with pytest.raises(ValueError, match="staleness"):
        FullyAsync(-0.1)
