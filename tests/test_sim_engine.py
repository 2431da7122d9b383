"""The shared engine model: its terms, its fit from measured iterations, a throughput table,
and clear errors for a model that cannot be."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.sim import EngineModel


def test_an_iteration_costs_base_plus_each_sequence_plus_each_prompt_token() -> None:
    model = EngineModel(base_s=2e-3, per_seq_s=5e-4, slots=8, prefill_s_per_token=1e-5)
    assert model.iteration_s(4) == pytest.approx(4e-3)
    assert model.iteration_s(4, 100) == pytest.approx(5e-3)
    assert model.scaled(2.0).iteration_s(4, 100) == pytest.approx(1e-2)


def test_the_fit_recovers_the_terms_whose_inputs_vary() -> None:
    rng = np.random.default_rng(0)
    decoding, prompt = rng.integers(1, 16, 50), rng.integers(0, 500, 50)
    seconds = 3e-3 + 4e-4 * decoding + 2e-5 * prompt
    fit = EngineModel.fit(decoding, seconds, slots=16, prefill_tokens=prompt)
    assert (fit.base_s, fit.per_seq_s, fit.prefill_s_per_token) == pytest.approx((3e-3, 4e-4, 2e-5))
    assert fit.slots == 16
    # FastServe's line over tokens: the batch never varies, so it folds into base
    line = EngineModel.fit([1] * 50, 3e-3 + 2e-5 * prompt, prefill_tokens=prompt)
    assert (line.base_s, line.per_seq_s, line.prefill_s_per_token) == pytest.approx((3e-3, 0.0, 2e-5))
    # Heddle's decode line, its prefill cost measured apart
    heddle = EngineModel.fit([1, 8], [3e-3, 1e-2], 8, 1e-5)
    assert (heddle.base_s, heddle.per_seq_s, heddle.slots, heddle.prefill_s_per_token) == pytest.approx(
        (2e-3, 1e-3, 8, 1e-5))
    # noise that tilts the line below zero is clamped: no term costs less than nothing
    assert EngineModel.fit([1, 2], [2.0, 1.0]).per_seq_s == 0.0
    with pytest.raises(ValueError, match="one decoding \\(and prefill\\) count per measured iteration"):
        EngineModel.fit([1, 2, 3], [1.0, 2.0])


def test_a_throughput_table_is_the_decode_cost() -> None:
    model = EngineModel.from_throughput((1, 4, 8), (10.0, 20.0, 40.0))
    assert model.slots == 8
    assert model.iteration_s(4) == pytest.approx(4 / 20.0)
    assert model.iteration_s(6) == pytest.approx(6 / 30.0)  # throughput interpolated, then per iteration
    assert model.scaled(2.0).iteration_s(4) == pytest.approx(0.4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(per_seq_s=-1.0), "per_seq_s"),
    (dict(base_s=-2.0, per_seq_s=1.0), "base_s \\+ per_seq_s"),
    (dict(slots=0), "slots >= 1"),
    (dict(throughput=((2, 1.0),)), "start at 1"),
    (dict(base_s=1.0, throughput=((1, 1.0),)), "base_s and per_seq_s stay 0"),
])
def test_a_model_that_cannot_be_says_why(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineModel(**kwargs)
