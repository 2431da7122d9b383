"""RLHFuse's inter-stage fusion: the step simulation behind the migration decision, the
decision itself, and the plugin's hooks as the stream trainer calls them."""

from __future__ import annotations

import logging
import math

import pytest

from rlweave.adapters.verl_needs import verl_requirements
from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import build_plugin_manager
from rlweave.plugins.stage_fusion.migration import InferenceCost, engine_cost, plan_migration, simulate_stage
from rlweave.types import FusionStep, RolloutInstance, SampleRecord, StreamSettings

SECOND = engine_cost(base_s=1.0, per_seq_s=0.0, prefill_s_per_token=0.0)  # one token per second


def instances(*shares: bool, slots: int = 8) -> tuple[RolloutInstance, ...]:
    return tuple(RolloutInstance(f"i{k}", s, slots) for k, s in enumerate(shares))


def test_inference_follows_each_sample_and_the_stage_ends_with_the_last_ones() -> None:
    # One instance off the trainer's devices: samples end at 2 s and 3 s, each inferred in 0.5 s.
    assert simulate_stage([2, 3], instances(False), SECOND, InferenceCost(0.5)) == pytest.approx(3.5)
    # Inference backlog: both end at 2 s, the second waits for the first.
    assert simulate_stage([2, 2], instances(False), SECOND, InferenceCost(0.5)) == pytest.approx(3.0)
    # Batch slots: one at a time, the second starts after the first.
    assert simulate_stage([2, 2], instances(False, slots=1), SECOND, InferenceCost(0.5)) == pytest.approx(4.5)


def test_the_trainer_infers_a_dynamic_batch_once_all_its_samples_are_in() -> None:
    # Batches of two: the samples ending at 1 s and 2 s go together at 2 s, the one ending at
    # 4 s alone (the step's last), after the first batch is done at 3 s.
    assert simulate_stage([1, 2, 4], instances(False), SECOND, InferenceCost(0.5, batch=2)) == pytest.approx(4.5)
    # One batch of all three: it waits for the last sample, then takes 1.5 s.
    assert simulate_stage([1, 2, 4], instances(False), SECOND, InferenceCost(0.5, batch=3)) == pytest.approx(5.5)
    with pytest.raises(ValueError, match="batch >= 1"):
        InferenceCost(0.5, batch=0)


def test_an_engine_on_the_trainers_devices_and_the_inference_slow_each_other() -> None:
    # The 1-token sample ends at 1 s; its inference (1 s alone) shares the device with the
    # 5-token sample, both at half speed, until the inference is done at 3 s (the engine made
    # one more token by then); the last 3 tokens at full speed end at 6 s, inferred by 7 s.
    shared = simulate_stage([1, 5], instances(True), SECOND, InferenceCost(1.0, shared_slowdown=2.0))
    assert shared == pytest.approx(7.0)
    assert simulate_stage([1, 5], instances(False), SECOND, InferenceCost(1.0)) == pytest.approx(6.0)


def test_migrating_the_tail_off_the_trainers_devices_frees_them_for_inference() -> None:
    lengths = [2, 30, 2, 2]  # in turn: i0 (shares) gets 2 and 2, i1 gets 30 and 2
    hosts = instances(True, False)
    cost = InferenceCost(2.0, shared_slowdown=2.0)
    without = simulate_stage(lengths, hosts, SECOND, cost)
    # i0's samples are done at 2 s: nothing left to move, the same stage.
    assert simulate_stage(lengths, hosts, SECOND, cost, threshold=1, destinations=("i1",)) == without
    lengths = [30, 2, 30, 2]  # i0 now holds the two long samples
    without = simulate_stage(lengths, hosts, SECOND, cost)
    migrated = simulate_stage(lengths, hosts, SECOND, cost, threshold=2, destinations=("i1",))
    assert migrated < without
    # A re-prefill that costs more than the tail leaves only its delay.
    slow_prefill = engine_cost(1.0, 0.0, prefill_s_per_token=10.0)
    assert simulate_stage(lengths, hosts, slow_prefill, cost, prompt_len=8, threshold=2,
                          destinations=("i1",)) > migrated


def test_inference_can_wait_for_the_devices_the_migration_frees() -> None:
    lengths = [1, 3, 12, 3]  # in turn: i0 (shares) gets 1 and 12, i1 gets 3 and 3
    hosts = instances(True, False)
    costly = InferenceCost(1.0, shared_slowdown=4.0)
    # The migration comes at 3 s, when i1's samples are in and only the 12-token one is left.
    # Beside it from 1 s, the first sample's inference makes i0's next token take 4 s: at 3 s it
    # has made 1 token, not 3, and ends at 14 s on i1 (inferred by 15 s). Held, the inference of
    # the three waits until 3 s and runs alone (done by 6 s); the tail ends at 12 s, 13 s inferred.
    beside = simulate_stage(lengths, hosts, SECOND, costly, threshold=1, destinations=("i1",))
    held = simulate_stage(lengths, hosts, SECOND, costly, threshold=1, destinations=("i1",), inference_waits=True)
    assert held == pytest.approx(13.0) and beside == pytest.approx(15.0)
    plan = plan_migration(step_of(True, False, samples=4), lengths, SECOND, costly)
    assert plan is not None and plan.inference_waits
    # Where inference beside an engine costs it nothing, holding only delays it.
    free = InferenceCost(1.0, shared_slowdown=1.0)
    assert simulate_stage(lengths, hosts, SECOND, free, threshold=1, destinations=("i1",),
                          inference_waits=True) >= simulate_stage(lengths, hosts, SECOND, free, threshold=1,
                                                                   destinations=("i1",))
    # No migration comes (every sample ends at once): the held samples go with the last ones.
    assert simulate_stage([2, 2], hosts, SECOND, costly, threshold=1, destinations=("i1",),
                          inference_waits=True) == pytest.approx(4.0)


def step_of(*shares: bool, samples: int = 8) -> FusionStep:
    return FusionStep(step=2, samples=samples, instances=instances(*shares), prompt_len=8)


def test_the_plan_migrates_only_where_it_frees_devices_and_pays() -> None:
    lengths = [3, 3, 3, 3, 3, 3, 40, 40]
    cost = InferenceCost(1.0)
    plan = plan_migration(step_of(True, False), lengths, SECOND, cost)
    assert plan is not None and plan.sources == ("i0",) and plan.destinations == ("i1",)
    assert plan.threshold >= 1
    assert plan.threshold < len(lengths)
    assert plan.predicted_stage_s <= 0.99 * plan.predicted_stage_s_without
    assert plan_migration(step_of(False, False), lengths, SECOND, cost) is None  # nothing to free
    assert plan_migration(step_of(True, True), lengths, SECOND, cost) is None  # nowhere to go
    # Inference far shorter than the tail: freeing the device buys nothing.
    assert plan_migration(step_of(True, False), lengths, SECOND, InferenceCost(1e-4)) is None
    fixed = plan_migration(step_of(True, False), lengths, SECOND, cost, threshold=3)
    assert fixed.threshold == 3 and math.isfinite(fixed.predicted_stage_s)
    blind = plan_migration(step_of(True, False), [], SECOND, cost, threshold=3)  # nothing to predict from
    assert blind.threshold == 3 and math.isnan(blind.predicted_stage_s)
    assert plan_migration(step_of(True, False), [], SECOND, cost) is None


def test_bad_costs_fail_clearly() -> None:
    with pytest.raises(ValueError, match="base_s > 0"):
        engine_cost(0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="shared_slowdown >= 1"):
        InferenceCost(1.0, 0.5)
    with pytest.raises(ConfigError, match="shared_slowdown'; allowed: >= 1"):
        build_config([Setting("stage_fusion.shared_slowdown", 0.5, "test")])
    with pytest.raises(ConfigError, match="inference_waits 'sometimes'; allowed: auto, always, never"):
        build_config([Setting("stage_fusion.inference_waits", "sometimes", "test")])


def test_the_plugin_plans_each_step_from_the_lengths_of_the_step_before(monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RLWEAVE_LOAD_PLUGINS", "")
    config = build_config([Setting("stage_fusion.enable", True, "test"),
                           Setting("stage_fusion.decode_base_ms", 1000.0, "test"),
                           Setting("stage_fusion.decode_per_seq_ms", 0.0, "test")])
    hook = build_plugin_manager(config).hook
    assert hook.rlweave_stream_settings() == StreamSettings()  # on-policy, the trainer's defaults
    assert [r.key for r in verl_requirements(hook.rlweave_needs()[0])] == ["trainer.v1.trainer_mode"]
    step = FusionStep(step=1, samples=8, instances=instances(True, False), prompt_len=8,
                      inference_s_per_sample=1.0)
    with caplog.at_level(logging.INFO, logger="rlweave.plugins.stage_fusion.inter_stage"):
        assert hook.rlweave_migration_plan(step=step) is None
    assert "no step seen yet" in caplog.text
    for i, n in enumerate([3, 3, 3, 3, 3, 3, 40, 40]):
        hook.rlweave_sample_finished(sample=SampleRecord(f"g{i}_0_0", f"g{i}", 8, n, 1))
    with caplog.at_level(logging.INFO, logger="rlweave.plugins.stage_fusion.inter_stage"):
        plan = hook.rlweave_migration_plan(step=FusionStep(2, 8, step.instances, 8, 1.0))
    assert plan is not None and plan.destinations == ("i1",)
    assert f"once <= {plan.threshold} of 8 samples remain" in caplog.text
    assert "predicted generation+inference" in caplog.text
    assert "inference waiting for the freed devices" in caplog.text or "inference as samples finish" in caplog.text
    for waits, expected in (("always", True), ("never", False)):  # fixed, not the cost model's choice
        config = build_config([Setting("stage_fusion.enable", True, "test"),
                               Setting("stage_fusion.decode_base_ms", 1000.0, "test"),
                               Setting("stage_fusion.decode_per_seq_ms", 0.0, "test"),
                               Setting("stage_fusion.prefill_us_per_token", 0.0, "test"),
                               Setting("stage_fusion.shared_slowdown", 4.0, "test"),
                               Setting("stage_fusion.inference_waits", waits, "test")])
        hook = build_plugin_manager(config).hook
        for i, n in enumerate([1, 3, 12, 3]):
            hook.rlweave_sample_finished(sample=SampleRecord(f"g{i}_0_0", f"g{i}", 8, n, 1))
        assert hook.rlweave_migration_plan(step=FusionStep(2, 4, step.instances, 0, 1.0)).inference_waits is expected
    off = build_config([Setting("stage_fusion.enable", True, "test"), Setting("stage_fusion.migration", False, "test")])
    assert build_plugin_manager(off).hook.rlweave_migration_plan(step=step) is None


@pytest.mark.parametrize("most, best", [(23, 7), (63, 41), (511, 3), (511, 502), (2047, 1200)])
def test_the_threshold_search_finds_the_exhaustive_choice_with_few_predictions(most, best):
    """Past GRID thresholds the planner searches coarse to fine (trying each of 2,047 thresholds
    of a large batch, eight simulated steps each, took minutes per training step): on a stage
    time that falls to the best threshold and rises after it, with plateaus, it finds the
    exhaustive search's choice (the lowest of the shortest) in a few rounds."""
    from rlweave.plugins.stage_fusion.migration import GRID, _best_threshold

    def stage_s(r: int) -> float:
        return 10.0 + abs(r - best) // 2 * 0.01  # a plateau of two around each level

    calls: list[int] = []
    shortest, r = _best_threshold(lambda t: calls.append(t) or stage_s(t), most)
    exhaustive = min(range(1, most + 1), key=lambda t: (stage_s(t), t))
    assert (r, shortest) == (exhaustive, stage_s(exhaustive))
    assert len(calls) == len(set(calls)) and len(calls) <= (most if most <= GRID else 6 * GRID)


def test_large_batches_average_over_fewer_dispatch_orders():
    """Planning time grows with the batch times the orders: past 64 samples the orders fall in
    proportion, never below 2 (a step of 512 samples planned in 130 s with 8)."""
    from rlweave.plugins.stage_fusion.migration import ORDERS, _orders

    assert [_orders(n) for n in (1, 24, 64, 65, 128, 256, 512, 4096)] == [ORDERS] * 3 + [7, 4, 2, 2, 2]
