"""ReLibra's planners keep their plans through the split of ``grow_replicas`` and
``_best_replica`` into small steps (issue 43 step 6): the figures below were produced by the
planner at commit f145b79 on these loads (one and two nodes, room for step and micro-batch
replicas). Per topology: ``plan_step``'s modelled time, fingerprints of its step layout and its
micro-batch placements, and ``plan_replication``'s placement fingerprint and share moment
(cheap copies, so micro-batch replicas pay)."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.plugins.replay_balance.planner import CostModel, home_layout, plan_replication, plan_step, static_home
from rlweave.types import ExpertTopology

PINNED = {  # (experts, nodes, ranks per node, slots per rank) -> figures
    (32, 1, 4, 10): (0.8196448735838682, 11281, 96233, 14594, 583.9822235294117),
    (64, 2, 4, 10): (0.4137087877037037, 133063, 458282, 123342, 2447.3417758566093),
    (16, 2, 2, 6): (0.255487084, 2625, 38868, 2152, 165.71861971411556),
    (64, 1, 8, 9): (0.4497862754789315, 97328, 462980, 111861, 2201.2032398406914),
}


def fingerprint(a: np.ndarray) -> int:
    return int(np.dot(np.ravel(a) + 1, np.arange(np.size(a)) % 97))


@pytest.mark.parametrize("seed,shape", list(enumerate(PINNED)))
def test_the_plans_keep_their_layouts_and_modelled_times(seed: int, shape: tuple[int, int, int, int]) -> None:
    experts, nodes, rpn, slots = shape
    rng = np.random.default_rng(seed)
    topo = ExpertTopology(experts, nodes, rpn, slots_per_rank=slots)
    load = rng.zipf(1.3, (4, experts)).clip(max=5000).astype(float) * rng.integers(1, 30, (4, experts))
    step = plan_step(load, topo, static_home(topo))
    p2l, share = plan_replication(load[0], home_layout(static_home(topo), topo)[0], topo,
                                  CostModel(expert_bytes=1e3), 1.0)
    time_s, layout, placements, micro, moment = PINNED[shape]
    assert step.time_s == pytest.approx(time_s, rel=1e-12)
    assert (fingerprint(step.layout), fingerprint(step.physical_to_logical), fingerprint(p2l)) == (
        layout, placements, micro)
    assert float((share * np.arange(share.size)).sum()) == pytest.approx(moment, rel=1e-9)
