"""Hook implementations of ReLibra: where each expert lives, from the replayed routing.

The Megatron adapter asks twice, at ReLibra's two timescales (``timescale``); under verl,
where verl's router replay hands the routing to Megatron (``rlweave.adapters.verl.router_replay``):

- ``"step"``, once per training step with the routing of all its micro-batches: new home ranks
  per layer (:func:`.planner.plan_step`), no replicas. The adapter moves weights and optimizer
  state to match. The Megatron layer copies replicas per micro-batch, so the step plan is made
  without step replicas (kept for the whole step, which the modelled benchmark also plans):
  a move is judged against what micro-batch replicas alone reach.
- ``"microbatch"``, per layer before a micro-batch is dispatched: replicas of hot experts in the
  spare slots of the same node, and each replica's share of its expert's tokens
  (:func:`.planner.plan_replication`). Home slots stay as they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlweave.config import ReplayBalanceConfig, RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.replay_balance.loads import expert_loads
from rlweave.plugins.replay_balance.planner import (
    CostModel,
    PlanError,
    check_topology,
    home_layout,
    home_of,
    plan_replication,
    plan_step,
)
from rlweave.types import ExpertPlacement, ExpertTopology, RoutingTrace

_settings = ReplayBalanceConfig()
_cost = CostModel()  # per-token time and bandwidths; expert_bytes comes from the topology


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _settings
    _settings = config.replay_balance


@hookimpl
def rlweave_expert_topology(num_logical_experts: int, ep_size: int, expert_bytes: int) -> ExpertTopology:
    """``ranks_per_node`` ranks per node (all of them when EP is smaller), and
    ``slots_per_rank`` expert slots per rank (0: the rank's own experts plus one spare)."""
    per_node = min(_settings.ranks_per_node, ep_size)
    if ep_size % per_node:
        raise PlanError(
            f"expert-parallel size {ep_size} is not a whole number of nodes of "
            f"rlweave.replay_balance.ranks_per_node={_settings.ranks_per_node} ranks; set "
            f"ranks_per_node to the number of ranks of one node that the EP group spans"
        )
    if num_logical_experts % ep_size:
        raise PlanError(f"{num_logical_experts} experts do not divide evenly over {ep_size} EP ranks")
    slots = _settings.slots_per_rank or num_logical_experts // ep_size + 1
    topology = ExpertTopology(num_logical_experts, ep_size // per_node, per_node, slots, expert_bytes)
    try:
        check_topology(topology)
    except PlanError as e:
        raise PlanError(f"rlweave.replay_balance.slots_per_rank={_settings.slots_per_rank}: {e}") from None
    return topology


@hookimpl
def rlweave_expert_placement(trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement,
                             timescale: str) -> ExpertPlacement:
    layers = trace.topk_ids.shape[1]
    cost = dataclasses.replace(_cost, expert_bytes=topology.expert_bytes) if topology.expert_bytes else _cost
    loads = expert_loads(trace.topk_ids, trace.microbatch_bounds, topology.num_logical_experts)  # [M, L, E]
    plans = []
    for layer in range(layers):
        home = home_of(current.physical_to_logical[layer], topology)
        if timescale == "step":
            step = plan_step(loads[:, layer], topology, home, cost, _settings.threshold, step_replicas=False)
            plans.append(home_layout(step.home, topology))
        else:
            plans.append(plan_replication(loads[:, layer].sum(axis=0), home_layout(home, topology)[0], topology,
                                          cost, target=_settings.threshold))
    return ExpertPlacement(np.stack([p for p, _ in plans]), np.stack([s for _, s in plans]))
