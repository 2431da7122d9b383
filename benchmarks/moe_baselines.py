"""What ``bench moe`` compares ReLibra against, and how it scores placements: Megatron's
static placement, EPLB, and reordering on its own (an ablation). Benchmark code: the shipped
plugin plans through :func:`rlweave.plugins.replay_balance.planner.plan_step`.

EPLB (DeepSeek) replicates the experts with the highest load per replica until every slot is
used, then packs the replicas onto ranks heaviest first, each onto the lightest rank that still
has a free slot; tokens of a replicated expert are split evenly among its replicas. Given the
previous step's loads it is the history-based balancer; given the current step's aggregate
loads it is the *oracle* EPLB, which still cannot see micro-batch to micro-batch shifts.
"""

from __future__ import annotations

import numpy as np

from rlweave.plugins.replay_balance.planner import (
    CostModel,
    check_topology,
    move_s,
    reorder_search,
    static_home,
    step_max_sum,
)
from rlweave.types import ExpertTopology


def static_placement(topology: ExpertTopology) -> tuple[np.ndarray, np.ndarray]:
    """(physical_to_logical [R*S], token_share [R*S]) of Megatron's contiguous layout."""
    per_rank = check_topology(topology)
    slots = topology.slots_per_rank
    p2l = np.full(topology.num_ranks * slots, -1)
    share = np.zeros(topology.num_ranks * slots)
    for e, r in enumerate(static_home(topology)):
        p2l[r * slots + e % per_rank], share[r * slots + e % per_rank] = e, 1.0
    return p2l, share


def eplb_placement(planning_load: np.ndarray, topology: ExpertTopology) -> tuple[np.ndarray, np.ndarray]:
    """EPLB's placement for loads ``planning_load`` [E] (history or oracle aggregate)."""
    check_topology(topology)
    experts, ranks, slots = topology.num_logical_experts, topology.num_ranks, topology.slots_per_rank
    weight = np.asarray(planning_load, dtype=float) + 1e-9
    replicas = np.ones(experts, dtype=int)
    for _ in range(ranks * slots - experts):
        replicas[np.argmax(weight / replicas)] += 1
    items = np.repeat(np.arange(experts), replicas)
    item_load = (weight / replicas)[items]
    p2l = np.full(ranks * slots, -1)
    used = np.zeros(ranks, dtype=int)
    rank_load = np.zeros(ranks)
    for i in np.argsort(-item_load, kind="stable"):
        candidates = np.nonzero(used < slots)[0]
        r = candidates[np.argmin(rank_load[candidates])]
        p2l[r * slots + used[r]] = items[i]
        used[r] += 1
        rank_load[r] += item_load[i]
    share = np.where(p2l >= 0, 1.0 / replicas[np.maximum(p2l, 0)], 0.0)
    return p2l, share


def reorder_only(step_load: np.ndarray, topology: ExpertTopology, current: np.ndarray,
                 cost: CostModel = CostModel()) -> np.ndarray:
    """The reorder-only ablation: ReLibra's home search (:func:`...planner.reorder_search`)
    without replicas, kept only if the time it saves on the busiest ranks beats moving the
    experts. step_load: [M, E]; current: int [E] home ranks. Returns int [E]."""
    home = reorder_search(step_load, topology, current)
    saved = (step_max_sum(step_load, current, topology.num_ranks)
             - step_max_sum(step_load, home, topology.num_ranks)) * cost.token_s
    return home if saved > move_s(current, home, topology, cost) else np.array(current, copy=True)


def rank_loads(load: np.ndarray, physical_to_logical: np.ndarray, token_share: np.ndarray,
               slots_per_rank: int) -> np.ndarray:
    """Tokens each rank computes.

    load: [..., num_experts] expert loads; physical_to_logical, token_share: [num_slots]
    (slot s of rank s // slots_per_rank serves token_share[s] of its expert's tokens; -1 = empty).
    Returns [..., num_ranks].
    """
    used = physical_to_logical >= 0
    per_slot = np.zeros(load.shape[:-1] + physical_to_logical.shape, dtype=float)
    per_slot[..., used] = load[..., physical_to_logical[used]] * token_share[used]
    return per_slot.reshape(load.shape[:-1] + (-1, slots_per_rank)).sum(axis=-1)


def imbalance(rank_load: np.ndarray) -> np.ndarray:
    """max / mean over the last axis (1.0 = perfectly balanced; empty loads count as 1.0)."""
    mean = rank_load.mean(axis=-1)
    return np.where(mean > 0, rank_load.max(axis=-1) / np.maximum(mean, 1e-12), 1.0)
