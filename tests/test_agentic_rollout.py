"""Heddle's pure parts: predictor, presorted placement, orchestrator decisions, config, and the
simulator the benchmark extrapolates with."""

from __future__ import annotations

import itertools
import json

import pytest

from rlweave.benchmarks.agentic_sim import serial_time, simulate
from rlweave.benchmarks.agentic_workload import dump_trace, load_trace, synthetic
from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import build_plugin_manager
from rlweave.plugins.agentic_rollout.orchestrator import OrchestratorSettings, TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import (
    EngineCostModel,
    TrajectoryLoad,
    assign_runs,
    instance_cost,
    presorted_partition,
)
from rlweave.plugins.agentic_rollout.predictor import RemainingWorkPredictor
from rlweave.types import InstanceLoad, TrajectoryInfo

COST = EngineCostModel(base_s=0.002, per_seq_s=0.0005, slots=4, prefill_s_per_token=1e-5)


def test_predictor_conditions_on_the_turns_already_survived() -> None:
    p = RemainingWorkPredictor(prior_turns=3.0)
    assert p.predict("t", "g", 0, 0).remaining_turns == 3.0  # nothing learned yet: the prior
    for turns in (2, 2, 2, 10):
        p.observe_finished("t", f"old{turns}", turns, turns * 10)
    assert p.predict("t", "g", 0, 0).remaining_turns == pytest.approx(4.0)
    # Having survived 3 turns, only the 10-turn trajectory is like it.
    late = p.predict("t", "g", 3, 30)
    assert late.remaining_turns == pytest.approx(7.0)
    assert late.remaining_tokens == pytest.approx(70.0)
    # Beyond everything seen: the remainder grows with the age reached.
    assert p.predict("t", "g", 20, 200).remaining_turns == pytest.approx(10.0)


def test_predictor_weighs_finished_siblings_above_the_task() -> None:
    p = RemainingWorkPredictor(sibling_weight=9.0)
    p.observe_finished("t", "other", 2, 20)
    p.observe_finished("t", "mine", 12, 120)
    assert p.predict("t", "mine", 0, 0).remaining_turns == pytest.approx((9 * 12 + 2 + 12) / 11)
    assert p.predict("t", "unrelated", 0, 0).remaining_turns == pytest.approx(7.0)


def _brute_force_best(loads: list[TrajectoryLoad], k: int) -> float:
    order = sorted(loads, key=lambda t: -(t.remaining_tokens + t.remaining_tool_s))
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(order)), k - 1):
        bounds = (0, *cuts, len(order))
        best = min(best, max(instance_cost(order[a:b], COST) for a, b in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize("k", [2, 3])
def test_presorted_partition_is_the_best_contiguous_cut(k: int) -> None:
    loads = [TrajectoryLoad(f"t{i}", tokens, tool)
             for i, (tokens, tool) in enumerate([(900, 4.0), (40, 0.1), (300, 1.0), (50, 0.5),
                                                 (700, 0.2), (20, 0.0), (120, 2.0), (60, 0.3)])]
    runs = presorted_partition(loads, k, COST)
    assert len(runs) == k
    assert sorted(t.trajectory_id for run in runs for t in run) == sorted(t.trajectory_id for t in loads)
    got = max(instance_cost(run, COST) for run in runs)
    assert got == pytest.approx(_brute_force_best(loads, k), rel=1e-2)


def test_assign_runs_keeps_trajectories_where_they_are() -> None:
    a, b, c = (TrajectoryLoad(x, 10, 0) for x in "abc")
    plan = assign_runs([[a, b], [c]], ["i0", "i1"], current={"c": "i0", "a": "i1", "b": "i1"})
    assert plan == {"a": "i1", "b": "i1", "c": "i0"}


def _info(tid: str, turns: int = 0, tokens: int = 0, queued: float = 0.0,
          instance: str | None = None, task: str = "code") -> TrajectoryInfo:
    return TrajectoryInfo(tid, f"g-{tid}", turns, tokens, queued, instance, task, 32)


def _trained_orchestrator(**settings: float) -> TrajectoryOrchestrator:
    o = TrajectoryOrchestrator(COST, OrchestratorSettings(**settings))
    for turns in (1, 1, 2, 2, 3, 20):
        o.predictor.observe_finished("code", f"old{turns}", turns, turns * 50)
    return o


def test_priority_favours_predicted_long_and_long_queued_trajectories() -> None:
    o = _trained_orchestrator()
    fresh, survivor = o.priority(_info("a")), o.priority(_info("b", turns=4, tokens=200))
    assert survivor < fresh  # vLLM runs smaller priorities first
    assert o.priority(_info("c", queued=5.0)) < fresh
    assert o.priority(_info("c", queued=5.0)) - fresh == -5000  # 1 s of queueing = 1 s of urgency


def _fill(o: TrajectoryOrchestrator, instance: str) -> None:
    """Occupy every slot of ``instance`` with turns of long-surviving (most urgent) trajectories."""
    for k in range(COST.slots):
        o.started(_info(f"busy{k}", turns=5, tokens=250))
        o.choose_instance(_info(f"busy{k}", turns=5, tokens=250), [InstanceLoad(instance, 0, 0)],
                          now=0.0)


def test_a_turn_goes_where_it_can_start_and_migration_is_counted() -> None:
    o = _trained_orchestrator(replan_s=0.0, migrate_fraction=1.0)
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    _fill(o, "i0")
    o.started(_info("x"))
    assert o.choose_instance(_info("x", instance="i0", turns=1, tokens=50), instances, now=1.0) == "i1"
    assert o.migrations == 1


def test_no_migration_when_it_does_not_pay() -> None:
    o = _trained_orchestrator(migrate_fraction=0.0)
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    _fill(o, "i0")
    assert o.choose_instance(_info("x", instance="i0", turns=1), instances, now=0.0) == "i0"
    assert o.migrations == 0


def test_a_caller_that_knows_less_keeps_what_the_agent_loop_said() -> None:
    o = _trained_orchestrator()
    o.started(_info("x", queued=2.0))
    # verl's balancer knows the request id and context length only.
    o.choose_instance(TrajectoryInfo("x", "", 1, 40), [InstanceLoad("i0", 0, 0)], now=0.0)
    info = o._active["x"].info
    assert (info.task, info.group_id, info.queued_s, info.turns_done) == ("code", "g-x", 2.0, 1)


def test_finished_twice_is_learned_once() -> None:
    o = TrajectoryOrchestrator(COST)
    o.started(_info("x", task="t"))
    o.finished(_info("x", turns=3, tokens=30, task="t"))
    o.finished(_info("x", turns=3, tokens=30, task="t"))
    assert o.predictor.predict("t", "new", 0, 0).remaining_turns == 3.0
    assert len(o.predictor._tasks["t"].turns) == 1


def test_config_enables_the_plugin_and_its_hooks_answer() -> None:
    config = build_config([Setting("agentic_rollout.enable", True, "test"),
                           Setting("agentic_rollout.slots", 4, "test")])
    pm = build_plugin_manager(config)
    priority = pm.hook.rlweave_request_priority(trajectory=_info("x"))
    assert isinstance(priority, int)
    chosen = pm.hook.rlweave_choose_instance(trajectory=_info("x"),
                                             instances=[InstanceLoad("a", 0, 0)])
    assert chosen == "a"


@pytest.mark.parametrize("option,value", [("slots", 0), ("iteration_base_ms", -1.0),
                                          ("migrate_fraction", 1.5), ("queue_weight", -0.1)])
def test_bad_settings_name_the_option(option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"rlweave.agentic_rollout.{option}"):
        build_config([Setting(f"agentic_rollout.{option}", value, "test")])


@pytest.mark.parametrize("placement,queue", [("sticky", "fcfs"), ("heddle", "priority"),
                                             ("heddle", "preemptive")])
def test_simulation_finishes_every_trajectory_within_its_bounds(placement: str, queue: str) -> None:
    workload = synthetic(3, prompts=8, group=4)
    result = simulate(workload, 2, COST, placement=placement, queue=queue,
                      orchestrator=TrajectoryOrchestrator(COST), seed=0)
    assert set(result.finish_s) == {t.id for t in workload}
    assert result.makespan_s >= max(serial_time(t, COST) for t in workload) * 0.999


def test_simulated_preemption_starts_the_urgent_turn_at_once() -> None:
    """One slot, a short turn running: a long trajectory's first turn arriving later preempts
    it under ``preemptive`` and waits for it under ``priority``."""
    from rlweave.benchmarks.agentic_workload import Trajectory

    one_slot = EngineCostModel(0.002, 0.0, 1, 0.0)
    short = Trajectory("short", "a", "lookup", 8, (400,), ())
    long = Trajectory("long", "b", "code", 8, (800,), ())

    class Oracle(TrajectoryOrchestrator):
        def load(self, t: TrajectoryInfo) -> TrajectoryLoad:
            left = {"short": (400,), "long": (800,)}[t.trajectory_id][t.turns_done:]
            return TrajectoryLoad(t.trajectory_id, sum(left), 0.0)

    waited = {}
    for queue in ("priority", "preemptive"):
        result = simulate([short, long], 1, one_slot, placement="heddle", queue=queue,
                          orchestrator=Oracle(one_slot))
        assert set(result.finish_s) == {"short", "long"}
        waited[queue] = result.queueing_s["long"]
    # Both arrive at 0 and the short one takes the slot first: 0.8 s of it under priority.
    assert waited["priority"] > 0.5
    assert waited["preemptive"] < 0.01
    assert result.finish_s["short"] > result.finish_s["long"]


def test_trace_round_trip_and_bad_lines(tmp_path) -> None:
    workload = synthetic(1, prompts=2, group=2)
    dump_trace(workload, tmp_path / "w.jsonl")
    assert load_trace(tmp_path / "w.jsonl") == workload
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "a", "turn_tokens": [3, 4]}) + "\n")
    with pytest.raises(ValueError, match="one tool latency between consecutive turns"):
        load_trace(tmp_path / "bad.jsonl")


def test_tail_parallelism_switches_only_when_it_pays() -> None:
    from rlweave.plugins.agentic_rollout.parallelism import TailParallelism

    tail = TailParallelism(merge=2, speedup=2.0, switch_s=1.0)
    long = [TrajectoryLoad("a", 4000, 1.0)]  # 8 s of decode at batch 1: halving it pays
    assert tail.should_switch(long, instances=4, cost=COST)
    short = [TrajectoryLoad("a", 200, 1.0)]  # 0.5 s of decode: the switch costs more
    assert not tail.should_switch(short, instances=4, cost=COST)
    crowd = [TrajectoryLoad(f"t{i}", 4000, 0.0) for i in range(9)]  # more than 2 x 4 slots
    assert not tail.should_switch(crowd, instances=4, cost=COST)
    with pytest.raises(ValueError, match="speedup > 1"):
        TailParallelism(speedup=1.0)


def test_simulated_tail_switch_keeps_every_trajectory() -> None:
    from rlweave.plugins.agentic_rollout.parallelism import TailParallelism

    workload = synthetic(3, prompts=8, group=4)
    o = TrajectoryOrchestrator(COST)
    result = simulate(workload, 4, COST, placement="heddle", queue="priority", orchestrator=o,
                      tail=TailParallelism(merge=2, speedup=4.0, switch_s=0.0))
    assert result.tail_switch_s is not None
    assert set(result.finish_s) == {t.id for t in workload}


def test_regimes_bench_bounds_every_policy_and_names_a_missing_cost_model(tmp_path) -> None:
    from rlweave.benchmarks.agentic_regimes import Regime, measured_cost, simulate_regime

    ratios = simulate_regime(Regime("small", prompts=4, group=2), COST, instances=2, seed=0)
    assert set(ratios) == {"verl", "rlweave", "oracle", "oracle_preemptive"}
    assert all(r >= 0.999 for r in ratios.values())  # nothing beats the lower bound
    (tmp_path / "agentic.json").write_text(json.dumps({"details": {"cost_model": {
        "base_s": 0.004, "per_seq_s": 0.0, "slots": 4, "prefill_s_per_token": 3e-5}}}))
    assert measured_cost(str(tmp_path / "agentic.json")).base_s == 0.004
    with pytest.raises(SystemExit, match="run `rlweave bench agentic` first"):
        measured_cost(str(tmp_path / "missing.json"))
