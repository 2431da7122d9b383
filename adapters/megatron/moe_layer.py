"""rlweave's Megatron-core MoE layer: Megatron's ``MoELayer`` with rlweave's hooks after routing.

After the router chose each token's experts, the choice is handed to plugins as a neutral
:class:`~rlweave.types.RoutingTrace` (``rlweave_routing_recorded``). Dispatch, expert compute
and combine are Megatron's own, so outputs and gradients are those of ``MoELayer``.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.moe.moe_layer import MoELayer

from rlweave.host import get_host
from rlweave.types import RoutingTrace


def routing_trace(routing_map: torch.Tensor, top_k: int, layer_number: int) -> RoutingTrace:
    """[tokens, experts] bool routing map -> RoutingTrace with topk_ids [tokens, 1, top_k]."""
    ids = torch.topk(routing_map.to(torch.int8), top_k, dim=-1, sorted=False).indices
    ids = torch.sort(ids, dim=-1).values
    return RoutingTrace(
        topk_ids=ids.detach().cpu().numpy()[:, None, :],
        microbatch_bounds=(0, int(routing_map.shape[0])),
        source=f"megatron-layer-{layer_number}",
    )


class RlweaveMoELayer(MoELayer):
    def route(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> Any:
        probs, routing_map = super().route(hidden_states, padding_mask)
        host = get_host()
        if host.implements("rlweave_routing_recorded"):
            trace = routing_trace(routing_map, self.config.moe_router_topk, self.layer_number or 0)
            host.hook.rlweave_routing_recorded(trace=trace)
        return probs, routing_map
