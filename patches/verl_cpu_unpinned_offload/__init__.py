"""verl on CPU: FSDP2's CPU offload without pinned memory.

verl builds the reference model (forward only) with ``CPUOffloadPolicy(pin_memory=True)``
(``verl/workers/engine/fsdp/transformer_impl.py``). Pinning page-locks host memory for fast
copies to an accelerator; with no accelerator torch raises ``Cannot access accelerator device
when none is available``. On the CPU platform the parameters already live in host memory, so
the same policy without pinning is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.patches import Revert


def apply() -> Revert:
    import verl.workers.engine.fsdp.transformer_impl as impl

    original = impl.CPUOffloadPolicy

    @dataclass
    class UnpinnedCPUOffloadPolicy(original):  # type: ignore[misc, valid-type]
        def __post_init__(self) -> None:
            self.pin_memory = False

    impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy

    def revert() -> None:
        impl.CPUOffloadPolicy = original

    return revert
