"""ReLibra's layer under Megatron's ``DistributedDataParallel``: spare slots kept out of DDP.

A spare slot holds a step's or a micro-batch's replica: a copy of an owner's weights whose
gradient is folded into the owner's. In DDP's buffers it would cost fp32 gradient (and
optimizer) memory, be reduced over the expert-data-parallel group although replicas may differ
between EP groups, and be stepped by the optimizer. So::

    hold_out_spare_slots(model)           # spare slots: requires_grad=False
    ddp = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(optimizer_config, [ddp])
    release_spare_slots([ddp])            # checks the DDP settings; spares back to requires_grad

DDP and the optimizer then see only the owners (DDP and Megatron's optimizer take
``requires_grad`` parameters only, when built); a spare's gradient accumulates in ``.grad`` and
the layer adds it into the owner's ``main_grad`` in its backward, before
``finalize_model_grads`` reduces the buffers. The layer refuses to run under DDP otherwise.
Under the distributed optimizer (``use_distributed_optimizer=True``) a move carries the expert's
fp32 main-parameter and Adam shards; ``rebalance_step`` must be given the optimizer.

Refused settings: ``overlap_grad_reduce`` (DDP would start reducing an owner's bucket while its
replicas' gradients are still to be added), ``overlap_param_gather`` (a move would copy weights
the distributed optimizer has not gathered yet).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rlweave.adapters.megatron.balanced_moe import balanced_layers

REFUSED_DDP_SETTINGS = {
    "overlap_grad_reduce": "a bucket's reduction could start before replica gradients are added into their owners' "
                           "main_grad",
    "overlap_param_gather": "an expert's move would copy weights the distributed optimizer has not gathered yet",
}


MEGATRON_FIX = "set {setting}=False in DistributedDataParallelConfig"


def refusal(setting: str, fix: str = MEGATRON_FIX) -> str:
    """The one message for a DDP setting the layer cannot run under; ``fix`` names where the
    user sets it (``{setting}`` filled in): a framework that builds DDP from its own config
    (verl) names its key."""
    return (f"rlweave.replay_balance does not support Megatron DDP's {setting}=True ({REFUSED_DDP_SETTINGS[setting]}): "
            + fix.format(setting=setting))


def hold_out_spare_slots(model: torch.nn.Module) -> None:
    """Before DDP wraps ``model`` and the optimizer is built: hide the ReLibra layers' spare
    slots from both (``requires_grad=False``)."""
    for layer in balanced_layers(model):
        for p in layer.spare_params():
            p.requires_grad_(False)
        layer.ddp_state = "held out"


def release_spare_slots(ddp_chunks: Iterable[Any], fix: str = MEGATRON_FIX) -> None:
    """After DDP and the optimizer are built over ``ddp_chunks`` (Megatron DDP modules): refuse
    the settings the layer cannot run under (``fix``: see :func:`refusal`), then let the spare
    slots compute gradients again."""
    for chunk in ddp_chunks:
        ddp_config = getattr(chunk, "ddp_config", None)
        if ddp_config is None:
            raise TypeError(f"release_spare_slots takes Megatron DistributedDataParallel modules, got "
                            f"{type(chunk).__name__}")
        for setting in REFUSED_DDP_SETTINGS:
            if getattr(ddp_config, setting):
                raise NotImplementedError(refusal(setting, fix))
        for layer in balanced_layers(chunk):
            if layer.ddp_state != "held out":
                raise RuntimeError("release_spare_slots: call hold_out_spare_slots(model) before DDP wraps it")
            for p in layer.spare_params():
                p.requires_grad_(True)
            layer.ddp_state = "released"
            layer.distributed_optimizer = ddp_config.use_distributed_optimizer
