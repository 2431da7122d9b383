"""What ReLibra is compared against: Megatron's static placement and EPLB.

EPLB (DeepSeek) replicates the experts with the highest load per replica until every slot is
used, then packs the replicas onto ranks heaviest first, each onto the lightest rank that still
has a free slot; tokens of a replicated expert are split evenly among its replicas. Given the
previous step's loads it is the history-based balancer; given the current step's aggregate
loads it is the *oracle* EPLB, which still cannot see micro-batch to micro-batch shifts.
"""

from __future__ import annotations

import numpy as np

from rlweave.plugins.replay_balance.planner import check_topology, static_home
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
