"""Heddle's pure parts: the serial-time predictor, presorted placement, the orchestrator's
decisions, the plugin's hooks and config, and the simulator the benchmark plans with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlweave.benchmarks.agentic_sim import serial_time, simulate
from rlweave.benchmarks.agentic_workload import WORKLOADS, Trajectory, dump_trace, load_trace, synthetic
from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import build_plugin_manager
from rlweave.plugins.agentic_rollout.orchestrator import OrchestratorSettings, TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import (
    EngineCostModel,
    TrajectoryLoad,
    instance_cost,
    presorted_balance,
)
from rlweave.plugins.agentic_rollout.predictor import SerialTimePredictor
from rlweave.types import InstanceLoad, TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo

COST = EngineCostModel(base_s=0.002, per_seq_s=0.0005, slots=4, prefill_s_per_token=1e-5)


def test_remaining_turns_condition_on_the_turns_already_survived() -> None:
    p = SerialTimePredictor(prior_turns=3.0, shrink=1e-9)
    assert p.predict("t", "g", 0).remaining_turns == pytest.approx(3.0)  # the prior
    for turns in (2, 2, 2, 10):
        p.observe_finished("t", f"old{turns}", turns)
    assert p.predict("t", "g", 0).remaining_turns == pytest.approx(4.0)
    # Having survived 3 turns, only the 10-turn trajectory is like it.
    assert p.predict("t", "g", 3).remaining_turns == pytest.approx(7.0)
    # Beyond everything seen: the remainder grows with the age reached, at least half as much
    # again (more here: outliving everything also says its own prompt runs long).
    assert p.predict("t", "g", 20).remaining_turns >= 10.0


def test_a_group_scales_its_task_by_its_finished_and_running_samples() -> None:
    p = SerialTimePredictor(shrink=1.0)
    for k, turns in enumerate((2, 2, 4, 4) * 4):
        p.observe_finished("t", f"other{k}", turns)
    base = p.predict("t", "new", 1).remaining_turns
    # Siblings that stopped after one turn: a short prompt.
    short = SerialTimePredictor(shrink=1.0)
    short.load_state_dict(p.state_dict())
    for _ in range(3):
        short.observe_finished("t", "mine", 1)
    assert short.predict("t", "mine", 1).remaining_turns < base
    # Three siblings all past everything the task has seen: a long prompt.
    assert p.predict("t", "mine", 1, siblings_running=(6, 6, 6)).remaining_turns > 2 * base


def test_a_trajectory_that_outlives_its_siblings_rises() -> None:
    # The task: nine 1-turn and two 10-turn trajectories; three of them the prompt's own samples,
    # all finished after one turn. shrink 1, prior 4. The task's mean is (29 + 4) / (11 + 1) =
    # 2.75, and its conditional mean past x turns, for 2 <= x < 10, is (20 + the Lindy fallback
    # max(4, 1.5 x)) / (2 + 1): 8 past 2, 8.01 past 2.69, 8.58 past 3.83.
    p = SerialTimePredictor(prior_turns=4.0, shrink=1.0)
    for k, turns in enumerate((1,) * 6 + (10, 10)):
        p.observe_finished("t", f"other{k}", turns)
    for _ in range(3):
        p.observe_finished("t", "mine", 1)
    # The sample still running at 2 turns is a censored sample of its group, worth its expected
    # total 8 with weight 9/11 (the share of totals it outlived): the group's scale is
    # (3 + 72/11 + 2.75) / (3 + 9/11 + 1) / 2.75 = 0.928, and it is expected to last 0.928 times
    # the task's mean past (2 + 0.5) / 0.928 = 2.69 turns: 0.928 x 8.01 = 7.44 turns, 5.44 more.
    assert p.predict("t", "mine", 2).remaining_turns == pytest.approx(5.4364, abs=1e-4)
    # The point estimate from its siblings alone (scale (3 + 2.75) / 4 / 2.75 = 0.523, times
    # the 8.58 past 3.83 turns = 4.48 in all) said 2.48 more: it ranked the long one as short.
    assert p.predict("t", "mine", 2).remaining_turns > 2.4848 + 2.0
    # The longer it survives, the longer it is expected to last in all.
    totals = [d + p.predict("t", "mine", d).remaining_turns for d in (1, 2, 3, 5)]
    assert totals == sorted(totals) and totals[-1] > totals[0] + 1.0


def test_survival_estimate_of_a_geometric_mixture_is_its_closed_form() -> None:
    # A tenth of the trajectories stop after each turn with chance 0.1, the rest with 0.5: each
    # part is memoryless, so past k turns a part still has 1/p turns to go, and
    # E[T - k | T > k] = (0.1 x 0.9^k / 0.1 + 0.9 x 0.5^k / 0.5) / (0.1 x 0.9^k + 0.9 x 0.5^k):
    # 2.8 at the start, 7.42 after five turns (by then most survivors are the deep kind).
    p = SerialTimePredictor(shrink=1e-3, history=200_000)
    for t in range(1, 120):
        share = 0.1 * 0.9 ** (t - 1) * 0.1 + 0.9 * 0.5 ** (t - 1) * 0.5
        for _ in range(round(100_000 * share)):
            p.observe_finished("t", "g", t)
    for k in range(8):
        alive = 0.1 * 0.9 ** k + 0.9 * 0.5 ** k
        expected = (0.1 * 0.9 ** k / 0.1 + 0.9 * 0.5 ** k / 0.5) / alive
        assert p.predict("t", "g", k).remaining_turns == pytest.approx(expected, rel=0.02), k
    assert p.predict("t", "g", 5).remaining_turns > 2.5 * p.predict("t", "g", 0).remaining_turns


def _mean_tau_all_turns(workload: str, seeds: int) -> float:
    """Kendall's tau between the remaining serial time the orchestrator predicted at each turn
    and the true one, weighted over turns as ``bench agentic`` weighs it, in SIMULATED batches of
    the shape, the predictor warmed on the previous epoch; the mean over ``seeds`` batches."""
    from rlweave.benchmarks.agentic import kendall_tau, true_serial_s
    from rlweave.benchmarks.agentic_workload import previous_step

    taus = []
    for seed in range(seeds):
        o = TrajectoryOrchestrator(COST)
        simulate(previous_step(seed, workload), 2, COST, placement="heddle", queue="priority",
                 orchestrator=o)
        batch = {t.id: t for t in synthetic(seed, workload=workload)}
        seen: dict[int, dict[str, tuple[float, float]]] = {}
        ranked = o.priority

        def priority(info: TrajectoryInfo) -> int:
            p = ranked(info)
            true = true_serial_s(batch[info.trajectory_id], info.turns_done, o.per_token_s)
            seen.setdefault(info.turns_done, {})[info.trajectory_id] = (-p, true)
            return p

        o.priority = priority
        simulate(list(batch.values()), 2, COST, placement="heddle", queue="priority",
                 orchestrator=o, seed=seed)
        per_turn = [(kendall_tau(*np.array(list(v.values())).T), len(v)) for v in seen.values()
                    if len(v) >= 4]
        per_turn = [(tau, n) for tau, n in per_turn if np.isfinite(tau)]
        taus.append(np.average([tau for tau, _ in per_turn], weights=[n for _, n in per_turn]))
    return float(np.mean(taus))


# Mean tau over all turns, seeds 0-3, of the predictor before survival counted the trajectory's
# own (at 4cd5e96, measured with the function above). A 4-seed mean's noise is about 0.03 (the
# seeds' taus spread by 0.05-0.1).
TAU_BEFORE = {"default": 0.395, "tool-dominated": 0.305, "token-dominated": 0.456,
              "deep-tail": 0.264, "mixed": 0.379}


@pytest.mark.parametrize("workload", sorted(TAU_BEFORE))
def test_survival_conditioning_keeps_the_ranking_of_the_original_shapes(workload: str) -> None:
    assert _mean_tau_all_turns(workload, seeds=4) > TAU_BEFORE[workload] - 0.03


def test_own_pace_counts_as_much_as_the_task_shows_it_persists() -> None:
    rng = np.random.default_rng(0)
    persistent, iid = SerialTimePredictor(), SerialTimePredictor()
    for k in range(40):  # each trajectory keeps its own tool speed in one task, not the other
        speed = rng.lognormal(0, 1.0)
        calls = rng.lognormal(np.log(speed), 0.1, 5)
        persistent.observe_finished("t", f"g{k}", 6, own_tools=(5, calls.mean(), calls.var() * 5))
        flat = rng.lognormal(0, 1.0, 5)
        iid.observe_finished("t", f"g{k}", 6, own_tools=(5, flat.mean(), flat.var() * 5))
    own = (3 * 4.0, 3)  # three calls of 4 s each so far
    slow_p = persistent.predict("t", "x", 3, own_tools=own).tool_s_per_call
    slow_i = iid.predict("t", "x", 3, own_tools=own).tool_s_per_call
    assert slow_p > 3.0 > slow_i


def test_a_groups_pace_counts_as_much_as_the_tasks_groups_differ() -> None:
    rng = np.random.default_rng(1)
    by_prompt, by_sample = SerialTimePredictor(), SerialTimePredictor()
    for g in range(30):  # a prompt sets its samples' tool speed in one task; each sample its own in the other
        prompt_speed = rng.lognormal(0, 1.0)
        for s in range(4):
            for p, speed in ((by_prompt, prompt_speed), (by_sample, rng.lognormal(0, 1.0))):
                calls = rng.lognormal(np.log(speed), 0.1, 5)
                for c in calls:
                    p.observe_tool("t", f"g{g}", c)
                p.observe_finished("t", f"g{g}", 6, own_tools=(5, calls.mean(), calls.var() * 5))
    for p in (by_prompt, by_sample):
        for _ in range(3):  # one earlier group whose three samples were slow
            for _ in range(5):
                p.observe_tool("t", "slow", 4.0)
            p.observe_finished("t", "slow", 6, own_tools=(5, 4.0, 0.0))
    new_sample = {p: p.predict("t", "slow", 0).tool_s_per_call for p in (by_prompt, by_sample)}
    task_mean = by_sample.predict("t", "other", 0).tool_s_per_call
    assert new_sample[by_prompt] > 3.0
    assert abs(new_sample[by_sample] - task_mean) < 0.5 * abs(4.0 - task_mean)


def test_history_decays_per_batch_and_stays_bounded() -> None:
    p = SerialTimePredictor(shrink=1e-6, decay=0.5, history=3)
    p.observe_finished("t", "a", 2)
    p.new_batch()
    p.observe_finished("t", "b", 8)
    # (0.5 * 2 + 8) / 1.5: the older batch counts half.
    assert p.predict("t", "g", 0).remaining_turns == pytest.approx(6.0)
    for _ in range(5):
        p.observe_finished("t", "c", 4)
    assert len(p._tasks["t"].turns.values) == 3


def test_state_round_trips_and_rejects_another_version() -> None:
    p = SerialTimePredictor()
    p.observe_finished("t", "g", 5, own_tokens=(5, 30.0, 40.0), own_tools=(4, 0.5, 0.1))
    p.observe_turn("t", "g", 30)
    p.observe_tool("t", "g", 0.5)
    state = json.loads(json.dumps(p.state_dict()))
    q = SerialTimePredictor()
    q.load_state_dict(state)
    assert q.predict("t", "g", 1) == p.predict("t", "g", 1)
    with pytest.raises(ValueError, match="version"):
        q.load_state_dict({**state, "version": 0})
    # A checkpoint from before the spreads kept their group still loads.
    old_rows = {"tasks": {"t": {**state["tasks"]["t"], "tool_spread": [[4, 0.5, 0.1, 0]]}}}
    q.load_state_dict({**state, **old_rows})
    assert q._tasks["t"].tool_spread.rows == [(4, 0.5, 0.1, q.batch, "")]


def test_presorted_balance_spreads_the_longest_and_keeps_ties_in_place() -> None:
    loads = [TrajectoryLoad(f"t{i}", tokens, tool)
             for i, (tokens, tool) in enumerate([(900, 4.0), (40, 0.1), (700, 3.0), (50, 0.5),
                                                 (60, 0.2), (20, 0.0)])]
    plan = presorted_balance(loads, ["i0", "i1"], COST, current={})
    assert set(plan) == {t.trajectory_id for t in loads}
    assert plan["t0"] != plan["t2"]  # the two longest lead different instances
    costs = [instance_cost([t for t in loads if plan[t.trajectory_id] == i], COST) for i in ("i0", "i1")]
    assert max(costs) == pytest.approx(instance_cost(loads[:1], COST), rel=0.05)
    a, b = (TrajectoryLoad(x, 10, 0) for x in "ab")
    assert presorted_balance([a, b], ["i0", "i1"], COST, current={"a": "i1", "b": "i0"}) == \
        {"a": "i1", "b": "i0"}


def _info(tid: str, turns: int = 0, tokens: int = 0, instance: str | None = None,
          task: str = "code", group: str | None = None) -> TrajectoryInfo:
    return TrajectoryInfo(tid, group or f"g-{tid}", turns, tokens, instance, task, 32, 32 + tokens)


def _trained(**settings: float) -> TrajectoryOrchestrator:
    o = TrajectoryOrchestrator(COST, OrchestratorSettings(**settings))
    for turns in (1, 1, 2, 2, 3, 20):
        o.predictor.observe_finished("code", f"old{turns}", turns)
    return o


def test_priority_is_the_remaining_serial_time_longest_first() -> None:
    o = _trained()
    for info in (_info("a"), _info("b", turns=4, tokens=200)):
        o.started(info)
        o.turn_started(info, now=0.0)
    fresh, survivor = o.priority(_info("a")), o.priority(_info("b", turns=4, tokens=200))
    assert survivor < fresh  # vLLM runs smaller priorities first
    # Minus the milliseconds of the predicted remaining tokens at a busy engine's pace (COST with
    # its 4 slots full: 2 ms + 4 x 0.5 ms = 4 ms an iteration, one token each) plus the
    # predicted tool time: whatever the predictor predicts, priority is that time.
    for info, priority in ((_info("a"), fresh), (_info("b", turns=4, tokens=200), survivor)):
        load = o.load(info)
        assert priority == -round((load.remaining_tokens * 0.004 + load.remaining_tool_s) * 1000)


def test_the_gap_between_turns_is_learned_as_tool_time() -> None:
    o = TrajectoryOrchestrator(COST)
    o.started(_info("x"))
    o.turn_started(_info("x"), now=0.0)
    o.turn_ended(_info("x", turns=1, tokens=40), now=1.0)
    o.turn_started(_info("x", turns=1, tokens=40), now=4.0)  # 3 s in tools
    assert o._active["x"].own_tools.summary == (1, 3.0, 0.0)
    assert o._active["x"].own_tokens.summary == (1, 40.0, 0.0)
    assert o.predictor._tasks["code"].tools.values == [3.0]


def _fill(o: TrajectoryOrchestrator, instance: str) -> None:
    """Occupy every slot of ``instance`` with turns of long-surviving (most urgent) trajectories."""
    for k in range(COST.slots):
        busy = _info(f"busy{k}", turns=5, tokens=250)
        o.started(busy)
        o.turn_started(busy, now=0.0)
        o.priority(busy)
        o.choose_instance(busy, [InstanceLoad(instance, 0, 0)], now=0.0)


def test_a_turn_goes_where_it_can_start_and_migration_is_counted() -> None:
    o = _trained(replan_s=0.0, migrate_fraction=1.0)
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    _fill(o, "i0")
    o.started(_info("x"))
    o.turn_started(_info("x", turns=1, tokens=50), now=1.0)
    o.priority(_info("x", turns=1, tokens=50))
    assert o.choose_instance(_info("x", instance="i0", turns=1, tokens=50), instances, now=1.0) == "i1"
    assert o.migrations == 1


def test_no_migration_when_it_does_not_pay_and_no_answer_for_strangers() -> None:
    o = _trained(migrate_fraction=0.0)
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    _fill(o, "i0")
    o.started(_info("x"))
    assert o.choose_instance(_info("x", instance="i0", turns=1), instances, now=0.0) == "i0"
    assert o.migrations == 0
    # A request no agent loop reported (e.g. another agent loop): the framework's own choice.
    assert o.choose_instance(_info("stranger"), instances, now=0.0) is None


def test_finished_twice_is_learned_once_and_a_new_batch_ages_history() -> None:
    o = TrajectoryOrchestrator(COST)
    o.started(_info("x", task="t"))
    assert o.predictor.batch == 1
    o.finished(_info("x", turns=3, tokens=30, task="t"))
    o.finished(_info("x", turns=3, tokens=30, task="t"))
    assert o.predictor._tasks["t"].turns.values == [3.0]
    o.started(_info("y", task="t"))  # the rollout had emptied: a new batch
    assert o.predictor.batch == 2


def test_kendalls_s_and_its_variance_without_skill_by_hand() -> None:
    from rlweave.plugins.agentic_rollout.skill import kendall_s

    # Pairs (1,2) and (1,3) concordant, (2,3) discordant: S = 1; no ties: 3 x 2 x 11 / 18.
    assert kendall_s([1, 2, 3], [1, 3, 2]) == pytest.approx((1.0, 66 / 18))
    # A tie among the predictions scores nothing and narrows the variance: the tied group of 2
    # takes 2 x 1 x 9 from 3 x 2 x 11, so (66 - 18) / 18; the other ranking has no ties.
    assert kendall_s([1, 1, 2], [1, 2, 3]) == pytest.approx((2.0, 48 / 18))
    assert kendall_s([5, 5, 5], [1, 2, 3]) == (0.0, 0.0)  # every prediction alike: no evidence
    assert kendall_s([1], [2]) == (0.0, 0.0)


def test_realised_remaining_time_is_the_turns_and_tools_that_followed() -> None:
    from rlweave.plugins.agentic_rollout.skill import realised_remaining_s

    # Turns of 10, 20, 30 tokens at 0.1 s a token, tools of 1 s and 2 s after the first two:
    # from turn 2, 3 s; from turn 1, 2 + 2 + 3 = 7 s; from turn 0, 1 + 1 + 7 = 9 s.
    assert realised_remaining_s([10, 20, 30], [1.0, 2.0], 0.1) == pytest.approx([9.0, 7.0, 3.0])


def test_skill_is_summed_per_turn_index_decays_per_batch_and_needs_evidence() -> None:
    from rlweave.plugins.agentic_rollout.skill import PredictiveSkill

    skill = PredictiveSkill(decay=0.5)
    assert not skill.scored and skill.z == 0.0
    # Turn 0: three trajectories ranked exactly (S = 3, variance 66/18); turn 1: two of them
    # ranked backwards (S = -1, variance 2 x 1 x 9 / 18 = 1). Pairs are only compared within
    # a turn index, and the same trajectories' turn indices count as if fully correlated: the
    # variance is the square of the summed standard deviations.
    skill.record({0: 1.0, 1: 5.0}, [1.0, 0.5])
    skill.record({0: 2.0, 1: 1.0}, [2.0, 1.5])
    skill.record({0: 3.0}, [3.0])
    skill.close_batch()
    var = (np.sqrt(66 / 18) + 1.0) ** 2
    assert (skill.s, skill.var) == pytest.approx((2.0, var))
    assert skill.z == pytest.approx(2.0 / np.sqrt(var))
    # A batch with nothing scored: S and its variance age by the decay, z does not move.
    skill.close_batch()
    assert (skill.s, skill.var) == pytest.approx((1.0, var / 4))
    # A saved state keeps the scored batches and the pairs of this one so far.
    skill.record({0: 1.0}, [2.0])
    skill.record({0: 2.0}, [1.0])  # S = -1, variance 2 x 1 x 9 / 18 = 1
    again = PredictiveSkill(decay=0.5)
    again.load_state_dict(json.loads(json.dumps(skill.state_dict())))
    for k in (skill, again):
        k.close_batch()
    assert (again.s, again.var) == (skill.s, skill.var) == pytest.approx((0.5 - 1.0, var / 16 + 1.0))


def _no_skill_state(o: TrajectoryOrchestrator, s: float) -> dict:
    """``o``'s state with scored evidence of ``s`` over a null variance of 100: z = s / 10."""
    return {**o.state_dict(), "skill": {"s": s, "var": 100.0, "batch_s": 0.0, "batch_var": 0.0}}


def test_without_skill_the_framework_gives_each_turn_its_priority_and_place() -> None:
    o = _trained(replan_s=0.0, migrate_fraction=1.0)
    o.load_state_dict(_no_skill_state(o, s=19.0))  # z = 1.9: less than 2 standard errors
    assert not o.following
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    _fill(o, "i0")  # what made the skilled orchestrator move "x" in the test above
    o.started(_info("x"))
    o.turn_started(_info("x", turns=1, tokens=50), now=1.0)
    assert o.priority(_info("x", turns=1, tokens=50)) is None  # the framework's own priority
    assert o.priority(_info("busy0", turns=5, tokens=250)) is None  # no turn ranks above another
    assert o.choose_instance(_info("x", instance="i0", turns=1, tokens=50), instances, now=1.0) is None
    assert o.migrations == 0
    # Still predicted, and scored when it finishes: skill can come back.
    assert o._active["x"].predicted_s[1] == pytest.approx(o.remaining_s(_info("x", turns=1, tokens=50)))


def test_with_skill_the_decisions_are_unchanged() -> None:
    guarded, unguarded = _trained(replan_s=0.0, migrate_fraction=1.0), \
        _trained(replan_s=0.0, migrate_fraction=1.0, skill_z=None)
    guarded.load_state_dict(_no_skill_state(guarded, s=20.0))  # z = 2.0
    instances = [InstanceLoad("i0", 0, 0), InstanceLoad("i1", 0, 0)]
    decisions = []
    for o in (guarded, unguarded):
        _fill(o, "i0")
        o.started(_info("x"))
        o.turn_started(_info("x", turns=1, tokens=50), now=1.0)
        decisions.append((o.priority(_info("x", turns=1, tokens=50)),
                          o.choose_instance(_info("x", instance="i0", turns=1, tokens=50), instances, now=1.0),
                          o.migrations))
    assert decisions[0] == decisions[1] and decisions[0][1:] == ("i1", 1) and decisions[0][0] < 0


def test_a_state_without_skill_scored_decides_as_heddle() -> None:
    o = _trained()
    state = o.state_dict()
    del state["skill"]  # a checkpoint from before skill was scored
    o.load_state_dict(state)
    assert o.following and not o.skill.scored


def test_a_first_batch_learned_from_nothing_is_not_scored_the_next_is() -> None:
    o = TrajectoryOrchestrator(COST)
    for scored in (False, True):
        simulate(synthetic(0, prompts=8, group=4), 2, COST, placement="heddle", queue="priority",
                 orchestrator=o)
        o.skill.close_batch()
        assert o.skill.scored == scored


def test_history_epochs_are_the_same_prompts_in_earlier_epochs_oldest_first() -> None:
    """A longer warm-up is more of the same prompts' earlier epochs, each with its own draws,
    ending with the batch that two epochs end with: more scored batches, nothing else moved."""
    from rlweave.benchmarks.agentic_workload import history_batches

    two, four = history_batches(0, "tool-speed-mix"), history_batches(0, "tool-speed-mix", epochs=4)
    assert [len(b) for b in four] == [len(two[0])] * 4 and four[2:] == two
    assert [b[0].id.split("-")[0] for b in four] == ["prev4", "prev3", "prev2", "prev"]
    assert {t.group for t in four[0]} == {t.group for t in two[1]}  # the same prompts
    assert [t.turn_tokens for t in four[0]] != [t.turn_tokens for t in four[1]]  # new draws
    with pytest.raises(ValueError, match="at least 1"):
        history_batches(0, "tool-speed-mix", epochs=0)


def _two_epochs_then(workload: str, seed: int = 0) -> tuple[TrajectoryOrchestrator, list[Trajectory]]:
    """The shipped orchestrator after SIMULATED rollouts of the shape's two previous epochs (the
    first unscored: it started from nothing), and the batch that follows."""
    from rlweave.benchmarks.agentic_workload import history_batches

    o = TrajectoryOrchestrator(COST)
    for past in history_batches(seed, workload):
        simulate(past, 2, COST, placement="heddle", queue="priority", orchestrator=o)
    o.started(_info("next", task="agent"))  # the next batch starts: the previous one is scored
    o.finished(_info("next", task="agent"))
    return o, synthetic(seed, workload=workload)


def test_skill_shows_where_there_is_something_to_learn_and_not_on_a_coin_flip() -> None:
    for shape in ("default", "mixed", "depth-mix-grouped"):
        assert _two_epochs_then(shape)[0].skill.z > 2, shape
    depth_mix, batch = _two_epochs_then("depth-mix")
    assert abs(depth_mix.skill.z) < 2 and not depth_mix.following
    # Not following, the shipped orchestrator is verl's default in the simulator: the same
    # placement (sticky, least in-flight, the same draws), the same order, no migration.
    verl = simulate(batch, 2, COST, seed=0)
    guarded = simulate(batch, 2, COST, placement="heddle", queue="priority", orchestrator=depth_mix, seed=0)
    assert guarded.makespan_s == verl.makespan_s and guarded.finish_s == verl.finish_s
    assert depth_mix.migrations == 0 or guarded.migrations == depth_mix.migrations


def _event(kind: TrajectoryEventKind, info: TrajectoryInfo, t: float) -> TrajectoryEvent:
    return TrajectoryEvent(kind, info, t)


def test_config_enables_the_plugin_and_its_hooks_answer_and_keep_state() -> None:
    config = build_config([Setting("agentic_rollout.enable", True, "test"),
                           Setting("agentic_rollout.slots", 4, "test")])
    pm = build_plugin_manager(config)
    x = _info("x")
    pm.hook.rlweave_trajectory_event(event=_event(TrajectoryEventKind.START, x, 0.0))
    pm.hook.rlweave_trajectory_event(event=_event(TrajectoryEventKind.TURN_START, x, 0.0))
    assert isinstance(pm.hook.rlweave_request_priority(trajectory=x), int)
    assert pm.hook.rlweave_choose_instance(trajectory=x, instances=[InstanceLoad("a", 0, 0)]) == "a"
    done = _info("x", turns=1, tokens=12)
    pm.hook.rlweave_trajectory_event(event=_event(TrajectoryEventKind.TURN_END, done, 0.5))
    pm.hook.rlweave_trajectory_event(event=_event(TrajectoryEventKind.FINISH, done, 0.5))
    [state] = pm.hook.rlweave_rollout_state()
    assert state["agentic_rollout"]["predictor"]["tasks"]["code"]["turns"] == [[1.0, 0]]
    fresh = build_plugin_manager(config)
    fresh.hook.rlweave_restore_rollout_state(state={"other_plugin": {}, **state})
    assert fresh.hook.rlweave_rollout_state() == [state]


@pytest.mark.parametrize("option,value", [("slots", 0), ("iteration_base_ms", -1.0),
                                          ("migrate_fraction", 1.5), ("history_decay", 0.0),
                                          ("prior_tool_ms", -1.0), ("history", 0)])
def test_bad_settings_name_the_option(option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"rlweave.agentic_rollout.{option}"):
        build_config([Setting(f"agentic_rollout.{option}", value, "test")])


@pytest.mark.parametrize("z,follows", [(None, True), (3.0, False), (0.0, True)])
def test_skill_z_option_reaches_the_guard(z: float | None, follows: bool) -> None:
    """Evidence of z = 2.5: the default threshold (2) follows it, 3 does not, 0 does."""
    import rlweave.plugins.agentic_rollout.plugin as plugin

    settings = [Setting("agentic_rollout.enable", True, "test")]
    if z is not None:
        settings.append(Setting("agentic_rollout.skill_z", z, "test"))
    build_plugin_manager(build_config(settings))
    o = plugin.orchestrator
    o.load_state_dict(_no_skill_state(o, s=25.0))
    assert o.settings.skill_z == (2.0 if z is None else z)
    assert o.following is follows


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf")])
def test_a_bad_skill_z_is_refused_with_what_is_allowed(value: float) -> None:
    with pytest.raises(ConfigError, match=r"rlweave\.agentic_rollout\.skill_z.*finite number >= 0"):
        build_config([Setting("agentic_rollout.skill_z", value, "test")])


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
    from rlweave.benchmarks.agentic_oracle import oracle_for

    one_slot = EngineCostModel(0.002, 0.0, 1, 0.0)
    short = Trajectory("short", "a", "lookup", 8, (400,), ())
    long = Trajectory("long", "b", "code", 8, (800,), ())
    waited = {}
    for queue in ("priority", "preemptive"):
        result = simulate([short, long], 1, one_slot, placement="heddle", queue=queue,
                          orchestrator=oracle_for(one_slot, [short, long]))
        assert set(result.finish_s) == {"short", "long"}
        waited[queue] = result.queueing_s["long"]
    # Both arrive at 0 and the short one takes the slot first: 0.8 s of it under priority.
    assert waited["priority"] > 0.5
    assert waited["preemptive"] < 0.01
    assert result.finish_s["short"] > result.finish_s["long"]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_workload_shape_is_seeded_and_revisits_its_prompts(workload: str) -> None:
    from rlweave.benchmarks.agentic_workload import previous_step

    batch = synthetic(0, workload=workload)
    assert batch == synthetic(0, workload=workload)
    assert all(len(t.tool_s) == len(t.turn_tokens) - 1 for t in batch)
    before = previous_step(0, workload, history="epoch")
    assert {t.group for t in before} == {t.group for t in batch}  # same prompts, new samples
    assert [t.turn_tokens for t in before] != [t.turn_tokens for t in batch]
    assert not {t.group for t in previous_step(0, workload, history="new-prompts")} & {t.group for t in batch}


def test_mixtures_of_depths_draw_depth_per_sample_and_share_it_only_where_grouped() -> None:
    from rlweave.benchmarks.agentic_workload import synthetic_with_parameters

    def by_prompt(workload: str) -> dict[str, list]:
        out: dict[str, list] = {}
        for seed in range(4):
            for t, p in synthetic_with_parameters(seed, workload=workload):
                out.setdefault(f"{seed}-{t.group}", []).append(p)
        return out

    # depth-mix: one chance for every sample, a coin flip each; shallow totals are memoryless.
    flat = [p for ps in by_prompt("depth-mix").values() for p in ps]
    assert {p.deep_chance for p in flat} == {0.08} and 0 < sum(p.deep for p in flat) < len(flat) / 4
    # depth-mix-grouped: a chance and a tool speed per prompt, shared by its samples, differing
    # between prompts; a prompt's samples that are not deep stop within 3 turns.
    grouped = by_prompt("depth-mix-grouped")
    assert all(len({(p.deep_chance, p.shape.tool_median_s) for p in ps}) == 1 for ps in grouped.values())
    chances = sorted(ps[0].deep_chance for ps in grouped.values())
    assert chances[len(chances) // 2] < 0.1 and chances[-1] > 0.8
    assert len({ps[0].shape.tool_median_s for ps in grouped.values()}) == len(grouped)
    pairs = [tp for seed in range(4) for tp in synthetic_with_parameters(seed, workload="depth-mix-grouped")]
    assert all(len(t.turn_tokens) <= 3 for t, p in pairs if not p.deep)
    assert all(len(t.turn_tokens) >= 10 for t, p in pairs if p.deep)


def test_trace_round_trip_and_bad_lines_name_file_line_and_fields(tmp_path) -> None:
    workload = synthetic(1, prompts=2, group=2)
    dump_trace(workload, tmp_path / "w.jsonl")
    assert load_trace(tmp_path / "w.jsonl") == workload
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "turn_tokens": [3]}) + "\n" + "{not json\n")
    with pytest.raises(SystemExit, match=rf"{bad}:2: expected .*turn_tokens.*tool_s"):
        load_trace(bad)
    bad.write_text(json.dumps({"id": "a", "turn_tokens": [3, 4]}) + "\n")
    with pytest.raises(SystemExit, match=rf"{bad}:1: needs >= 1 turn .* one tool latency"):
        load_trace(bad)


def test_tail_parallelism_switches_only_when_it_pays() -> None:
    from rlweave.benchmarks.agentic_tail import TailParallelism

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
    from rlweave.benchmarks.agentic_tail import TailParallelism

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


def test_prediction_quality_is_kendalls_tau_per_turn() -> None:
    from rlweave.benchmarks.agentic import kendall_tau, prediction_quality
    from rlweave.benchmarks.agentic_rollout import RolloutRun, TrajectoryRun

    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    batch = [Trajectory(f"t{k}", "g", "x", 8, (10,) * (k + 1), (1.0,) * k) for k in range(5)]
    # Priorities that rank the remaining serial time right at the first turn, wrong at the second.
    runs = {t.id: TrajectoryRun(priorities=[-1000 * len(t.turn_tokens), 1000 * len(t.turn_tokens)][
        :len(t.turn_tokens)]) for t in batch}
    q = prediction_quality(RolloutRun(1.0, runs), batch, per_token_s=0.01, min_trajectories=4)
    assert q["first_turn"] == pytest.approx(1.0)
    assert q["per_turn"][1] == {"tau": -1.0, "trajectories": 4}


def test_the_informed_ceiling_knows_the_generator_not_the_draws() -> None:
    from rlweave.benchmarks.agentic_oracle import InformedOrchestrator, expected_remaining_turns
    from rlweave.benchmarks.agentic_workload import TrajectoryParameters, synthetic_with_parameters

    pairs = synthetic_with_parameters(0, workload="mixed")
    assert [t for t, _ in pairs] == synthetic(0, workload="mixed")
    t, p = next((t, p) for t, p in pairs if p.deep)
    assert expected_remaining_turns(p, 0) == pytest.approx(np.mean(range(*p.shape.deep_turns)) + 0.5)
    assert expected_remaining_turns(p, p.shape.deep_turns[1]) == 1.0  # past every total it could draw
    informed = InformedOrchestrator(COST, {t.id: t for t, _ in pairs}, {t.id: p for t, p in pairs})

    def tool_s_per_call(t: Trajectory, p: TrajectoryParameters, done: int) -> float:
        load = informed.load(TrajectoryInfo(t.id, t.group, done, 0, None, t.task, t.prompt_len))
        return load.remaining_tool_s / (expected_remaining_turns(p, done) - 1.0)

    # A mixture of depths: memoryless shallow turns (stop chance 0.4) and a deep chance of 8%
    # (10-20 turns): E = 0.92 x 2.5 + 0.08 x 15 = 3.5 turns; having survived three turns,
    # (0.92 x 0.6^3 x 2.5 + 0.08 x 12) / (0.92 x 0.6^3 + 0.08) = 5.23 more.
    mix = next(p for t, p in synthetic_with_parameters(0, workload="depth-mix"))
    assert expected_remaining_turns(mix, 0) == pytest.approx(3.5, rel=1e-3)
    assert expected_remaining_turns(mix, 3) == pytest.approx(5.227, rel=1e-3)
    # A sandbox's speed is learned from its calls: two slow ones raise the expected pace.
    t, p = next((t, p) for t, p in pairs if p.shape.trajectory_tool_sigma and len(t.tool_s) >= 3
                and min(t.tool_s[:2]) > 1.5 * p.shape.tool_median_s)
    assert tool_s_per_call(t, p, 2) > 1.2 * tool_s_per_call(t, p, 0)


# Makespans (s) the harness below reports per policy and round of ``bench agentic``'s contended
# runs, the trajectory alone, and the uncontended small batch: the report's figures follow from
# them by hand. verl over rlweave: 12/10 = 1.2 and 14/10 = 1.4, median 1.3; verl over the oracle:
# 1.5 and 1.75, median 1.625; rlweave over the oracle: 1.25 twice; the lower bound is the longest
# trajectory alone, 5 s (the batch at full throughput takes less), so rlweave is 10/5 = 2x over
# it and verl 13/5 = 2.6x (median of 12 and 14); uncontended 4/3.2 = 1.25x.
MAKESPANS = {"verl": [12.0, 14.0], "rlweave": [10.0, 10.0], "oracle": [8.0, 8.0]}
ALONE_S, SMALL_S = 5.0, {"verl": 4.0, "rlweave": 3.2}
# Per turn, by hand: a tool call's end to the next turn's arrival at its engine, and the CPU of
# the agent loops and of the balancer actor (ms). rlweave adds 0.5, 0.25 and 0.4 ms a turn.
DISPATCH_MS = {"verl": 2.0, "rlweave": 2.5, "oracle": 2.5}
CPU_MS = {"verl": (1.0, 0.2), "rlweave": (1.25, 0.6), "oracle": (1.25, 0.6)}


class ReplayedHarness:
    """``bench agentic``'s harness with the engines replaced by the makespans above; each
    trajectory's tokens are its workload tokens, but for the policy in ``other_tokens``, which
    gets one token changed in one trajectory (a scheduler that altered a sample)."""

    instances, slots, cost, state = 2, 4, COST, {}

    def __init__(self, other_tokens: str | None = None) -> None:
        from rlweave.benchmarks import agentic

        self.config = build_config(agentic.plugin_settings(COST))
        self.other_tokens = other_tokens

    def group_of(self, t: Trajectory) -> str:
        return t.group

    async def warm_up(self, history: list[Trajectory]) -> None:
        self.state = {}

    async def rollout(self, policy: str, batch: list[Trajectory], tag: str = ""):
        from rlweave.benchmarks.agentic_rollout import RolloutRun, TrajectoryRun

        if tag == "alone":
            makespan = ALONE_S
        elif "-small" in tag:
            makespan = SMALL_S[policy]
        else:
            makespan = MAKESPANS[policy][int(tag.removeprefix(f"default-{policy}"))]
        runs = {}
        for k, t in enumerate(batch):
            tokens = list(t.turn_tokens)
            if policy == self.other_tokens and k == len(batch) - 1:
                tokens[-1] += 1
            arrives = 0.5 + DISPATCH_MS[policy] / 1e3  # the second turn, after a tool call
            runs[t.id] = TrajectoryRun(finish_s=makespan, queued_s=0.0, tokens=tokens,
                                       priorities=[-1000 * (len(tokens) - j) for j in range(len(tokens))],
                                       instances=["i0", "i0"],
                                       spans=[("queued", 0.0, 0.0), ("tool", 0.1, 0.5),
                                              ("queued", arrives, arrives)])
        turns = 2 * len(batch)
        loops_ms, balancer_ms = CPU_MS[policy]
        return RolloutRun(makespan, runs, cpu_s={"agent_loops": turns * loops_ms / 1e3,
                                                 "balancer": turns * balancer_ms / 1e3})


def _bench_args(**change):
    import argparse

    return argparse.Namespace(**{**dict(workload="default", trace=None, history="epoch", history_epochs=2, prompts=4,
                                        group=2, instances=2, slots=4, repeats=2, cluster_instances=4,
                                        seed=0, sim_seeds=2, batches=2), **change})


def test_bench_agentic_reports_every_shape_from_runs_it_is_given(tmp_path) -> None:
    """The report path of ``bench agentic`` (ratios, lower bound, goals, simulated rows, plot) on
    makespans given by hand instead of the engines'."""
    import asyncio

    from rlweave.benchmarks import agentic

    args = _bench_args()
    measured = asyncio.run(agentic._measure_shape(args, "default", ReplayedHarness()))
    assert measured["lower_bound"]["throughput_s"] < ALONE_S  # so the bound is the 5 s alone
    headline = agentic._headline(measured)
    assert {k: headline[k] for k in ("makespan_ratio", "makespan_ratio_range", "oracle_makespan_ratio",
                                     "rlweave_over_oracle", "lower_bound_ratio", "verl_lower_bound_ratio",
                                     "uncontended_makespan_ratio", "tokens_identical",
                                     "goal_within_5pct_of_oracle", "goal_1_15x_where_oracle_1_2x")} == {
        "makespan_ratio": 1.3, "makespan_ratio_range": [1.2, 1.4], "oracle_makespan_ratio": 1.625,
        "rlweave_over_oracle": 1.25, "lower_bound_ratio": 2.0, "verl_lower_bound_ratio": 2.6,
        "uncontended_makespan_ratio": 1.25, "tokens_identical": True,
        "goal_within_5pct_of_oracle": False, "goal_1_15x_where_oracle_1_2x": True}
    assert headline["added_per_turn"] == {"dispatch_ms": 0.5, "agent_loop_cpu_ms": 0.25,
                                          "balancer_cpu_ms": 0.4}
    assert measured["tau"]["first_turn"] > 0
    assert {"verl", "rlweave", "oracle", "rlweave_preemptive", "informed"} <= set(measured["simulated"])
    assert headline["simulated_informed_over_oracle"] > 0
    assert set(headline["simulated_seeds_over_oracle"]) == {"verl", "rlweave", "informed"}
    assert [b["seed"] for b in measured["batches"]] == [0, 1]
    assert [b["makespan_s"] for b in measured["batches"]] == [
        {"verl": [12.0], "rlweave": [10.0], "oracle": [8.0]}, {"verl": [14.0], "rlweave": [10.0], "oracle": [8.0]}]
    with pytest.raises(SystemExit, match="--batches 3: between 1 and --repeats"):
        agentic._batches(_bench_args(batches=3), "default")
    with pytest.raises(SystemExit, match="--history-epochs 0: at least 1"):
        agentic._batches(_bench_args(history_epochs=0), "default")
    rows = agentic._rows("default", measured)
    assert rows[0][1:] == ["13.00", "10.00", "8.00", "1.30x (1.20-1.40)", "1.62x (1.50-1.75)",
                           "1.25x (1.25-1.25)", "5.00"]
    simulated = [row[0] for row in rows if "simulated" in row[0].lower()]
    assert len(simulated) >= 5 and all("SIMULATED" in label for label in simulated)
    result = agentic.BenchResult({"default": headline}, rows, "regime",
                                 details={"workloads": {"default": measured}})
    assert agentic.plot(result, tmp_path / "agentic.png").stat().st_size > 0


@pytest.mark.parametrize("policy", ["verl", "rlweave", "oracle"])
def test_bench_agentic_reports_tokens_not_identical_when_one_policy_changes_a_token(policy) -> None:
    import asyncio

    from rlweave.benchmarks import agentic

    args = _bench_args(sim_seeds=0, cluster_instances=0, batches=1)
    measured = asyncio.run(agentic._measure_shape(args, "default", ReplayedHarness(other_tokens=policy)))
    assert measured["tokens_identical"] is False
    assert agentic._headline(measured)["tokens_identical"] is False


def test_a_series_total_is_the_decayed_sum_of_what_it_keeps_as_values_come_and_go():
    """The running per-batch sums (kept so that a turn's prediction does not re-sort the series)
    equal the decayed sum over the values the series still holds, also once old values are
    dropped and after a restore from its saved lists."""
    from rlweave.plugins.agentic_rollout.predictor import _Pool, _Series

    series, rng = _Series(), np.random.default_rng(0)
    for i in range(500):
        series.add(float(rng.integers(1, 400)), i // 100, keep=128)
        if i % 37 == 0:
            values, batches = np.array(series.values), np.array(series.batches)
            w = 0.5 ** (i // 100 - batches)
            assert series.total(i // 100, 0.5) == pytest.approx(((w * values).sum(), w.sum()), rel=1e-12)
    assert len(series.values) == 128
    pool = _Pool(tokens=series)
    restored = _Pool.from_dict(pool.to_dict(batch=4), batch=4).tokens
    assert restored.total(4, 0.5) == pytest.approx(series.total(4, 0.5), rel=1e-12)
