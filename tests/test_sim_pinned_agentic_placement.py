"""Heddle's placement cost keeps its figures on the shared engine model: the numbers below were
produced with the plugin's own ``EngineCostModel`` (commit b20d70b) on these inputs, before its
cost became :class:`rlweave.sim.EngineModel`."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.agentic_rollout.placement import (
    EngineCostModel,
    TrajectoryLoad,
    instance_cost,
    presorted_balance,
    serial_s,
)

PLAN = {"t11": "a", "t29": "b", "t12": "c", "t16": "d", "t21": "e", "t33": "d", "t3": "c", "t8": "d", "t19": "d",
        "t10": "d", "t6": "e", "t28": "e", "t17": "d", "t18": "e", "t34": "c", "t37": "c", "t15": "e", "t20": "c",
        "t23": "e", "t30": "c", "t2": "b", "t26": "e", "t13": "d", "t9": "e", "t4": "e", "t7": "e", "t14": "e",
        "t1": "e", "t31": "e", "t22": "e", "t38": "e", "t0": "e", "t25": "e", "t24": "e", "t36": "e", "t5": "e",
        "t27": "e", "t35": "e", "t39": "e", "t32": "e"}
COSTS = {"a": 20.968568615338686, "b": 20.102019211165445, "c": 19.99879620657952, "d": 20.23560969292388,
         "e": 20.4882661901362}


def loads() -> list[TrajectoryLoad]:
    rng = np.random.default_rng(11)
    return [TrajectoryLoad(f"t{i}", float(rng.integers(10, 3000)), float(rng.exponential(5.0))) for i in range(40)]


def fitted() -> EngineCostModel:
    return EngineCostModel.fit([1, 2, 4, 8], [0.0031, 0.0036, 0.0043, 0.0062], 8, 2e-5)


def test_the_fit_keeps_its_terms() -> None:
    fit = fitted()
    assert (fit.base_s, fit.per_seq_s, fit.slots, fit.prefill_s_per_token) == pytest.approx(
        (0.0026565217391304346, 0.0004382608695652175, 8, 2e-05), rel=1e-9)
    one_batch = EngineCostModel.fit([4, 4], [0.01, 0.012], 4)  # one batch size: its mean, no slope
    assert (one_batch.base_s, one_batch.per_seq_s) == pytest.approx((0.011, 0.0), rel=1e-9)


def test_the_placement_and_its_costs_stay() -> None:
    fit, all_loads = fitted(), loads()
    plan = presorted_balance(all_loads, ["a", "b", "c", "d", "e"], fit, {"t3": "c"})
    assert plan == PLAN
    per_instance = {i: instance_cost([t for t in all_loads if plan[t.trajectory_id] == i], fit) for i in COSTS}
    assert per_instance == pytest.approx(COSTS, rel=1e-9)
    assert serial_s(all_loads[0], fit) == pytest.approx(5.218204604428942, rel=1e-9)
    assert instance_cost(all_loads[:3], fit) == pytest.approx(9.07754186968035, rel=1e-9)
    assert instance_cost(all_loads, fit) == pytest.approx(42.772355978260876, rel=1e-9)
