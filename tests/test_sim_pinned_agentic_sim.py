"""The agentic simulation keeps its figures: the numbers below were produced by
``benchmarks/agentic_sim.py``'s ``simulate`` (commit f145b79) on these inputs, before it was split
into small steps (issue 43 step 6), for every placement and queue pair the benchmarks run and
the tail switch. Figures: makespan, summed queueing, summed finish times, migrations (the
orchestrator's count, its warm-up run included) and when the tail switched."""

from __future__ import annotations

import pytest

from rlweave.benchmarks.agentic_sim import simulate
from rlweave.benchmarks.agentic_tail import TailParallelism
from rlweave.benchmarks.agentic_workload import previous_step, synthetic
from rlweave.plugins.agentic_rollout.orchestrator import TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel

COST = EngineCostModel(base_s=0.002, per_seq_s=0.0005, slots=4, prefill_s_per_token=1e-5)
PINNED = {
    ("sticky", "fcfs", False): (8.56977322796203, 3.491160424943311, 53.8702545058011, 13, None),
    ("sticky", "priority", False): (8.454957098999998, 3.7537980246913576, 54.11117792087408, 13, None),
    ("heddle", "fcfs", False): (8.588894988888885, 3.450787142857142, 53.82693689018224, 22, None),
    ("heddle", "priority", False): (8.358196504424487, 3.87469, 54.03536263945526, 27, None),
    ("heddle", "preemptive", False): (8.543860869137646, 4.820212840816325, 55.75660391476633, 23, None),
    ("heddle", "priority", True): (6.693789772434178, 3.2937394592199674, 50.05411352030808, 21,
                                   1.7747737577182345),
}


@pytest.mark.parametrize("case", list(PINNED), ids=lambda c: "-".join(map(str, c)))
def test_each_policy_keeps_its_figures(case: tuple[str, str, bool]) -> None:
    placement, queue, tail = case
    o = TrajectoryOrchestrator(COST)  # warmed on the step before, as the benchmarks do
    simulate(previous_step(4, prompts=8, group=4), 3, COST, placement="heddle", queue="priority", orchestrator=o)
    r = simulate(synthetic(4, prompts=8, group=4), 4 if tail else 3, COST, placement=placement, queue=queue,
                 orchestrator=o, seed=2, tail=TailParallelism(merge=2, speedup=3.0, switch_s=0.5) if tail else None)
    makespan, queueing, finish, migrations, switched = PINNED[case]
    assert (r.makespan_s, sum(r.queueing_s.values()), sum(r.finish_s.values())) == pytest.approx(
        (makespan, queueing, finish), rel=1e-9)
    assert r.migrations == migrations
    assert r.tail_switch_s == (None if switched is None else pytest.approx(switched, rel=1e-9))
