"""Mixture-of-experts routing and expert placement (Megatron-core MoE layer, vLLM FusedMoE).

Called by ``rlweave.adapters.megatron`` (training, replayed routing) and by the vLLM adapter
(rollout, routing capture).
"""

from __future__ import annotations

from rlweave.hookspecs import hookspec
from rlweave.types import ExpertPlacement, ExpertTopology, RoutingTrace


@hookspec
def rlweave_routing_recorded(trace: RoutingTrace) -> None:
    """Routing decisions were recorded (rollout capture, or Megatron's RouterReplay RECORD)."""


@hookspec(firstresult=True)
def rlweave_expert_topology(num_logical_experts: int, ep_size: int, expert_bytes: int) -> ExpertTopology | None:
    """How many physical expert slots each of the ``ep_size`` expert-parallel ranks has, and
    how ranks group into nodes (``expert_bytes``: one expert's weights).

    Called by the Megatron MoE adapter when it builds a layer whose placement a plugin decides.
    ``None`` keeps Megatron's layout: ``num_logical_experts / ep_size`` slots per rank, no spare.
    """


@hookspec(firstresult=True)
def rlweave_expert_placement(
    trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement, timescale: str
) -> ExpertPlacement | None:
    """Where each logical expert (and its replicas) lives for the coming step or micro-batch.

    Called by the Megatron MoE adapter with the routing that will be replayed (``trace``) and the
    placement now in force (``current``, home slots = the first ``E / R`` slots of each rank):

    - ``timescale="step"``: before a training step, ``trace`` holds all of its micro-batches and
      layers; the answer may move experts between home slots (the adapter moves their weights
      and optimizer state) and must leave spare slots empty.
    - ``timescale="microbatch"``: before one layer dispatches one micro-batch, ``trace`` holds
      that layer's routing over the whole EP group; the answer keeps the home slots and may put
      replicas in spare slots, splitting an expert's tokens by ``token_share``.

    ``None`` keeps ``current``.
    """
