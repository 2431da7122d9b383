"""StreamRL's planner keeps its figures on the shared simulator: the numbers below were produced
by the planner's own continuous-batching simulation (``ContinuousBatching`` at commit b20d70b)
on these inputs, before it became a client of :mod:`rlweave.sim` (its fluid mode). Sync modes
agree to rounding. Async is held to 1%: with five engines on one profile, many finishes tie, and
which engine claims the next group at a tie turns on rounding, in the old model too (its own
group completion times moved by up to 0.04 s when it was merely advanced at other instants);
the best async split's step went from 22.264 to 22.460 s (+0.9%)."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.stream_generation.planner import (
    GenerationProfile,
    HardwarePool,
    PlanMode,
    TrainingProfile,
    Workload,
    plan,
    predict,
    simulate_generation,
)

GEN = GenerationProfile((1, 4, 8, 16), (30.0, 100.0, 160.0, 220.0))
# mode -> (step_s, generation_s, generation_idle, training_idle) of 3 + 3 instances on 6 devices
PREDICTED = {
    PlanMode.COLOCATED: (43.48289361780263, 40.78289361780263, 0.10697759299576937, 0.9632039207403407),
    PlanMode.ON_POLICY: (42.549560284469294, 40.78289361780263, 0.08738896330610268, 0.9623967911935389),
    PlanMode.ASYNC: (34.9636363636363, 40.78289361780263, 0.02860114404576175, 0.9342173686947477),
}
# mode -> (generation instances, training instances, step_s) of the best split
PLANNED = {PlanMode.COLOCATED: (6, 6, 24.671801970307143), PlanMode.ON_POLICY: (5, 1, 33.294403618374474),
           PlanMode.ASYNC: (5, 1, 22.264340877699727)}
TOLERANCE = {PlanMode.COLOCATED: 1e-9, PlanMode.ON_POLICY: 1e-9, PlanMode.ASYNC: 0.01}


def workload() -> Workload:
    rng = np.random.default_rng(7)
    lengths = rng.integers(20, 400, (24, 4)).astype(float)
    following = tuple(rng.integers(20, 400, (24, 4)).astype(float) for _ in range(4))
    return Workload(lengths, minibatch_groups=4, weight_sync_s=0.7, dispatch_s=0.3, delivery_s=0.1,
                    following=following)


def test_generation_keeps_its_completion_and_busy_times() -> None:
    done, busy = simulate_generation(workload().lengths, [GEN, GEN, GenerationProfile((1, 8), (20.0, 120.0))])
    assert (done.max(), done.mean()) == pytest.approx((48.794063967041915, 32.44423374163341), rel=1e-9)
    assert busy == pytest.approx([42.15148837364994, 42.33207066283805, 48.794063967041915], rel=1e-9)


@pytest.mark.parametrize("mode", list(PREDICTED))  # the modes pinned before the shared simulator
def test_each_mode_keeps_its_predicted_step(mode: PlanMode) -> None:
    pools = [HardwarePool("p", 6, GEN, TrainingProfile(0.05, deferred_share=0.3))]
    got = predict(pools, workload(), mode, {"p": 3}, {"p": 3})
    expected = PREDICTED[mode]
    assert got.step_s == pytest.approx(expected[0], rel=TOLERANCE[mode])
    assert got.generation_s == pytest.approx(expected[1], rel=1e-9)
    assert (got.generation_idle, got.training_idle) == pytest.approx(expected[2:], abs=TOLERANCE[mode])
    best = plan(pools, workload(), mode)
    assert (best.generation["p"], best.training["p"]) == PLANNED[mode][:2]
    assert best.step_s == pytest.approx(PLANNED[mode][2], rel=TOLERANCE[mode])


def test_async_keeps_its_step_when_generation_bounds_it() -> None:
    pools = [HardwarePool("p", 6, GEN, TrainingProfile(0.4))]
    got = predict(pools, workload(), PlanMode.ASYNC, {"p": 2}, {"p": 4})
    assert got.step_s == pytest.approx(50.59999999999985, rel=0.01)
    assert (got.generation_idle, got.training_idle) == pytest.approx((0.01976284584980248, 0.796442687747035),
                                                                      abs=0.01)
