"""Runs vLLM ``LLM.generate`` on a tiny model in a fresh process; prints tokens as JSON.

A separate process per configuration: each gets a fresh EngineCore and reads rlweave's
configuration from its environment, as a user's process would.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    from vllm import LLM, SamplingParams

    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=2,
              seed=0, gpu_memory_utilization=0.5)
    prompts = [f"what is {i} plus {2 * i}?" for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 4 * i, ignore_eos=True) for i in range(6)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "tokens": [list(o.outputs[0].token_ids) for o in outputs]}, f)


if __name__ == "__main__":
    main()
