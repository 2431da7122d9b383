"""The simulator's two additions for the planner: the non-clairvoyant queue order (expected
remaining tokens on a learned distribution) and multi-turn trajectories with sticky placement and
a revisable priority, checked against figures worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.sim import ArrivalOrder, EngineModel, KeepRunning, Request, ShortestRemaining, Simulator
from rlweave.sim import ShortestRemainingPreempts as Preempts
from rlweave.sim.learned import ExpectedRemaining
from rlweave.sim.trajectories import Trajectory, run_trajectories


def test_expected_remaining_is_the_mean_residual_of_the_learned_lengths():
    order = ExpectedRemaining([1, 2, 3, 100])
    assert order.expected(0) == pytest.approx(26.5)  # (1+2+3+100)/4
    assert order.expected(3) == pytest.approx(97.0)  # only 100 is left
    assert order.expected(200) == 200  # past every sample: as long again
    assert order.key(Request(7, 0.0, 100, 0), left=97) == (pytest.approx(97.0), 7)  # attained 3
    with pytest.raises(ValueError, match="positive length"):
        ExpectedRemaining([])


def _mean_latency(lengths, order, preemption) -> float:
    sim = Simulator([EngineModel(base_s=0.01, per_seq_s=0.001, slots=4)], order=order, preemption=preemption)
    sim.submit([Request(i, 0.0, int(n)) for i, n in enumerate(lengths)])
    return float(sim.run().finish_array().mean())


@pytest.mark.parametrize("seed", [0, 1])
def test_on_heavy_tailed_lengths_the_learned_index_beats_fcfs_and_the_oracle_beats_both(seed):
    """256 Pareto lengths (64 can go either way: the index knows the distribution, not the draw)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum((rng.pareto(1.2, 256) + 1) * 5, 5000).astype(int) + 1
    fcfs = _mean_latency(lengths, ArrivalOrder(), KeepRunning())
    learned = _mean_latency(lengths, ExpectedRemaining(lengths), Preempts())
    oracle = _mean_latency(lengths, ShortestRemaining(), Preempts())
    assert oracle < learned < 0.9 * fcfs


def test_trajectories_keep_their_engine_wait_for_their_tools_and_follow_the_priority():
    engine = EngineModel(base_s=0.01, per_seq_s=0.001, slots=1)
    # one engine, one slot: A (10 tokens, 1 s tool, 20 tokens) and B (100 tokens)
    a, b = Trajectory((10, 20), 1.0), Trajectory((100,), 0.0)
    fcfs = run_trajectories([a, b], engine, [0, 0], 1)
    # A's first turn (0.11 s), then B (1.1 s, to 1.21), then A's second turn (0.22 s)
    assert fcfs == pytest.approx([1.43, 1.21])
    b_first = run_trajectories([a, b], engine, [0, 0], 1, priority=lambda k, done: -k)
    assert b_first == pytest.approx([1.1 + 0.11 + 1.0 + 0.22, 1.1])  # B, A's turn, its tool, its last turn
    apart = run_trajectories([a, b], engine, [0, 1], 2)
    assert apart == pytest.approx([0.11 + 1.0 + 0.22, 1.1])  # each on its own engine


def test_a_trajectorys_tool_gaps_each_follow_their_own_turn():
    engine = EngineModel(base_s=0.01, per_seq_s=0.0, slots=1)
    # three turns of 10 tokens (0.1 s each) with 2 tools of 2 s in all; a 150-token turn (1.5 s) queued behind
    slow_first = Trajectory((10, 10, 10), 1.0, gaps=(2.0, 0.0))
    even = Trajectory((10, 10, 10), 1.0)
    other = Trajectory((150,), 0.0)
    # the other turn runs inside the 2 s gap (0.1 to 1.6 s) and delays nothing: 0.1 + 2 + 0.1 + 0.1
    assert run_trajectories([slow_first, other], engine, [0, 0], 1)[0] == pytest.approx(2.3)
    # with 1 s gaps the second turn arrives at 1.1 s and waits for it: 1.6 + 0.1 + 1 + 0.1
    assert run_trajectories([even, other], engine, [0, 0], 1)[0] == pytest.approx(2.8)
    assert (slow_first.tool_left(0), slow_first.tool_left(1), even.tool_left(1)) == (2.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="one per turn but the last"):
        Trajectory((10, 10), 1.0, gaps=(1.0, 1.0))
