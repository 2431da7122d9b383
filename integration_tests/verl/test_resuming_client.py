"""rlweave's resuming client on verl's own ``LLMServerClient``: a request its replica aborts (a
migration, or a weight push) is resubmitted at once with the tokens it has and the rest of its
budget, and the agent loop sees one output, as if nothing had happened; with failover (what
resilience asks for) a request whose replica died is resubmitted too. verl's server call is
replaced by a scripted replica (no Ray, no engine: the verl_trainer group runs the real thing)."""

from __future__ import annotations

import asyncio

import pytest
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from rlweave.adapters.verl.resuming_client import ResumingLLMServerClient


def test_an_aborted_request_resumes_with_its_tokens_and_the_rest_of_its_budget(monkeypatch):
    calls = []
    script = [TokenOutput(token_ids=[5, 6], log_probs=[-0.5, -0.6], stop_reason="aborted",
                          extra_fields={"global_steps": 3, "min_global_steps": 3}),
              TokenOutput(token_ids=[7], log_probs=[-0.7], stop_reason="aborted", extra_fields={"global_steps": 3}),
              TokenOutput(token_ids=[8, 9], log_probs=[-0.8, -0.9], stop_reason="length",
                          extra_fields={"global_steps": 3, "min_global_steps": 3})]

    async def replica(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        return script[len(calls) - 1]

    monkeypatch.setattr(LLMServerClient, "generate", replica)
    client = ResumingLLMServerClient.__new__(ResumingLLMServerClient)  # the server call is all it uses
    out = asyncio.run(client.generate("r1", prompt_ids=[1, 2], sampling_params={"max_tokens": 5, "top_k": 1}))
    assert [c[1] for c in calls] == [[1, 2], [1, 2, 5, 6], [1, 2, 5, 6, 7]]  # prompt + what it has
    assert [c[2]["max_tokens"] for c in calls] == [5, 3, 2] and {c[0] for c in calls} == {"r1"}
    assert out.token_ids == [5, 6, 7, 8, 9] and out.log_probs == pytest.approx([-0.5, -0.6, -0.7, -0.8, -0.9])
    assert out.stop_reason == "length" and out.extra_fields["rlweave_resumed"] == 2
    assert out.extra_fields["min_global_steps"] == 3


def test_without_a_budget_the_response_length_is_pinned_across_resumptions(monkeypatch):
    from types import SimpleNamespace

    budgets = []
    script = [TokenOutput(token_ids=[3] * 10, log_probs=None, stop_reason="aborted", extra_fields={}),
              TokenOutput(token_ids=[4] * 6, log_probs=None, stop_reason="length", extra_fields={})]

    async def replica(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        budgets.append(sampling_params.get("max_tokens"))
        return script[len(budgets) - 1]

    monkeypatch.setattr(LLMServerClient, "generate", replica)
    client = ResumingLLMServerClient.__new__(ResumingLLMServerClient)
    client.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(response_length=16)))
    out = asyncio.run(client.generate("r3", prompt_ids=[1, 2, 3], sampling_params={"temperature": 1.0}))
    assert budgets == [16, 6] and len(out.token_ids) == 16  # the server would count from the longer prompt


def test_a_request_aborted_at_its_budget_stops_there(monkeypatch):
    async def replica(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        return TokenOutput(token_ids=[4, 4], log_probs=None, stop_reason="abort", extra_fields={})

    monkeypatch.setattr(LLMServerClient, "generate", replica)
    client = ResumingLLMServerClient.__new__(ResumingLLMServerClient)
    out = asyncio.run(client.generate("r2", prompt_ids=[1], sampling_params={"max_tokens": 2}))
    assert out.token_ids == [4, 4] and out.stop_reason == "length" and out.log_probs is None


def _client_with_failover() -> ResumingLLMServerClient:
    client = ResumingLLMServerClient.__new__(ResumingLLMServerClient)
    client._wait_s, client._dead, client._server_of = 5.0, set(), {}  # what __init__(wait_s=5.0) sets
    return client


def _dies_once(calls: list):
    script = [TokenOutput(token_ids=[5, 6], log_probs=None, stop_reason="aborted", extra_fields={}),
              RuntimeError("EngineDeadError: EngineCore encountered an issue"),
              TokenOutput(token_ids=[7], log_probs=None, stop_reason="length", extra_fields={})]

    async def replica(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        calls.append(list(prompt_ids))
        step = script[len(calls) - 1]
        if isinstance(step, Exception):
            raise step
        return step
    return replica


def test_with_failover_a_request_whose_replica_died_is_resubmitted_with_the_tokens_it_had(monkeypatch):
    calls: list = []
    monkeypatch.setattr(LLMServerClient, "generate", _dies_once(calls))
    out = asyncio.run(_client_with_failover().generate("r4", prompt_ids=[1, 2], sampling_params={"max_tokens": 3}))
    assert calls == [[1, 2], [1, 2, 5, 6], [1, 2, 5, 6]]  # the dead part again, on a live replica
    assert out.token_ids == [5, 6, 7] and out.stop_reason == "length"


def test_without_failover_a_dead_replica_fails_the_request_as_verl_would(monkeypatch):
    calls: list = []
    monkeypatch.setattr(LLMServerClient, "generate", _dies_once(calls))
    client = ResumingLLMServerClient.__new__(ResumingLLMServerClient)
    with pytest.raises(RuntimeError, match="EngineDeadError"):
        asyncio.run(client.generate("r5", prompt_ids=[1, 2], sampling_params={"max_tokens": 3}))
    assert len(calls) == 2
