"""StreamRL's output-length ranker: Kendall's tau on held-out prompts of a seeded synthetic set,
online learning details, and skewness-aware dispatch through the hook."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlweave.config import Setting, build_config
from rlweave.host import PLUGIN_MODULES_ENV, build_plugin_manager
from rlweave.plugins.stream_generation.ranker import LengthRanker, kendall_tau, tail_first_order
from rlweave.types import PromptInfo, SampleRecord

GROUP = 4  # samples per prompt


def synthetic_prompts(rng: np.random.Generator, n: int, start: int = 0) -> tuple[list[PromptInfo], np.ndarray]:
    """Prompts whose log output length is linear in their features, and each prompt's GROUP
    sampled lengths [n, GROUP] (lognormal noise per sample, so a group's lengths vary too)."""
    prompts, lengths = [], []
    for i in range(start, start + n):
        difficulty, steps, code = rng.random(), int(rng.integers(1, 9)), float(rng.random() < 0.3)
        prompt_len = int(rng.integers(20, 400))
        log_mean = 3 + 2 * difficulty + 0.8 * code + 0.15 * steps + 0.3 * np.log(prompt_len / 100)
        prompts.append(PromptInfo(f"p{i}", prompt_len, f"g{i}",
                                  {"difficulty": difficulty, "steps": steps, "task=code": code}))
        lengths.append(np.exp(log_mean + 0.4 * rng.standard_normal(GROUP)).astype(int) + 1)
    return prompts, np.array(lengths)


def train(ranker: LengthRanker, prompts: list[PromptInfo], lengths: np.ndarray) -> None:
    ranker.remember(prompts)
    for p, group in zip(prompts, lengths):
        for n in group:
            ranker.observe(p.group_id, int(n))


def test_kendall_tau_matches_the_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 30), rng.integers(0, 5, 30)
    pairs = list(itertools.combinations(range(30), 2))
    s = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i, j in pairs)
    ties_a = sum(a[i] == a[j] for i, j in pairs)
    ties_b = sum(b[i] == b[j] for i, j in pairs)
    expected = s / np.sqrt((len(pairs) - ties_a) * (len(pairs) - ties_b))
    assert kendall_tau(a, b) == pytest.approx(expected)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    with pytest.raises(ValueError, match="same length"):
        kendall_tau([1, 2], [1, 2, 3])


def test_ranker_orders_held_out_prompts_by_output_length() -> None:
    rng = np.random.default_rng(1)
    seen, seen_lengths = synthetic_prompts(rng, 400)
    held_out, held_lengths = synthetic_prompts(rng, 200, start=400)
    ranker = LengthRanker(min_samples=GROUP)
    train(ranker, seen, seen_lengths)
    truth = held_lengths.mean(axis=1)
    tau = kendall_tau(ranker.predict(held_out), truth)
    tau_prompt_len = kendall_tau([p.prompt_len for p in held_out], truth)
    print(f"Kendall's tau on 200 held-out prompts: ranker {tau:.3f}, prompt length alone {tau_prompt_len:.3f}")
    assert tau > 0.6 > 0.2 > tau_prompt_len


def test_prompt_identity_learns_lengths_that_no_feature_explains() -> None:
    rng = np.random.default_rng(2)
    prompts = [PromptInfo(f"p{i}", 100, f"epoch0-{i}") for i in range(150)]
    own_length = rng.lognormal(5, 1, 150)
    again = [PromptInfo(p.prompt_id, 100, f"epoch1-{i}") for i, p in enumerate(prompts)]
    taus = {}
    for identity in (True, False):
        ranker = LengthRanker(min_samples=1, prompt_identity=identity)
        train(ranker, prompts, np.repeat(own_length[:, None], GROUP, axis=1).astype(int))
        taus[identity] = kendall_tau(ranker.predict(again), own_length)
    assert taus[True] > 0.5 and abs(taus[False]) < 0.1


def test_decay_follows_lengths_that_drift() -> None:
    short, long = PromptInfo("a", 50, "ga", {"x": 1.0}), PromptInfo("b", 50, "gb", {"x": 0.0})
    rankers = {decay: LengthRanker(decay=decay, min_samples=1) for decay in (1.0, 0.9)}
    for ranker in rankers.values():
        ranker.remember([short, long])
        for _ in range(200):  # early in training: x=1 prompts answer long
            ranker.observe("ga", 400)
            ranker.observe("gb", 20)
        for _ in range(40):  # later: the relation flips
            ranker.observe("ga", 20)
            ranker.observe("gb", 400)
    assert rankers[1.0].dispatch_order([short, long]) == ["a", "b"]  # still the old order
    assert rankers[0.9].dispatch_order([short, long]) == ["b", "a"]


@pytest.mark.parametrize("decay", [1.0, 0.9, 0.05])
def test_sparse_discounted_update_matches_the_dense_statistics(decay: float) -> None:
    """The observation's sparse update with a running discount scale fits the same weights as
    the definition, A = sum decay^(n-i) x_i x_i^T and b likewise (decay 0.05 folds the scale in
    before it underflows)."""
    rng = np.random.default_rng(3)
    prompts, lengths = synthetic_prompts(rng, 120)
    ranker = LengthRanker(decay=decay, min_samples=1)
    train(ranker, prompts, lengths)
    a, b = np.zeros((ranker.dim, ranker.dim)), np.zeros(ranker.dim)
    for p, group in zip(prompts, lengths):
        x = ranker.featurize(p)
        for n in group:
            a, b = decay * a + np.outer(x, x), decay * b + x * np.log1p(n)
    expected = np.linalg.solve(a + ranker.l2 * np.eye(ranker.dim), b)
    np.testing.assert_allclose(ranker.predict(prompts), [ranker.featurize(p) @ expected for p in prompts],
                               rtol=1e-6, atol=1e-9)


def test_dispatch_order_waits_for_min_samples_and_counts_unknown_groups() -> None:
    ranker = LengthRanker(min_samples=3)
    prompts = [PromptInfo(f"p{i}", 10 * (i + 1), f"g{i}") for i in range(3)]
    ranker.remember(prompts)
    ranker.observe("unknown", 5)
    assert ranker.unmatched == 1 and ranker.dispatch_order(prompts) is None
    for p in prompts:
        ranker.observe(p.group_id, 8 * p.prompt_len)  # longer prompts answer longer
    assert ranker.dispatch_order(prompts) == ["p2", "p1", "p0"]
    ranker.memory = 2
    ranker.remember(prompts[:1])
    ranker.observe("g1", 5)  # g1 was the oldest remembered group beyond memory=2: forgotten
    assert ranker.unmatched == 2


def test_tail_first_order_starts_the_tail_then_the_shortest() -> None:
    scores = np.array([3.0, 9.0, 1.0, 7.0, 2.0, 5.0, 4.0, 8.0])
    assert tail_first_order(scores, 0.125).tolist() == [1, 2, 4, 0, 6, 5, 3, 7]  # 9, then 1 2 3 4 5 7 8
    assert tail_first_order(scores, 0.25).tolist() == [1, 7, 2, 4, 0, 6, 5, 3]  # 9 8, then 1 2 3 4 5 7
    assert tail_first_order(scores, 1.0).tolist() == [1, 7, 3, 5, 6, 0, 4, 2]  # all longest first
    assert tail_first_order(scores[:2], 0.01).tolist() == [1, 0]  # at least one prompt in the tail
    assert tail_first_order(np.array([2.0, 2.0, 1.0, 2.0]), 0.25).tolist() == [0, 2, 1, 3]  # ties: given order
    with pytest.raises(ValueError, match="long_tail_fraction must be in"):
        tail_first_order(scores, 0.0)


@pytest.mark.parametrize("mode", ["on_policy", "async"])
def test_dispatch_hook_puts_the_predicted_tail_first(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The plugin's hooks as the adapter will call them (registered through the development
    door, because the section is not available yet). Async: the batch longest first;
    on-policy: the predicted-longest eighth first, then the rest shortest first."""
    monkeypatch.setenv(PLUGIN_MODULES_ENV, "rlweave.plugins.stream_generation.plugin")
    monkeypatch.setenv("RLWEAVE_LOAD_PLUGINS", "")
    rng = np.random.default_rng(3)
    for skewness_dispatch in (True, False):
        config = build_config([Setting("stream_generation.ranker_min_samples", 40, "test"),
                               Setting("stream_generation.mode", mode, "test"),
                               Setting("stream_generation.skewness_dispatch", skewness_dispatch, "test")])
        hook = build_plugin_manager(config).hook
        prompts, lengths = synthetic_prompts(rng, 10)
        assert hook.rlweave_dispatch_order(prompts=prompts) is None  # still learning
        for p, group in zip(prompts, lengths):
            for j, n in enumerate(group):
                hook.rlweave_sample_finished(sample=SampleRecord(f"{p.group_id}/{j}", p.group_id,
                                                                 p.prompt_len, int(n), 0))
        batch, batch_lengths = synthetic_prompts(rng, 50, start=10)
        order = hook.rlweave_dispatch_order(prompts=batch)
        if not skewness_dispatch:
            assert order is None
            continue
        assert sorted(order) == sorted(p.prompt_id for p in batch)
        by_id = dict(zip((p.prompt_id for p in batch), batch_lengths.mean(axis=1)))
        if mode == "async":
            assert kendall_tau(-np.arange(50), [by_id[i] for i in order]) > 0.3
        else:  # the 6 predicted longest (of 50), then the other 44 shortest first
            tail, rest = [by_id[i] for i in order[:6]], [by_id[i] for i in order[6:]]
            assert np.mean(tail) > 1.5 * np.mean(rest)
            assert kendall_tau(np.arange(44), rest) > 0.3
