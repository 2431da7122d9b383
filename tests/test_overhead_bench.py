"""``bench overhead``'s paired rounds: the order, the pairing, the range and the verdict."""

import pytest

from rlweave.benchmarks.overhead import check_schedulers, engine_ratios, per_set_medians
from rlweave.benchmarks.paired_rounds import (bootstrap_median_range, fastest_ratio, paired_ratios,
                                              rotated_order, summarise, summarise_fastest, verdict)


def test_rotation_puts_every_arm_in_every_position():
    order = rotated_order(("a", "d", "e"), 6)
    assert order[:3] == [["a", "d", "e"], ["d", "e", "a"], ["e", "a", "d"]]
    for arm in "ade":
        assert sorted(r.index(arm) for r in order) == [0, 0, 1, 1, 2, 2]


def test_rotation_refuses_no_rounds():
    with pytest.raises(ValueError, match="--rounds"):
        rotated_order(("a",), 0)


def test_ratio_is_speed_relative_to_the_same_rounds_baseline():
    # A machine twice as slow in round 2: the pairing cancels it.
    assert paired_ratios([1.02, 2.04], [1.0, 2.0]) == pytest.approx([1 / 1.02, 1 / 1.02])
    with pytest.raises(ValueError, match="one time per round"):
        paired_ratios([1.0], [1.0, 2.0])


def test_bootstrap_range_holds_the_median_and_narrows_with_rounds():
    noisy = [1.0 + 0.05 * ((i * 7) % 11 - 5) / 5 for i in range(200)]
    low, high = bootstrap_median_range(noisy)
    assert low <= 1.0 <= high
    few_low, few_high = bootstrap_median_range(noisy[:20])
    assert high - low < few_high - few_low
    assert bootstrap_median_range(noisy, seed=3) == bootstrap_median_range(noisy, seed=3)


def test_a_range_over_engine_sets_counts_how_far_fresh_sets_land_apart():
    """Four sets of fresh processes, each tight within itself, landing from 3% slower to 5%
    faster (seen: one set's median 1.05, the next's 0.98, for the same code): the rounds alone
    call a 0.98 goal met; drawing the sets first shows it is not decided."""
    offsets = (0.97, 0.99, 1.02, 1.05)
    rounds = [o + 0.002 * ((i * 7) % 5 - 2) for o in offsets for i in range(50)]
    sets = [k for k in range(len(offsets)) for _ in range(50)]
    low, high = bootstrap_median_range(rounds)
    set_low, set_high = bootstrap_median_range(rounds, clusters=sets)
    assert set_low < low and set_high > high and set_high - set_low > 2 * (high - low)
    assert summarise(rounds, 0.98)["verdict"] == "met"
    assert summarise(rounds, 0.98, clusters=sets)["verdict"] == "undecided"
    with pytest.raises(ValueError, match="one cluster per round"):
        bootstrap_median_range(rounds, clusters=sets[:10])


def test_verdict_needs_the_whole_range_on_one_side():
    assert verdict(0.985, 1.01, 0.98) == "met"
    assert verdict(0.95, 0.97, 0.98) == "missed"
    assert verdict(0.97, 1.01, 0.98) == "undecided"


def test_summary_of_a_3_percent_cost_misses_a_2_percent_goal():
    ratios = [0.97 + 0.002 * ((i * 5) % 7 - 3) for i in range(90)]
    s = summarise(ratios, 0.98)
    assert s["median"] == pytest.approx(0.97) and s["verdict"] == "missed" and s["rounds"] == 90


def test_fastest_calls_see_a_cost_through_stalls():
    # A 2% cost; every fifth round of both arms stalled (x3) at different rounds, and half the
    # rounds slowed by up to 40% by other work: the fastest calls still show 0.98.
    quiet = [1.0 + 0.005 * ((i * 13) % 17) / 17 for i in range(200)]
    base = [q + 0.4 * ((i * 7) % 10) / 10 * (i % 2) + (2.0 if i % 5 == 0 else 0.0) for i, q in enumerate(quiet)]
    arm = [1.02 * (q + 0.4 * ((i * 3) % 10) / 10 * (i % 2)) + (2.0 if i % 5 == 2 else 0.0)
           for i, q in enumerate(reversed(quiet))]
    assert fastest_ratio(arm, base) == pytest.approx(1 / 1.02, abs=0.003)
    s = summarise_fastest(arm, base, goal=0.97)
    assert s["range95"][0] <= s["ratio"] <= s["range95"][1] and s["verdict"] == "met"
    assert s["range95"][1] > s["range95"][0]  # the rounds were resampled
    assert summarise_fastest(arm, base, goal=0.99)["verdict"] == "missed"
    with pytest.raises(ValueError, match="one time per round"):
        summarise_fastest(arm[:3], base, goal=0.97)


def _calls(seconds: list[float], sets: list[int]) -> list[dict]:
    return [{"engine_s": x, "set": k} for x, k in zip(seconds, sets, strict=True)]


def test_engine_ratios_pair_rounds_and_split_by_engine_set():
    sets = [0, 0, 1, 1]
    calls = {"absent": _calls([1.0, 2.0, 1.0, 1.0], sets), "disabled": _calls([1.0, 2.0, 1.25, 1.25], sets),
             "enabled": _calls([2.0, 4.0, 1.0, 1.0], sets)}
    ratios = engine_ratios(calls, "engine_s")
    assert ratios == {"disabled": [1.0, 1.0, 0.8, 0.8], "enabled": [0.5, 0.5, 1.0, 1.0]}
    assert per_set_medians(calls, ratios) == {"disabled": [1.0, 0.8], "enabled": [0.5, 1.0]}


def test_schedulers_must_match_their_arms():
    vllm, ours = "vllm.v1.core.sched.scheduler.Scheduler", "rlweave.adapters.vllm.scheduler.RlweaveScheduler"
    check_schedulers({"absent": vllm, "disabled": vllm, "enabled": ours})
    with pytest.raises(RuntimeError, match="do not match their arms"):
        check_schedulers({"absent": vllm, "disabled": ours, "enabled": ours})
