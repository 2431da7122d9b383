"""verl on CPU: a saved copy of the actor's weights that is a copy.

verl's ``DetachActorWorker.save_model_to_cpu`` (Decoupled PPO's stable old policy in
``separate_async``, and rlweave's stream trainer, which recomputes each mini-batch's old
log-probs with the weights that generated it while earlier mini-batches' optimizer steps have
already run) saves each FSDP2 shard with ``tensor.detach().cpu()``
(``verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu``). On a CPU device ``.cpu()`` returns the
tensor itself, so the "saved" weights alias the live ones and change with every optimizer step:
restoring them restores nothing. The patch clones the saved shards, which is what the function
means to return.
"""

from __future__ import annotations

from typing import Any

from rlweave.patches import Revert


def apply() -> Revert:
    from verl.utils import fsdp_utils

    original = fsdp_utils.fsdp2_sharded_save_to_cpu

    def fsdp2_sharded_save_to_cpu(model: Any) -> Any:
        state, spec = original(model)
        return {name: (tensor.clone(), shard_spec) for name, (tensor, shard_spec) in state.items()}, spec

    fsdp_utils.fsdp2_sharded_save_to_cpu = fsdp2_sharded_save_to_cpu

    def revert() -> None:
        fsdp_utils.fsdp2_sharded_save_to_cpu = original

    return revert
