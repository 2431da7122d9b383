"""RLHFuse's migration model keeps its figures on the shared simulator: the numbers below were
produced by stage fusion's own per-iteration simulation (``EngineCost`` and ``simulate_stage`` at
commit 24004e1) on these inputs, before it became a client of :mod:`rlweave.sim` (a
:class:`~rlweave.sim.stepped.SteppedSimulator` whose listener is the trainer's inference queue). They
cover engines on and off the trainer's devices, slots that leave samples waiting, destinations
that receive more than their free slots, dynamic inference batches and held inference."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.stage_fusion.migration import InferenceCost, engine_cost, plan_migration, simulate_stage
from rlweave.types import FusionStep, MigrationPlan, RolloutInstance

HOSTS = (RolloutInstance("i0", True, 4), RolloutInstance("i1", True, 4), RolloutInstance("i2", False, 4),
         RolloutInstance("i3", False, 8))
ENGINE = engine_cost(2e-3, 1e-4, 2e-5)
INFERENCE = (InferenceCost(0.05, 2.0, 4), InferenceCost(0.3, 3.0, 1), InferenceCost(0.01, 1.5, 8))
MIGRATIONS = ((0, (), False), (3, ("i2",), False), (6, ("i2", "i3"), True), (10, ("i3",), False),
              (20, ("i2", "i3"), True))  # threshold, destinations, inference waits
# one row per inference cost, one column per migration
STAGE_S = (
    (2.4221999999999984, 2.0080199999999917, 1.88763, 1.8072999999999937, 1.7706199999999865),
    (9.6006666666666, 8.305186666666575, 7.8882066666666155, 7.7391733333333494, 7.343346666666639),
    (1.3821999999999979, 1.4124799999999937, 1.3625199999999942, 1.4597599999999966, 1.6506199999999867),
)


def lengths() -> list[int]:
    return [int(x) for x in np.random.default_rng(11).integers(5, 400, 24)]


@pytest.mark.parametrize("row", range(len(INFERENCE)))
def test_each_step_keeps_its_simulated_stage(row: int) -> None:
    got = [simulate_stage(lengths(), HOSTS, ENGINE, INFERENCE[row], 64, threshold, dest, waits)
           for threshold, dest, waits in MIGRATIONS]
    assert got == pytest.approx(STAGE_S[row], rel=1e-9)


def test_the_plan_keeps_its_choice_and_its_prediction() -> None:
    step = FusionStep(step=2, samples=24, instances=HOSTS, prompt_len=64)
    sources, dest = ("i0", "i1"), ("i2", "i3")
    expected = (MigrationPlan(22, sources, dest, 7.3165824999999804, 9.262662499999958, False),
                MigrationPlan(13, sources, dest, 1.5877906250000005, 2.241434374999997, False))
    for (cost, seed), want in zip(((InferenceCost(0.3, 3.0, 2), 0), (INFERENCE[0], 3)), expected, strict=True):
        got = plan_migration(step, lengths(), ENGINE, cost, seed=seed)
        assert (got.threshold, got.sources, got.destinations, got.inference_waits) == (
            want.threshold, want.sources, want.destinations, want.inference_waits)
        assert (got.predicted_stage_s, got.predicted_stage_s_without) == pytest.approx(
            (want.predicted_stage_s, want.predicted_stage_s_without), rel=1e-9)
