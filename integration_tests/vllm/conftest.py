"""One run of vLLM's own scheduler on the shared workload, for every token-equality test (a
fresh engine costs about 35 s on this CPU, so it runs once per session, with its engine core in
the process that drives it: the same scheduler and model, one interpreter start fewer)."""

from __future__ import annotations

import pytest
from engine_workload import WORKLOAD, engine_env

from rlweave.benchmarks.vllm_generate import generate_in_fresh_engine


@pytest.fixture(scope="session")
def default_tokens() -> list[list[int]]:
    """Greedy tokens of WORKLOAD under vLLM's own FCFS scheduler, rlweave absent."""
    return generate_in_fresh_engine(engine_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"), **WORKLOAD)["tokens"]
