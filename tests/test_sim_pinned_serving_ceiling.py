"""``bench serving``'s SIMULATED ceiling keeps its figures on the shared simulator: the numbers
below were produced by the ceiling's own private simulator (``serving_ceiling.simulate`` at
commit b20d70b) on these inputs, before it became a client of :mod:`rlweave.sim`."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.benchmarks.serving import synthetic_workload
from rlweave.benchmarks.serving_ceiling import calibrate_speed, fit_engine, simulate
from rlweave.sim import EngineModel

# (workload kind, seed, load, policy) -> (mean, p95 normalised latency s/token, tokens/s)
PINNED = {
    ("heavy", 3, 0.6, "fcfs"): (0.0035797923672735796, 0.0046092190346034515, 533.877338157572),
    ("heavy", 3, 0.6, "srpt"): (0.0034266617184061402, 0.004416058241096202, 533.877338157572),
    ("heavy", 3, 0.95, "fcfs"): (0.007271726950219011, 0.022143419367492735, 840.8320992100831),
    ("heavy", 3, 0.95, "srpt"): (0.004221969008638719, 0.005558579481052372, 840.8320992100831),
    ("uniform", 4, 0.6, "fcfs"): (0.003480411256005469, 0.004891495856045102, 519.9850847971757),
    ("uniform", 4, 0.6, "srpt"): (0.003478216738319624, 0.004876526783880116, 519.9850847971757),
    ("uniform", 4, 0.95, "fcfs"): (0.005835741121262942, 0.012356486729050953, 818.5963213529592),
    ("uniform", 4, 0.95, "srpt"): (0.005614308033218327, 0.012704957230137273, 818.5963213529592),
}
CALIBRATED = {"heavy": (3, 1.0696716193633613), "uniform": (4, 1.0703959268483343)}
ENGINE = EngineModel(base_s=2e-3, per_seq_s=5e-4, slots=4, prefill_s_per_token=2e-5)


def rate_at(workload: list[dict], load: float) -> float:
    """Requests/s at ``load`` of the model's full-batch token rate."""
    return load * 4 / ENGINE.iteration_s(4, 0) / np.mean([r["output_len"] for r in workload])


@pytest.mark.parametrize("key", sorted(PINNED))
def test_the_ceiling_keeps_its_figures(key: tuple) -> None:
    kind, seed, load, policy = key
    workload = synthetic_workload(150, seed, kind)
    run = simulate(workload, rate_at(workload, load), ENGINE, policy)
    got = (run.norm_latency.mean(), np.percentile(run.norm_latency, 95), run.tokens_per_s)
    assert got == pytest.approx(PINNED[key], rel=1e-6)


@pytest.mark.parametrize("kind", sorted(CALIBRATED))
def test_the_calibration_keeps_its_factor(kind: str) -> None:
    seed, factor = CALIBRATED[kind]
    workload = synthetic_workload(150, seed, kind)
    rate = rate_at(workload, 0.95)
    measured = simulate(workload, rate, ENGINE.scaled(1.07), "fcfs").norm_latency.mean()
    assert calibrate_speed(workload, rate, ENGINE, measured) == pytest.approx(factor, rel=1e-6)


def test_the_fit_keeps_its_terms() -> None:
    engine = fit_engine([0.01, 1e-4, 3e-3], 900.0, 50, 40, slots=8)
    assert engine.iteration_s(1, 0) == pytest.approx(0.0023015873015873015 + 0.0006984126984126985)
    assert engine.iteration_s(8, 100) == pytest.approx(0.0023015873015873015 + 8 * 0.0006984126984126985 + 1e-2)
