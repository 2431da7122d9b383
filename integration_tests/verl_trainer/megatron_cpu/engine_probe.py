"""What the replay_balance-in-verl test reads of verl's Megatron engine after each training step:
the gradient norm the optimizer's step returned, the experts ReLibra moved before the step, the
replica slots its last micro-batch filled, and the rank's weights, experts by logical id (rlweave's
layer: its home slots; Megatron's: its positional ones). Written to
``$RLWEAVE_TEST_PROBE_DIR/rank<r>.pt`` after every step. Test harness only.

verl imports this module in each of its processes (``VERL_USE_EXTERNAL_MODULES=cpu_stand_ins,
engine_probe``); it wraps the engine once :mod:`cpu_stand_ins` has put its stand-ins in.
"""

from __future__ import annotations

import os
from typing import Any

import cpu_stand_ins

PROBE_ENV = "RLWEAVE_TEST_PROBE_DIR"


def _probe(engine_module: Any) -> None:
    import torch
    import torch.distributed as dist

    import rlweave.adapters.verl.router_replay as router_replay
    from rlweave.adapters.megatron.balanced_moe import ReplayBalancedMoELayer, balanced_layers

    out = os.environ[PROBE_ENV]
    record: dict[str, list] = {"moved": [], "replica_slots": [], "steps": []}
    engine_cls = engine_module.MegatronEngine

    rebalance = router_replay.rebalance_before_step  # the hooks patch imports it when it calls it

    def rebalance_before_step(*args: Any, **kwargs: Any) -> int:
        moved = rebalance(*args, **kwargs)
        record["moved"].append(moved)
        return moved

    router_replay.rebalance_before_step = rebalance_before_step

    forward_backward = engine_cls.forward_backward_batch

    def forward_backward_batch(self: Any, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
        output = forward_backward(self, data, loss_function, forward_only)
        if not forward_only:
            layers = balanced_layers(torch.nn.ModuleList(self.module))
            record["replica_slots"].append(sum(int((layer.last_physical_to_logical >= 0).sum())
                                               - layer.topology.num_logical_experts for layer in layers))
        return output

    step = engine_cls.optimizer_step

    def optimizer_step(self: Any) -> Any:
        grad_norm = step(self)
        model = self.module[0]
        while hasattr(model, "module"):  # DDP, Float16Module
            model = model.module
        experts = []
        for layer in model.decoder.layers:
            if isinstance(layer.mlp, ReplayBalancedMoELayer):
                experts.append({e: [t.detach().clone() for t in ts]
                                for e, ts in layer.mlp.logical_expert_state().items()})
            else:
                experts.append({e: [p.detach().clone() for p in layer.mlp.experts.local_experts[i].parameters()]
                                for i, e in enumerate(layer.mlp.local_expert_indices)})
        dense = {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." not in n}
        record["steps"].append({"grad_norm": float(grad_norm), "experts": experts, "dense": dense})
        torch.save(record, f"{out}/rank{dist.get_rank()}.pt")
        return grad_norm

    engine_cls.forward_backward_batch = forward_backward_batch
    engine_cls.optimizer_step = optimizer_step


if os.environ.get(PROBE_ENV):
    cpu_stand_ins.AFTER_APPLY.append(_probe)
