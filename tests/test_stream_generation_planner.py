"""StreamRL's resource planner: the generation simulation, the step model of each mode, the
split search on homogeneous and heterogeneous pools, clear errors for plans that cannot fit,
and ``rlweave plan stream``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rlweave.plugins.stream_generation.planner import (
    GenerationProfile,
    HardwarePool,
    PlanError,
    PlanMode,
    TrainingProfile,
    Workload,
    plan,
    predict,
    _stream_preparation,
    simulate_async,
    simulate_generation,
)


def constant_rate(cap: int, per_sequence: float = 1.0, devices: int = 1) -> GenerationProfile:
    """An engine whose every running sequence makes ``per_sequence`` tokens/s, up to ``cap``."""
    sizes = (1, cap) if cap > 1 else (1,)
    return GenerationProfile(sizes, tuple(per_sequence * b for b in sizes), devices)


def test_simulation_of_continuous_batching() -> None:
    lengths = np.array([[3.0, 5.0], [2.0, 2.0]])
    done, busy = simulate_generation(lengths, [constant_rate(cap=8)])
    assert done.tolist() == [5.0, 2.0] and busy.tolist() == [5.0]
    done, _ = simulate_generation(lengths, [constant_rate(cap=1)])  # one at a time
    assert done.tolist() == [8.0, 12.0]
    # Throughput that saturates: 2 sequences share 1 token/s, so each takes twice as long.
    done, _ = simulate_generation(np.array([[2.0, 2.0]]), [GenerationProfile((1, 2), (1.0, 1.0))])
    assert done.tolist() == [4.0]


def iteration_by_iteration(lengths: np.ndarray, engines: list[GenerationProfile]) -> np.ndarray:
    """The same engines stepped one decode iteration at a time (every running sequence makes
    one token per iteration of ``b / tokens_per_s(b)`` seconds): group completion times."""
    groups, size = lengths.shape
    queue = [g for g in range(groups)]
    clock = [0.0] * len(engines)
    running: list[list[list[int]]] = [[] for _ in engines]  # [group, tokens left]
    waiting: list[list[int]] = [[] for _ in engines]
    started, finished, done = [0] * groups, [0] * groups, np.zeros(groups)
    for _ in range(groups):  # engines claim in turn at time 0
        for e, engine in enumerate(engines):
            if queue and len(running[e]) + len(waiting[e]) < engine.batch_sizes[-1]:
                waiting[e] += [queue.pop(0)] * size
    while any(running) or any(waiting):
        e = min((e for e in range(len(engines)) if running[e] or waiting[e]), key=lambda e: clock[e])
        while queue and len(running[e]) + len(waiting[e]) < engines[e].batch_sizes[-1]:
            waiting[e] += [queue.pop(0)] * size
        while waiting[e] and len(running[e]) < engines[e].batch_sizes[-1]:
            g = waiting[e].pop(0)
            running[e].append([g, int(lengths[g, started[g]])])
            started[g] += 1
        b = len(running[e])
        clock[e] += b / float(np.interp(b, engines[e].batch_sizes, engines[e].tokens_per_s))
        for seq in running[e]:
            seq[1] -= 1
        for g, _ in [seq for seq in running[e] if seq[1] == 0]:
            finished[g] += 1
            done[g] = clock[e] if finished[g] == size else done[g]
        running[e] = [seq for seq in running[e] if seq[1] > 0]
    return done


@pytest.mark.parametrize("seed", range(6))
def test_event_simulation_equals_stepping_every_iteration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, (int(rng.integers(1, 12)), int(rng.integers(1, 4)))).astype(float)
    engines = [GenerationProfile((1, 3, 6), (2.0, 4.5, 6.0)), constant_rate(cap=2, per_sequence=3.0)]
    engines = engines[:int(rng.integers(1, 3))]
    done, _ = simulate_generation(lengths, engines)
    assert done == pytest.approx(iteration_by_iteration(lengths, engines))


def test_long_tail_first_shortens_generation() -> None:
    """The skewness bubble in miniature: two single-slot engines pull from one queue."""
    engines = [constant_rate(cap=1), constant_rate(cap=1)]
    tail_first, _ = simulate_generation(np.array([[4.0], [1], [1], [1], [1]]), engines)
    tail_last, _ = simulate_generation(np.array([[1.0], [1], [1], [1], [4]]), engines)
    assert tail_first.max() == 4.0 and tail_last.max() == 6.0


def test_step_model_of_each_mode() -> None:
    pools = [HardwarePool("p", 2, constant_rate(cap=8), TrainingProfile(0.5))]
    work = Workload(np.array([[1.0], [2], [3], [4]]), minibatch_groups=1, weight_sync_s=0.25)
    split = dict(generation={"p": 1}, training={"p": 1})
    # On-policy stream: each group trains as soon as it completes (at 1, 2, 3, 4 s).
    on_policy = predict(pools, work, PlanMode.ON_POLICY, **split)
    assert on_policy.step_s == pytest.approx(4.5 + 0.25)
    assert (on_policy.generation_s, on_policy.training_s) == (4.0, 2.0)
    assert predict(pools, work, PlanMode.COLOCATED, **split).step_s == pytest.approx(4 + 2 + 0.25)
    assert on_policy.samples_per_s == pytest.approx(4 / 4.75)
    assert on_policy.training_idle == pytest.approx(1 - 2 / 4.75)
    assert on_policy.generation_idle == pytest.approx(1 - 4 / 4.75)


def test_measured_latencies_delay_when_groups_reach_the_trainer() -> None:
    """Dispatch (submit to first token) and delivery (last token to the trainer) shift every
    group's arrival."""
    pools = [HardwarePool("p", 2, constant_rate(cap=8), TrainingProfile(0.5))]
    work = Workload(np.array([[1.0], [2], [3], [4]]), minibatch_groups=1, weight_sync_s=0.25,
                    dispatch_s=0.5, delivery_s=0.25)
    split = dict(generation={"p": 1}, training={"p": 1})
    assert predict(pools, work, PlanMode.ON_POLICY, **split).step_s == pytest.approx(4.5 + 0.75 + 0.25)
    assert predict(pools, work, PlanMode.COLOCATED, **split).step_s == pytest.approx(0.75 + 4 + 2 + 0.25)
    with pytest.raises(ValueError, match="dispatch_s"):
        Workload(np.array([[1.0]]), minibatch_groups=1, dispatch_s=-1.0)


def test_a_polling_trainer_takes_the_batch_at_its_next_look() -> None:
    """verl's synchronous loop looks for the batch every 2 s from the step's start: ready at
    0.5 + 4 + 0.25 = 4.75 s, it is seen at 6 s, then trains 2 s and pushes 0.25 s (8.25 s); a
    batch ready at exactly 4 s is seen then, and one that needs no look is taken when ready."""
    pools = [HardwarePool("p", 2, constant_rate(cap=8), TrainingProfile(0.5))]
    lengths = np.array([[1.0], [2], [3], [4]])
    split = dict(generation={"p": 1}, training={"p": 1})

    def colocated(**latency: float) -> float:
        work = Workload(lengths, minibatch_groups=1, weight_sync_s=0.25, **latency)
        return predict(pools, work, PlanMode.COLOCATED, **split).step_s

    assert colocated(dispatch_s=0.5, delivery_s=0.25, poll_s=2.0) == pytest.approx(6 + 2 + 0.25)
    assert colocated(poll_s=2.0) == pytest.approx(4 + 2 + 0.25)
    assert colocated(poll_s=0.0, dispatch_s=0.5) == pytest.approx(4.5 + 2 + 0.25)
    with pytest.raises(ValueError, match="poll_s"):
        Workload(lengths, minibatch_groups=1, poll_s=-2.0)


def test_planner_balances_the_stages_on_one_pool() -> None:
    """Equal lengths, 8 slots per engine: an engine makes 0.8 samples/s (8 at a time, 10 s
    each), a trainer 1 sample/s. Async, the engines fill their free slots with the next batch,
    so the best split is the one whose two rates are closest: 9 engines (7.2/s) and 7 trainers
    (7/s), a step of at least 64 / 7 s; 8 and 8 leave the trainers waiting for the engines'
    10 s per batch."""
    pools = [HardwarePool("gpu", 16, constant_rate(cap=8, per_sequence=10.0), TrainingProfile(1.0))]
    work = Workload(np.full((64, 1), 100.0), minibatch_groups=8)
    best = plan(pools, work, PlanMode.ASYNC)
    assert (best.generation, best.training) == ({"gpu": 9}, {"gpu": 7})
    assert 64 / 7 <= best.step_s < 10.0 and best.samples_per_s == pytest.approx(64 / best.step_s)
    assert predict(pools, work, PlanMode.ASYNC, {"gpu": 8}, {"gpu": 8}).step_s == pytest.approx(10.0)
    text = best.describe()
    assert f"StreamRL plan (async): {best.samples_per_s:.3g} samples/s" in text and "gpu" in text
    for g in range(1, 16):
        other = predict(pools, work, PlanMode.ASYNC, {"gpu": g}, {"gpu": 16 - g})
        assert other.samples_per_s <= best.samples_per_s


def test_planner_puts_each_stage_on_the_pool_that_suits_it() -> None:
    """Heterogeneous pools: memory-bandwidth-rich devices generate, compute-rich ones train."""
    pools = [HardwarePool("h20", 4, constant_rate(cap=16, per_sequence=40.0), TrainingProfile(4.0)),
             HardwarePool("h800", 4, constant_rate(cap=16, per_sequence=10.0), TrainingProfile(0.5))]
    rng = np.random.default_rng(0)
    work = Workload(np.sort(rng.lognormal(5, 1, (32, 4)), axis=None)[::-1].reshape(32, 4), minibatch_groups=4)
    for mode in (PlanMode.ON_POLICY, PlanMode.ASYNC):
        best = plan(pools, work, mode)
        assert "h800" not in best.generation and best.training["h800"] == 4
        assert best.generation["h20"] >= 3
        assert best.samples_per_s > plan(pools, work, PlanMode.COLOCATED).samples_per_s


def test_plans_that_cannot_fit_say_why_and_how_to_fix_it() -> None:
    work = Workload(np.ones((4, 2)), minibatch_groups=1)
    with pytest.raises(PlanError, match="no pool can hold a generation instance .*a: 8 devices, no per "
                                        "instance.*Give a pool with a generation profile"):
        plan([HardwarePool("a", 8, None, TrainingProfile(1.0))], work)
    with pytest.raises(PlanError, match="no pool can hold a training instance .*4 per instance"):
        plan([HardwarePool("a", 2, constant_rate(2), TrainingProfile(1.0, devices=4))], work)
    one = [HardwarePool("a", 1, constant_rate(2), TrainingProfile(1.0))]
    with pytest.raises(PlanError, match=r"\(a: 1 devices\) cannot hold a generation instance and a "
                                        r"training instance at the same time.*plan mode colocated"):
        plan(one, work, PlanMode.ON_POLICY)
    assert plan(one, work, PlanMode.COLOCATED).generation == {"a": 1}  # time-shares the device
    with pytest.raises(PlanError, match="splits to search .*raise max_candidates"):
        plan([HardwarePool(f"p{i}", 30, constant_rate(2), TrainingProfile(1.0)) for i in range(3)], work)
    with pytest.raises(ValueError, match="batch_sizes must start at 1"):
        GenerationProfile((2, 4), (1.0, 2.0))
    with pytest.raises(ValueError, match=r"\[groups, group_size\]"):
        Workload(np.ones(4), minibatch_groups=1)


def test_on_policy_defers_the_optimizer_steps_and_prepares_dynamic_batches() -> None:
    pools = [HardwarePool("p", 2, constant_rate(cap=8), TrainingProfile(0.5, deferred_share=0.5))]
    work = Workload(np.array([[1.0], [2], [3], [4]]), minibatch_groups=1, weight_sync_s=0.25)
    # Preparation (0.25 s a group) follows each group; the optimizer steps (1 s) follow the last.
    assert predict(pools, work, PlanMode.ON_POLICY, {"p": 1}, {"p": 1}).step_s == pytest.approx(4.25 + 1 + 0.25)
    # Three groups ready at once are prepared as one dynamic batch, the fourth when it is ready.
    assert _stream_preparation(np.array([0.0, 0, 0, 3]), 1, 1.0) == 4.0
    assert _stream_preparation(np.array([0.0, 0, 0, 3]), 2, 1.0) == 5.0  # 2 at 0, then 2 at 3
    with pytest.raises(ValueError, match="deferred_share in \\[0, 1\\]"):
        TrainingProfile(1.0, deferred_share=1.5)


def test_a_pool_of_shared_cores_bounds_the_step_by_its_cpu_work() -> None:
    """Async and trainer-bound, the simulation gives the trainer its core to itself (2.25 s a
    step); the trainer's and host side's CPU on the same two cores (1.5 CPU-s per sample, 6 per
    step) with the engine's simulated busy time makes the step at least 3 s. The instances'
    busy time stays, so their idle grows with the step."""
    lengths = np.array([[1.0], [2], [3], [4]])
    work = Workload(lengths, minibatch_groups=1, weight_sync_s=0.25)
    engine = constant_rate(cap=8, per_sequence=1000.0)
    alone = predict([HardwarePool("p", 2, engine, TrainingProfile(0.5))], work, PlanMode.ASYNC, {"p": 1}, {"p": 1})
    shared = predict([HardwarePool("p", 2, engine, TrainingProfile(0.5), cpu_s_per_sample=1.5)], work,
                     PlanMode.ASYNC, {"p": 1}, {"p": 1})
    # The engine's busy time a step, by hand: the four groups decode together, at 1000 tokens/s
    # each, so the longest (4 tokens) ends after 4 ms.
    engine_s = 0.004
    assert alone.step_s == pytest.approx(2.25) and alone.generation_idle == pytest.approx(1 - engine_s / 2.25)
    assert shared.step_s == pytest.approx((engine_s + 6.0) / 2)  # 3.002 s
    # The trainer still works 2.25 s of each step (four groups and the push), the engine 4 ms.
    assert shared.training_idle == pytest.approx(1 - 2.25 / shared.step_s)
    assert shared.generation_idle == pytest.approx(1 - engine_s / shared.step_s)
    # Below the simulated step the floor changes nothing; across two pools it does not apply.
    cheap = predict([HardwarePool("p", 2, engine, TrainingProfile(0.5), cpu_s_per_sample=0.5)], work,
                    PlanMode.ASYNC, {"p": 1}, {"p": 1})
    assert cheap == alone
    two = [HardwarePool("g", 1, engine, None, cpu_s_per_sample=1.5), HardwarePool("t", 1, None, TrainingProfile(0.5))]
    assert predict(two, work, PlanMode.ASYNC, {"g": 1}, {"t": 1}).step_s == pytest.approx(2.25)
    with pytest.raises(ValueError, match="cpu_s_per_sample must be >= 0"):
        HardwarePool("p", 2, cpu_s_per_sample=-1.0)


def test_async_is_as_fast_as_its_slower_stage() -> None:
    """Steady async steps. Trainer-bound (an engine 1000x faster): the trainer never waits, so a
    step is its training plus the weight push, and the engine idles. Generation-bound (one
    sequence at a time, a trainer 1000x faster): the engine always has the next batch queued,
    so a step is one batch's tokens plus the pause for the push and the load."""
    lengths = np.array([[1.0], [2], [3], [4]])
    work = Workload(lengths, minibatch_groups=1, weight_sync_s=0.25, dispatch_s=0.5)
    trainer_bound = simulate_async([lengths] * 6, [constant_rate(cap=8, per_sequence=1000.0)], 0.5, work)
    assert trainer_bound.step_s == pytest.approx(4 * 0.5 + 0.25)
    assert trainer_bound.training_idle == pytest.approx(0.0, abs=1e-9) and trainer_bound.generation_idle > 0.99
    generation_bound = simulate_async([lengths] * 6, [constant_rate(cap=1)], 0.0005, work)
    assert generation_bound.step_s == pytest.approx(10 + 0.25 + 0.5)
    assert generation_bound.generation_idle == pytest.approx(0.75 / 10.75)
    assert generation_bound.training_idle == pytest.approx(1 - (4 * 0.0005 + 0.25) / 10.75)


def test_async_keeps_room_for_the_due_tail() -> None:
    """Staleness 1: a batch's groups are due in the step after its submission. Batches 0, 2 and
    4 hold a long group (8 tokens, 1 token/s), due in steps 2, 3 and 5. Each of those steps
    keeps room for it, so the newer short groups ready meanwhile wait for the next step, and
    the step ends 0.1 s after the long group is in (at 8, 9.2 and 17.3 s): the steps end at
    1.2, 8.1, 9.3, 9.5 and 17.4 s."""
    batches = [np.array([[8.0], [1]]), np.array([[1.0], [1]])] * 3
    work = Workload(batches[0], minibatch_groups=1, following=tuple(batches[1:]))
    assert simulate_async(batches, [constant_rate(cap=8)], 0.1, work).step_s == pytest.approx((17.4 - 1.2) / 4)
    with pytest.raises(ValueError, match="at least 3 batches"):
        simulate_async(batches[:2], [constant_rate(cap=8)], 0.1, work)


def test_workload_following_batches_cycle_and_must_match() -> None:
    a, b = np.ones((2, 2)), np.full((2, 2), 3.0)
    assert [x[0, 0] for x in Workload(a, 1, following=(b,)).batches(5)] == [1, 3, 1, 3, 1]
    with pytest.raises(ValueError, match="following batch must have the shape"):
        Workload(a, 1, following=(np.ones((3, 2)),))


def profile_file(tmp_path, **changes: object) -> str:
    data = {"pools": [{"name": "gpu", "devices": 8,
                       "generation": {"batch_sizes": [1, 8], "tokens_per_s": [100.0, 400.0]},
                       "training": {"seconds_per_sample": 0.05}}],
            "weight_sync_s": 0.1, "lengths": [10, 20, 40, 80, 160, 30, 25, 12]} | changes
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_plan_stream_command_prints_the_best_split(tmp_path, capsys) -> None:
    from rlweave.cli import main

    assert main(["plan", "stream", "--profile", profile_file(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] and out["mode"] == "async"
    engines, trainers = out["generation"]["gpu"], out["training"]["gpu"]
    assert engines >= 1 and trainers >= 1 and engines + trainers <= 8
    assert out["step_s"] > 0 and 0 <= out["generation_idle"] <= 1
    assert main(["plan", "stream", "--profile", profile_file(tmp_path), "--devices", "16", "--mode", "on_policy"]) == 0
    assert "StreamRL plan (on_policy)" in capsys.readouterr().out
    shared = profile_file(tmp_path, pools=[{"name": "cpu", "devices": 2, "cpu_s_per_sample": 10.0,
                                            "generation": {"batch_sizes": [1, 8], "tokens_per_s": [100.0, 400.0]},
                                            "training": {"seconds_per_sample": 0.05}}])
    assert main(["plan", "stream", "--profile", shared, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] > 8 * 4 * 10.0 / 2  # the CPU floor, engines' time added


@pytest.mark.parametrize(("changes", "args", "message"), [
    ({"pools": []}, [], "needs \"pools\", a non-empty list"),
    ({"lengths": []}, [], "has no \"lengths\": give --lengths FILE"),
    ({"pools": [{"name": "gpu", "devices": 8, "generation": {"batch_sizes": [2, 8], "tokens_per_s": [1, 2]}}]}, [],
     "pools\\[0\\].generation: bad GenerationProfile"),
    ({"pools": [{"name": "gpu", "devices": 1, "generation": {"batch_sizes": [1], "tokens_per_s": [1.0]},
                 "training": {"seconds_per_sample": 1.0}}]}, [], "cannot hold a generation instance and a training"),
    ({}, ["--lengths", "BAD"], "BAD:2: expected a JSON object with an integer output_len"),
    ({"pools": [{"name": "cpu", "devices": 2, "cpu_s_per_sample": "x"}]}, [],
     "pools\\[0\\].cpu_s_per_sample must be a number >= 0"),
])
def test_plan_stream_command_names_what_is_wrong(tmp_path, capsys, changes, args, message) -> None:
    from rlweave.cli import main

    bad = tmp_path / "lengths.jsonl"
    bad.write_text('{"output_len": 3}\n{"len": 4}\n')
    args = [str(bad) if a == "BAD" else a for a in args]
    assert main(["plan", "stream", "--profile", profile_file(tmp_path, **changes), *args]) == 2
    assert re.search(message.replace("BAD", re.escape(str(bad))), capsys.readouterr().err)
