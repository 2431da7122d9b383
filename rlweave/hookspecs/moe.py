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
def rlweave_expert_placement(
    trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement
) -> ExpertPlacement | None:
    """Where each logical expert (and its replicas) lives for the coming micro-batch or step.

    Called by the Megatron MoE adapter before the micro-batch whose routing ``trace`` holds.
    ``None`` keeps ``current`` (Megatron's static contiguous placement).
    """
