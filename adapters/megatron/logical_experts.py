"""A MoE layer's experts by logical id, wherever they sit: for weight export and checkpoints.

After ReLibra moves experts (:class:`rlweave.adapters.megatron.balanced_moe.ReplayBalancedMoELayer`),
physical slot ``s`` of EP rank ``r`` holds logical expert ``physical_to_logical[r * S + s]``, and
spare slots hold transient replicas. Megatron's and the bridges' exporters name an expert by its
position (``E / ep * rank + local index``), which is right for Megatron's contiguous layout only.
:func:`logical_experts` gives each logical expert's weights under its logical id, from its home
slot (replicas skipped), for ReLibra's layer and Megatron's own ``SequentialMLP`` alike, so an
exporter names them the way the rollout engine and the HF checkpoint expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core.transformer.moe.experts import SequentialMLP

from rlweave.adapters.megatron.balanced_moe import ReplayBalancedMoELayer


def home_layout(layer: Any) -> tuple[np.ndarray, int]:
    """The logical expert in each of the EP group's home slots, rank-major [R * H], and ``H``
    (home slots per rank). Megatron's layer: its contiguous layout, every local expert a home."""
    if isinstance(layer, ReplayBalancedMoELayer):
        homes = layer._home_slot_ids()
        return layer.physical_to_logical[homes].copy(), layer.home_slots
    experts = layer.experts
    return np.arange(experts.ep_group.size() * experts.num_local_experts), experts.num_local_experts


def logical_experts(layer: Any) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """Every logical expert of ``layer`` (a MoE layer with ``SequentialMLP`` experts, expert
    TP 1) in id order: ``(id, {name in the expert: tensor})``, gathered over the EP group, so
    every EP rank gets all of them. Collective over the layer's EP group."""
    experts = layer.experts
    if not isinstance(experts, SequentialMLP):
        raise TypeError(f"logical_experts reads SequentialMLP experts, got {type(experts).__name__}")
    layout, per_rank = home_layout(layer)
    group = experts.ep_group
    gathered: dict[int, dict[str, torch.Tensor]] = {}
    for local in range(per_rank):
        named = list(experts.local_experts[local].named_parameters())
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        parts = [torch.empty_like(flat) for _ in range(group.size())]
        dist.all_gather(parts, flat, group=group)
        for r, part in enumerate(parts):
            pieces = part.split([p.numel() for _, p in named])
            gathered[int(layout[r * per_rank + local])] = {
                name: piece.view_as(p) for (name, p), piece in zip(named, pieces, strict=True)}
    assert sorted(gathered) == list(range(len(layout)))  # homes hold every expert once
    yield from sorted(gathered.items())


def logical_expert_shards(layer: ReplayBalancedMoELayer, prefix: str, sharded_offsets: tuple = (),
                          metadata: dict | None = None) -> dict[str, Any]:
    """The experts' part of ``layer``'s sharded state dict (Megatron's distributed checkpoint),
    by logical id: the layout Megatron's own ``SequentialMLP`` saves (``E`` experts along the
    expert axis, or one key per expert with ``singleton_local_shards``), so a checkpoint does not
    depend on where experts sat and loads into Megatron's layer or ReLibra's, in any layout.
    Home slot ``s`` is saved as its logical expert; spare slots (transient replicas, refilled
    from their owner before use) are not saved. ``prefix`` is the experts module's."""
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding

    experts, total = layer.experts, layer.topology.num_logical_experts
    first = layer.ep_rank * layer.slots_per_rank
    singleton = (metadata or {}).get("singleton_local_shards", False)
    out: dict[str, Any] = {}
    for local in range(layer.home_slots):
        logical = int(layer.physical_to_logical[first + local])
        state_prefix = f"{prefix}local_experts.{local}."
        offsets = sharded_offsets if singleton else (*sharded_offsets, (len(sharded_offsets), logical, total))
        shards = experts.local_experts[local].sharded_state_dict(state_prefix, offsets, metadata)
        replace_prefix_for_sharding(shards, state_prefix, f"{prefix}experts.{logical}." if singleton else f"{prefix}experts.")
        for shard in shards.values():  # replicated over the expert-data-parallel group
            shard.replica_id = (*shard.replica_id[:2], experts.dp_group.rank())
        out |= shards
    return out
