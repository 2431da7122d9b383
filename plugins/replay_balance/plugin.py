"""Hook implementations of ReLibra: where each expert lives, from the replayed routing.

The Megatron adapter asks at ReLibra's two timescales (under verl, where verl's router replay
hands the routing to Megatron: ``rlweave.adapters.verl.router_replay``):

- per training step, with the routing of all its micro-batches
  (``rlweave_expert_step_placement``): new home ranks per layer and step replicas, copied once
  and kept for the whole step (:func:`.planner.plan_step`). The adapter moves weights and
  optimizer state to the new homes, copies the replicas, and folds their gradients into the
  owners after the step's last backward;
- per layer before a micro-batch is dispatched (``rlweave_expert_microbatch_placement``): the
  best token split over the step's layout, and replicas of hot experts in the spare slots left in
  the same node (:func:`.planner.plan_replication`). Home slots and step replicas stay.

``rlweave bench moe`` asks the same two hooks for its rlweave row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rlweave.config import RlweaveConfig
from rlweave.plugins.replay_balance.options import ReplayBalanceConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.replay_balance.loads import expert_loads
from rlweave.plugins.replay_balance.planner import (
    CostModel,
    PlanError,
    check_topology,
    home_of,
    plan_replication,
    plan_step,
)
from rlweave.plugins.replay_balance.split import split_shares
from rlweave.types import ExpertPlacement, ExpertTopology, Need, PluginNeed, RoutingTrace

_settings = ReplayBalanceConfig()
_cost = CostModel()  # per-token time and bandwidths; expert_bytes comes from the topology
# The last step plan's micro-batch placements, by what determines them (the micro-batch hook
# would compute the same again): {key: (physical_to_logical, token_share)}.
_planned: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


# RLWEAVE_LAYERS and SEQUENTIAL_EXPERTS: an engine that cannot build the balanced layer, or whose
# experts share one grouped weight, is refused before the job starts rather than at its first step.
NEEDS = (
    PluginNeed(Need.MOE_LAYERS, "replay_balance", "ReLibra places experts in Megatron's MoE layers"),
    PluginNeed(Need.ROUTING_REPLAY, "replay_balance", "it plans each step from the replayed routing"),
    PluginNeed(Need.RLWEAVE_LAYERS, "replay_balance", "its balanced MoE layer replaces Megatron's"),
    PluginNeed(Need.SEQUENTIAL_EXPERTS, "replay_balance", "it moves and copies experts one by one"),
)


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _settings
    _settings = config.replay_balance


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


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


def _cost_of(topology: ExpertTopology) -> CostModel:
    return dataclasses.replace(_cost, expert_bytes=topology.expert_bytes) if topology.expert_bytes else _cost


@hookimpl
def rlweave_expert_step_placement(trace: RoutingTrace, topology: ExpertTopology, current: ExpertPlacement,
                                  group_loads: np.ndarray | None) -> ExpertPlacement:
    """Per layer: the homes and step replicas of the plan with the least modelled step time, and
    the split of the step's tokens over them (each micro-batch re-splits its own). Planned from
    ``group_loads`` when given (the expert-data-parallel group's, alike in each of its EP
    groups), so that every EP group gets the same plan."""
    cost = _cost_of(topology)
    if group_loads is None:
        group_loads = expert_loads(trace.topk_ids, trace.microbatch_bounds, topology.num_logical_experts)
    loads = np.asarray(group_loads, dtype=np.int64)  # [M, L, E]
    layouts, shares = [], []
    _planned.clear()
    for layer in range(loads.shape[1]):
        home = home_of(current.physical_to_logical[layer], topology)
        plan = plan_step(loads[:, layer], topology, home, cost, _settings.threshold)
        for load, p2l, share in zip(loads[:, layer], plan.physical_to_logical, plan.token_share, strict=True):
            _planned[_key(load, plan.layout, topology, cost)] = (p2l, share)
        layouts.append(plan.layout)
        shares.append(split_shares(loads[:, layer].sum(axis=0)[None], plan.layout, topology.slots_per_rank)[0][0])
    return ExpertPlacement(np.stack(layouts), np.stack(shares))


@hookimpl
def rlweave_expert_microbatch_placement(trace: RoutingTrace, topology: ExpertTopology,
                                        current: ExpertPlacement) -> ExpertPlacement:
    """Per layer: the micro-batch's replicas and split over the step's layout."""
    cost = _cost_of(topology)
    load = expert_loads(trace.topk_ids, trace.microbatch_bounds, topology.num_logical_experts).sum(axis=0)  # [L, E]
    plans = []
    for layer, layout in enumerate(current.physical_to_logical):
        known = _planned.get(_key(load[layer], layout, topology, cost))
        plans.append(known or plan_replication(load[layer], layout, topology, cost, target=_settings.threshold))
    return ExpertPlacement(np.stack([p for p, _ in plans]), np.stack([s for _, s in plans]))


def _key(load: np.ndarray, layout: np.ndarray, topology: ExpertTopology, cost: CostModel) -> tuple:
    """What a micro-batch placement depends on: its loads [E], the step's layout [R*S], the
    topology, the cost model and the threshold."""
    return (np.asarray(load, dtype=np.int64).tobytes(), np.asarray(layout, dtype=np.int64).tobytes(), topology,
            cost, _settings.threshold)
