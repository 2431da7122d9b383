"""verl's router replay feeding ReLibra's Megatron MoE layers (``rlweave.replay_balance``).

verl hands replayed routing to Megatron at two moments (verl 0.9,
``verl/workers/engine/megatron/transformer_impl.py``), and each becomes one call into
:mod:`rlweave.adapters.megatron.balanced_moe`:

- **a step's routing is known**: ``MegatronEngine.forward_backward_batch(forward_only=False)``
  splits the step's mini-batch into micro-batches, each carrying ``routed_experts`` (jagged
  [sequences, tokens, layers, top_k]), and hands them to Megatron's schedule with
  ``make_batch_generator``. :func:`rebalance_before_step` turns them into
  ``rebalance_step``: ReLibra's step tier may move experts between ranks and copy step
  replicas before the first forward (their gradients reach the owners after the last of these
  micro-batches' backward, before verl's optimizer step);
- **a micro-batch's routing is handed over**: the engine's ``forward_step`` calls
  ``set_router_replay_data(..., model=chunk)``, which packs the micro-batch's routes, splits
  them over sequence- and context-parallel ranks and sets each router's ``RouterReplay``
  targets [tokens, top_k]. :func:`plan_microbatch` reads those targets back, exactly the rows each
  router will replay, and calls ``prepare_microbatch``: every layer's replicas are planned
  with one gather, before the forward instead of inside each layer.

The patch :mod:`rlweave.patches.verl_router_replay_hooks` calls these; it is applied only while
a plugin decides expert placement (``rlweave_expert_step_placement`` or
``rlweave_expert_microbatch_placement``), so with ``replay_balance`` off nothing here runs.

Limits: with R3's replay mask (the last row of each sequence keeps the router's own choice)
a micro-batch's routing is not fully known ahead, so the layers plan in their forward from the
actual routing (same decision, one gather per layer on the critical path). The step tier reads
the micro-batches before verl splits them over ranks, so it needs tensor and context
parallelism 1; it passes verl's optimizer, whose state moves with the experts (Megatron's
distributed optimizer included: its shards move through its own accessors, see
``sharded_expert_state``; the limits are in ``balanced_moe``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlweave.adapters.megatron.balanced_moe import (
    ReplayBalancedMoELayer,
    balanced_layers,
    prepare_microbatch,
    rebalance_step,
)


def _as_module(model: Any) -> torch.nn.Module:
    """verl passes one model chunk or the list of virtual-pipeline chunks."""
    return torch.nn.ModuleList(model) if isinstance(model, list | tuple) else model


def plan_microbatch(model: Any) -> bool:
    """After verl's ``set_router_replay_data(..., model=model)``: plan every ReLibra layer of
    ``model`` for the replay targets just set. Returns whether the micro-batch was planned
    ahead (False: no ReLibra layer, or R3's replay mask leaves rows to the router)."""
    module = _as_module(model)
    layers = balanced_layers(module)
    if not layers:
        return False
    replays = [_router_replay(layer) for layer in layers]
    if any(r.target_replay_mask is not None for r in replays):
        return False  # the same on every rank: verl sets a mask for every R3 micro-batch
    prepare_microbatch(module, torch.stack([r.target_topk_idx for r in replays], dim=1).cpu().numpy())
    return True


def rebalance_before_step(model: Any, micro_batches: Sequence[Any], tf_config: Any,
                          optimizer: Any = None) -> int:
    """Before a training step's first forward: hand the routing of all its micro-batches
    (``routed_experts`` of each, in schedule order) to ReLibra's step tier, which may move
    experts with their weights and ``optimizer`` state. Returns the experts moved."""
    module = _as_module(model)
    layers = balanced_layers(module)
    if not layers:
        raise RuntimeError(
            "rlweave.replay_balance is enabled but verl's Megatron model has no ReplayBalancedMoELayer: "
            "it was not built through verl's make_megatron_module with rlweave's verl_megatron_layer_spec "
            "patch applied (rlweave doctor lists the patch groups). Build it through verl's engine with "
            "rlweave on, or with rlweave.adapters.megatron.layer_spec (docs/replay_balance.md), or disable "
            "rlweave.replay_balance")
    routes = [mb.get("routed_experts", None) for mb in micro_batches]
    if not routes or any(r is None for r in routes):
        return 0  # no replay data (verl itself refuses to replay then)
    from megatron.core import parallel_state as mpu

    if mpu.get_tensor_model_parallel_world_size() > 1 or mpu.get_context_parallel_world_size() > 1:
        raise NotImplementedError(
            "rlweave.replay_balance plans a step from verl's micro-batches before they are split over "
            "tensor- and context-parallel ranks; it supports tensor_model_parallel_size=1 and "
            "context_parallel_size=1 so far (or disable rlweave.replay_balance)")
    rows = [_token_rows(r) for r in routes]
    columns = _route_columns(layers, rows[0].shape[1], tf_config)
    bounds = tuple(np.cumsum([0] + [len(r) for r in rows]).tolist())
    topk_ids = np.concatenate(rows)[:, columns]
    return rebalance_step(module, topk_ids, bounds, optimizer)


def _router_replay(layer: ReplayBalancedMoELayer) -> Any:
    replay = getattr(layer.router, "router_replay", None)
    if replay is None or replay.target_topk_idx is None:
        raise RuntimeError(
            f"rlweave.replay_balance: MoE layer {layer.layer_number} got no replay data from verl's "
            "set_router_replay_data (an MTP layer, or a router built without routing replay); build "
            "ReLibra layers only where verl replays routing")
    return replay


def _token_rows(routes: torch.Tensor) -> np.ndarray:
    """A micro-batch's jagged ``routed_experts`` [sequences, tokens, layers, k] as [tokens, layers, k]."""
    if not routes.is_nested:
        raise TypeError("rlweave.replay_balance reads verl's jagged (no-padding) routed_experts; "
                        f"got a padded tensor of shape {tuple(routes.shape)}")
    return routes.values().to(torch.int64).cpu().numpy()


def _route_columns(layers: list[ReplayBalancedMoELayer], route_layers: int, tf_config: Any) -> list[int]:
    """Column of each ReLibra layer in verl's route tensor, as ``set_router_replay_data`` picks
    it: by layer when the tensor covers every layer, else by MoE-layer ordinal."""
    from verl.utils.megatron.router_replay_utils import is_moe_layer

    columns = []
    for layer in layers:
        index = layer.router.layer_number - 1  # what verl's router walk keys on
        if route_layers != tf_config.num_layers:
            index = sum(1 for i in range(index) if is_moe_layer(tf_config, i))
        if not 0 <= index < route_layers:
            raise RuntimeError(f"rlweave.replay_balance: verl's routed_experts has {route_layers} layers, none "
                               f"for MoE layer {layer.router.layer_number}")
        columns.append(index)
    return columns
