"""verl syncs Mixtral-style MoE actors into vLLM under the names vLLM's Mixtral loads.

transformers 5 keeps a Mixtral layer's router and experts under ``mlp.`` (``mlp.gate``,
packed ``mlp.experts.gate_up_proj``/``down_proj``); vLLM's ``MixtralForCausalLM`` names the
block ``block_sparse_moe``. verl's ``unfuse_moe_params`` unpacks the experts (Qwen-style names,
which vLLM's Mixtral mapper turns into ``w1/w3/w2``) but keeps ``mlp.``, so the first weight
sync fails with "There is no module or parameter named 'layers.0.mlp'" and then hangs. This
renames ``.mlp.`` to ``.block_sparse_moe.`` for ``model_type == "mixtral"`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from rlweave.patches import Revert


def mixtral_names(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for name, tensor in weights:
        yield name.replace(".mlp.", ".block_sparse_moe."), tensor


def apply() -> Revert:
    import verl.workers.engine.fsdp.transformer_impl as impl

    original = impl.unfuse_moe_params

    def unfuse_moe_params(weights, model_type=None):  # type: ignore[no-untyped-def]
        unfused = original(weights, model_type)
        return mixtral_names(unfused) if model_type == "mixtral" else unfused

    impl.unfuse_moe_params = unfuse_moe_params

    def revert() -> None:
        impl.unfuse_moe_params = original

    return revert
