"""The fused pipeline schedule: simulator on hand-checked cases, the lower bound, baselines,
the search (valid, within bound, deterministic per seed) and ``rlweave fusion schedule``."""

from __future__ import annotations

import json

import pytest

from rlweave.cli import main
from rlweave.plugins.stage_fusion.baselines import greedy, one_f_one_b, separate_1f1b
from rlweave.plugins.stage_fusion.bounds import lower_bound
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, ProblemError, Task
from rlweave.plugins.stage_fusion.schedule import (
    Evaluator, FusedPipelineSchedule, InvalidSchedule, check, simulate,
)
from rlweave.plugins.stage_fusion.search import search

A, C = "actor", "critic"


def tiny() -> FusedPipelineProblem:
    """pp0 = pp1 = 2, one micro-batch each, forward 1, backward 2."""
    return FusedPipelineProblem.uniform(2, 2, 1, 1, 1, 1)


def fused_tiny() -> FusedPipelineSchedule:
    # GPU 0: actor stage 0, critic stage 1; GPU 1: actor stage 1, critic stage 0
    return FusedPipelineSchedule((
        (Task(A, 0, 0, "F"), Task(C, 0, 1, "F"), Task(C, 0, 1, "B"), Task(A, 0, 0, "B")),
        (Task(C, 0, 0, "F"), Task(A, 0, 1, "F"), Task(A, 0, 1, "B"), Task(C, 0, 0, "B")),
    ))


def test_hand_checked_fused_schedule_meets_its_bound():
    sim = simulate(tiny(), fused_tiny())
    # GPU0: aF 0-1, cF1 1-2 (after cF0 on GPU1 at 0-1), cB1 2-4, aB0 4-6 (after aB1 2-4)
    assert sim.start[0] == (0, 1, 2, 4) and sim.end[0] == (1, 2, 4, 6)
    assert sim.start[1] == (0, 1, 2, 4) and sim.makespan == 6
    assert sim.peak_memory.tolist() == [[1, 1], [1, 1]]
    assert lower_bound(tiny()).value == 6


def test_hand_checked_separate_1f1b():
    problem = tiny()
    sim = simulate(problem, Evaluator(problem).expand(separate_1f1b(problem)))
    # actor: F 0-1, 1-2, B 2-4, 4-6; critic then on GPU1 4-5, GPU0 6-7, B 7-9, GPU1 9-11
    assert sim.makespan == 11


def test_one_f_one_b_order_and_its_memory():
    assert one_f_one_b(4, 1, 4, 0) == [(0, 0), (0, 1), (0, 2), (1, 0), (0, 3), (1, 1), (1, 2), (1, 3)]
    problem = FusedPipelineProblem.uniform(4, 4, 8, 8, 1, 1)
    peaks = Evaluator.peak_memory(separate_1f1b(problem))
    assert peaks[:, 0].tolist() == [4, 3, 2, 1] and peaks[:, 1].tolist() == [1, 2, 3, 4]


def test_invalid_orders_are_named():
    orders = [list(o) for o in fused_tiny().orders]
    orders[1] = [orders[1][2], orders[1][0], orders[1][1], orders[1][3]]  # backward before forward
    with pytest.raises(InvalidSchedule, match="dependency violated: GPU 1 runs actor backward"):
        check(tiny(), FusedPipelineSchedule(tuple(map(tuple, orders))))
    with pytest.raises(InvalidSchedule, match="GPU 0 must run each of its tasks exactly once"):
        check(tiny(), FusedPipelineSchedule((fused_tiny().orders[0][:3], fused_tiny().orders[1])))
    with pytest.raises(InvalidSchedule, match="2 GPUs"):
        check(tiny(), FusedPipelineSchedule(fused_tiny().orders[:1]))


@pytest.mark.parametrize("sizes", [(4, 2, 4, 4, 2, 1), (4, 4, 8, 8, 1, 1), (8, 4, 8, 8, 1, 2),
                                   (2, 1, 3, 2, 1, 3), (8, 8, 8, 8, 2, 2)])
def test_lower_bound_is_below_every_makespan_and_search_beats_baselines(sizes):
    problem = FusedPipelineProblem.uniform(*sizes)
    bound = lower_bound(problem).value
    ev = Evaluator(problem)
    result = search(problem, seconds=0.5, seed=1)
    assert bound <= result.makespan <= min(result.greedy, result.separate_1f1b)
    assert simulate(problem, result.schedule).makespan == result.makespan
    assert ev.makespan(greedy(problem)) == result.greedy >= bound
    assert ev.makespan(separate_1f1b(problem)) == result.separate_1f1b >= bound
    assert (simulate(problem, result.schedule).peak_memory == result.peak_memory).all()


def test_search_is_deterministic_per_seed():
    problem = FusedPipelineProblem.uniform(8, 4, 8, 8, 1, 2)
    first, again = search(problem, seconds=0.5, seed=3), search(problem, seconds=0.5, seed=3)
    assert first.schedule == again.schedule and first.makespan == again.makespan


def test_bad_configurations_are_one_clear_error():
    with pytest.raises(ProblemError, match="not a multiple of the critic's 3"):
        FusedPipelineProblem.uniform(4, 3, 4, 4, 1, 1)
    with pytest.raises(ProblemError, match="actor micro-batches .* positive integer, got 0"):
        FusedPipelineProblem.uniform(4, 2, 0, 4, 1, 1)
    with pytest.raises(ProblemError, match="critic forward time .* positive, got -1"):
        FusedPipelineProblem.uniform(4, 2, 4, 4, 1, -1)


SIZES = ["--actor-pp", "4", "--critic-pp", "2", "--actor-mb", "4", "--critic-mb", "3",
         "--actor-fwd", "2", "--critic-fwd", "1"]


def test_cli_prints_the_issue_fields(capsys):
    assert main(["fusion", "schedule", *SIZES, "--seconds", "0.2", "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"makespan", "lower_bound", "separate_1f1b", "greedy", "peak_memory", "seconds",
            "schedule"} <= set(out)
    assert out["lower_bound"] <= out["makespan"] <= out["greedy"]
    assert len(out["schedule"]) == 4 and len(out["peak_memory"]) == 4
    assert all(len(order) == 2 * (4 + 3) for order in out["schedule"])
    model, micro_batch, stage, phase = out["schedule"][0][0]
    assert model in (A, C) and isinstance(micro_batch, int) and isinstance(stage, int) and phase in "FB"
    schedule = FusedPipelineSchedule.from_json(out["schedule"])
    assert simulate(FusedPipelineProblem.uniform(4, 2, 4, 3, 2, 1), schedule).makespan == out["makespan"]


def test_a_memory_cap_holds_and_still_beats_1f1b_where_it_leaves_room():
    problem = FusedPipelineProblem.uniform(4, 4, 16, 16, 1, 1)
    free = search(problem, seconds=0.5)
    one_f_one_b_peak = free.separate_1f1b_resident_peak
    assert one_f_one_b_peak == 4 and free.resident_peak > 2 * one_f_one_b_peak  # fusion holds far more
    capped = search(problem, seconds=0.5, memory_cap=2 * one_f_one_b_peak)
    held = Evaluator.resident_peak(Evaluator(problem).compact(capped.schedule))
    assert held.max() == capped.resident_peak <= 2 * one_f_one_b_peak
    assert free.makespan <= capped.makespan < capped.separate_1f1b
    assert check(problem, capped.schedule)  # a valid order


def test_a_cap_the_search_cannot_meet_is_one_clear_error():
    problem = FusedPipelineProblem.uniform(4, 4, 8, 8, 1, 1)
    with pytest.raises(ProblemError, match="Raise --memory-cap"):
        search(problem, seconds=0.01, memory_cap=1)
    with pytest.raises(ProblemError, match="positive number"):
        search(problem, seconds=0.01, memory_cap=0)


@pytest.mark.parametrize("change, cause", [(("--critic-pp", "3"), "not a multiple"),
                                           (("--actor-mb", "0"), "positive integer"),
                                           (("--critic-fwd", "0"), "must be positive"),
                                           (("--seconds", "0.01", "--memory-cap", "1"), "Raise --memory-cap")])
def test_cli_refuses_a_bad_configuration_with_exit_2(capsys, change, cause):
    argv = list(SIZES)
    if change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += change
    assert main(["fusion", "schedule", *argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and cause in captured.err and "Traceback" not in captured.err
    assert captured.err.startswith("rlweave fusion schedule: ") and captured.err.count("\n") == 1
