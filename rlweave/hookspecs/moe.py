"""Mixture-of-experts routing and expert placement.

Callers: the Megatron-core MoE layers (``rlweave.adapters.megatron``: training, replayed
routing) and vLLM's routing capture (``rlweave.adapters.vllm.routing_capture``: rollout).
"""

from __future__ import annotations

import numpy as np

from rlweave.hookspecs import hookspec
from rlweave.types import ExpertPlacement, ExpertTopology, RoutingTrace


@hookspec
def rlweave_routing_recorded(trace: RoutingTrace) -> None:
    """Routing decisions were recorded.

    Fired by rlweave's Megatron MoE layer after each routing (``trace``: that layer's tokens,
    one layer, source ``megatron-layer-<n>``), and by vLLM's routing capture once a batch of
    sequences has been routed through every MoE layer (``trace``: [tokens, layers, top_k] of
    the prompt and response tokens, one micro-batch per interval, source ``vllm``).
    """


@hookspec(firstresult=True)
def rlweave_expert_topology(num_logical_experts: int, ep_size: int, expert_bytes: int) -> ExpertTopology | None:
    """How many physical expert slots each of the ``ep_size`` expert-parallel ranks has, and
    how ranks group into nodes (``expert_bytes``: one expert's weights).

    Called by the Megatron MoE adapter when it builds a layer whose placement a plugin decides.
    ``None`` keeps Megatron's layout: ``num_logical_experts / ep_size`` slots per rank, no spare.
    """


@hookspec(firstresult=True)
def rlweave_expert_step_placement(
    trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement, group_loads: np.ndarray | None
) -> ExpertPlacement | None:
    """Where each logical expert lives for the coming training step, and which replicas the
    step keeps.

    Called by the Megatron MoE adapter (``rebalance_step``) before a step, with the routing
    that the step will replay (``trace``: all of its micro-batches and MoE layers, the EP
    group's tokens of micro-batch m in interval m) and the placement in force (``current``: home
    slots, the first ``E / R`` slots of each rank, hold every expert once; spare slots empty).

    The answer may move experts between home slots (the adapter moves their weights, gradients
    and optimizer state) and may put *step replicas* in spare slots: the adapter copies each
    once, keeps it for all of the step's micro-batches, and adds its gradient into the owner's
    after the step's last backward. ``token_share`` must sum to 1 per expert. ``None`` keeps
    ``current``.

    ``group_loads`` (int [M, layers, E], or ``None`` from callers without data-parallel
    replicas): tokens per expert of each micro-batch, summed over the expert-data-parallel
    group, the same in each of its EP groups. When given, the answer must depend on it,
    ``topology`` and ``current`` only: every EP group then applies the same layout, as Megatron
    reduces each slot's gradient over that group.
    """


@hookspec(firstresult=True)
def rlweave_expert_microbatch_placement(
    trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement
) -> ExpertPlacement | None:
    """Which replicas one layer adds for one micro-batch, and how each expert's tokens are split
    among its copies.

    Called by the Megatron MoE adapter before a layer dispatches a micro-batch (ahead of the
    forward, in ``prepare_microbatch``, when the trainer hands over replayed routing), with that
    layer's routing over the whole EP group (``trace``: one layer, one micro-batch) and the
    step's layout (``current``: home slots and step replicas, one layer).

    The answer keeps every slot ``current`` fills and may put replicas into the empty ones (the
    adapter copies them for this micro-batch and adds their gradients into the owner's after
    its backward); ``token_share`` is free for every copy. ``None`` keeps ``current`` with its
    shares.
    """
