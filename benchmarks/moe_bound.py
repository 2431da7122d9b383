"""How far any micro-batch plan can go: a lower bound on the busiest rank's tokens, which
``bench moe`` reports beside rlweave's max/mean (benchmark code: no plan uses it).

The micro-batch tier may only add replicas inside their owner's node, into free slots of the
step's layout, and may split an expert's tokens freely among its copies. Whatever the cost
model says, no plan under those constraints gets the busiest rank below the largest of:

1. the mean rank load (every token is processed once);
2. per set of nodes, the tokens of the experts that only those nodes can hold (owner's node,
   step replicas' nodes), spread over their ranks (no micro-batch replica leaves its node);
3. per expert, the tokens of the experts whose ranks lie among its own (the ranks holding it
   and those of its owner's node with a free slot), spread over those;
4. the least level ``L`` at which every node has free slots for the replicas its ranks need to
   shed their load above ``L`` (each replica takes at most ``L`` tokens of one expert).

Experts already replicated by the step layout count in (4) as if free to leave their ranks, and
in (2) with their step replicas' nodes counted whole, so the bound stays valid (a relaxation)
whatever the step tier chose. (2) looks at every set of nodes up to ``MAX_NODE_SETS`` nodes,
at each node alone beyond that. Comparing a planner against this bound says whether it stops
short (the bound is lower) or the design itself stops there (the bound is as high).
"""

from __future__ import annotations

import numpy as np

from rlweave.types import ExpertTopology

MAX_NODE_SETS = 10  # up to 2**10 - 1 sets of nodes in (2)


def max_load_bound(load: np.ndarray, layout: np.ndarray, home: np.ndarray, topology: ExpertTopology) -> float:
    """Lower bound on the busiest rank's tokens for one micro-batch over ``layout``.

    load: [E] tokens per expert; layout: physical_to_logical [R*S] of the step (home slots plus
    step replicas, -1 empty); home: int [E] each expert's owner rank. Returns tokens.
    """
    load = np.asarray(load, dtype=float)
    home = np.asarray(home)
    ranks, slots, rpn = topology.num_ranks, topology.slots_per_rank, topology.ranks_per_node
    p2l = np.asarray(layout).reshape(ranks, slots)
    held = p2l >= 0
    copies = np.bincount(p2l[held], minlength=load.size)
    free = slots - held.sum(axis=1)  # [R]
    node_of = np.arange(ranks) // rpn
    single = copies == 1  # only its owner holds it: the micro-batch tier alone can split it
    # (2) experts confined to a set of nodes, spread over those nodes' ranks
    in_node = np.zeros((load.size, topology.nodes), dtype=bool)  # [E, nodes]: a copy there
    in_node[p2l[held], node_of[np.nonzero(held)[0]]] = True
    if topology.nodes <= MAX_NODE_SETS:
        sets = (np.arange(1, 2 ** topology.nodes)[:, None] >> np.arange(topology.nodes)) & 1 == 1
    else:
        sets = np.eye(topology.nodes, dtype=bool)
    confined = ~np.any(in_node[None] & ~sets[:, None], axis=2)  # [sets, E]
    node_bound = float(np.max(confined @ load / (sets.sum(axis=1) * rpn)))
    # (3) the experts whose ranks lie among one expert's ranks, over those ranks
    ranks_of = (node_of[None] == node_of[home][:, None]) & (free > 0)[None]  # [E, R]
    ranks_of[p2l[held], np.nonzero(held)[0]] = True
    within = ~np.any(ranks_of[None] & ~ranks_of[:, None], axis=2)  # [e, f]: f's ranks among e's
    expert_bound = float(np.max(within @ load / ranks_of.sum(axis=1)))
    low = max(load.sum() / ranks, node_bound, expert_bound)
    # (4) bisection on L between what (1)-(3) give and the load with no replica at all
    kept = np.bincount(home[single], weights=load[single], minlength=ranks)
    high = max(low, float(kept.max()))
    node_free = np.bincount(node_of, weights=free, minlength=topology.nodes)
    per_rank = [load[single & (home == r)] for r in range(ranks)]
    while high - low > 1e-6 * max(high, 1.0):
        level = (low + high) / 2
        needed = np.bincount(node_of, weights=[_replicas_needed(w, level, rpn - 1) for w in per_rank],
                             minlength=topology.nodes)
        low, high = (low, level) if np.all(needed <= node_free) else (level, high)
    return float(low)  # out of reach (by (1)-(3) or (4)); the least level in reach is within 1e-6


def _replicas_needed(loads: np.ndarray, level: float, most: int) -> float:
    """Fewest replicas that bring one rank holding experts ``loads`` to ``level`` tokens, each
    replica taking at most ``level`` tokens of its expert and each expert at most ``most``
    replicas (inf when even those cannot). The k-th replica of expert e takes at most
    ``min(level, w_e - (k - 1) level)``: those gains only fall, so taking the largest first is
    optimal."""
    excess = loads.sum() - level
    if excess <= 0:
        return 0.0
    full = np.minimum(np.floor(loads / level), most)
    rest = np.where(full < most, loads - full * level, 0.0)
    if full.sum() * level >= excess:
        return float(np.ceil(excess / level - 1e-9))
    gained = full.sum() * level + np.cumsum(np.sort(rest)[::-1])
    enough = np.nonzero(gained >= excess - 1e-9)[0]
    return float(full.sum() + enough[0] + 1) if enough.size else np.inf
