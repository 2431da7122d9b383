"""ReLibra's layer with two expert-data-parallel replicas (EP=2 x EDP=2, four gloo processes):
one home layout per expert-data-parallel group. The two EP groups replay different routings,
yet plan the same layout (from their loads summed over the group), so Megatron's averaging of
each slot's gradient over the group averages one expert's gradients: outputs, input, router
and expert gradients and the weights after Adam equal Megatron's MoELayer's, with experts
moved and step replicas serving tokens."""

from __future__ import annotations

import numpy as np
import pytest

from test_megatron_adapter import run_ranks
from test_replay_balance import check_step

ENABLED = {"RLWEAVE__REPLAY_BALANCE__ENABLE": "true"}


@pytest.mark.timeout(300)
def test_every_ep_group_of_an_expert_data_parallel_group_applies_one_layout(tmp_path):
    ranks = run_ranks(4, tmp_path, script="edp_balance_worker.py", **ENABLED)
    groups = {tuple(rank["expt_dp_ranks"]) for rank in ranks}
    assert len(groups) == 2 and all(len(g) == 2 for g in groups)  # two EP groups, two replicas each
    for step in range(2):
        for group in groups:  # both replicas of each EP rank's slots hold the same experts
            first, second = (ranks[r]["steps"][step]["layout"] for r in group)
            np.testing.assert_array_equal(first, second)
        for replica in range(2):
            check_step([rank for rank in ranks if rank["replica"] == replica], step)
    assert any(rank["steps"][step]["moved"] > 0 for rank in ranks for step in range(2))  # experts moved
    assert sum(sum(rank["spare_tokens"]) for rank in ranks) > 0  # replicas served tokens
    static = np.array([0, 1, 2, 3, -1, 4, 5, 6, 7, -1])
    assert any(not np.array_equal(rank["steps"][s]["layout"], static) for rank in ranks for s in range(2))
