"""ReLibra's two planners over exactly known loads.

Shapes: ``E`` logical experts, ``R = nodes * ranks_per_node`` ranks, ``S`` slots per rank
(``E // R`` home slots plus spare slots for replicas), ``M`` micro-batches in a step.
A *home* assignment is int [E]: the rank that owns each expert's weights and optimizer state.
A *placement* is (physical_to_logical [R*S], token_share [R*S]) for one layer and micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlweave.types import ExpertTopology


class PlanError(ValueError):
    """The topology cannot hold the plan (e.g. fewer slots than experts)."""


@dataclass(frozen=True)
class CostModel:
    """What a token and a weight move cost; decides when a move pays.

    token_s: compute time of one token through one expert (one layer).
    expert_bytes: bytes of one expert's weights.
    state_factor: bytes moved per weight byte when an expert changes owner (weights, gradients
        and optimizer state: 1 + 1 + 2 for Adam in fp32 master copies, per default).
    intra_node_bytes_per_s / inter_node_bytes_per_s: replica copies stay in a node (NVLink);
        reordering may cross nodes.
    """

    token_s: float = 2e-6
    expert_bytes: float = 3 * 4096 * 1408 * 2
    state_factor: float = 4.0
    intra_node_bytes_per_s: float = 300e9
    inter_node_bytes_per_s: float = 25e9

    @property
    def replica_s(self) -> float:
        return self.expert_bytes / self.intra_node_bytes_per_s

    @property
    def move_s(self) -> float:
        return self.expert_bytes * self.state_factor / self.inter_node_bytes_per_s


def check_topology(topology: ExpertTopology) -> int:
    """Home experts per rank; raises PlanError when the experts do not fit."""
    experts, ranks = topology.num_logical_experts, topology.num_ranks
    if experts % ranks:
        raise PlanError(f"{experts} experts do not divide evenly over {ranks} ranks")
    home = experts // ranks
    if topology.slots_per_rank < home:
        raise PlanError(
            f"each rank must hold its {home} experts but has {topology.slots_per_rank} slots; "
            f"raise slots_per_rank to at least {home}"
        )
    return home


def static_home(topology: ExpertTopology) -> np.ndarray:
    """Megatron's placement: expert e on rank e // (E / R)."""
    return np.arange(topology.num_logical_experts) // check_topology(topology)


def home_layout(home: np.ndarray, topology: ExpertTopology) -> tuple[np.ndarray, np.ndarray]:
    """The placement of ``home`` [E] without replicas: each rank's first ``E / R`` slots hold its
    experts in id order (share 1), its spare slots are empty (-1, share 0).
    Returns (physical_to_logical [R*S], token_share [R*S])."""
    per_rank = check_topology(topology)
    slots = topology.slots_per_rank
    home = np.asarray(home)
    if np.bincount(home, minlength=topology.num_ranks).tolist() != [per_rank] * topology.num_ranks:
        raise PlanError(f"a home assignment must give every rank {per_rank} experts, got {home.tolist()}")
    p2l = np.full(topology.num_ranks * slots, -1)
    share = np.zeros(topology.num_ranks * slots)
    order = np.argsort(home, kind="stable")  # by rank, then expert id
    slot = home[order] * slots + np.arange(len(order)) % per_rank
    p2l[slot], share[slot] = order, 1.0
    return p2l, share


def home_of(physical_to_logical: np.ndarray, topology: ExpertTopology) -> np.ndarray:
    """Home rank of each expert [E]: the rank whose home slots (its first ``E / R``) hold it."""
    per_rank = check_topology(topology)
    p2l = np.asarray(physical_to_logical).reshape(topology.num_ranks, topology.slots_per_rank)
    held = p2l[:, :per_rank]
    if sorted(held.ravel().tolist()) != list(range(topology.num_logical_experts)):
        raise PlanError(f"home slots must hold every expert exactly once, got {held.tolist()}")
    home = np.empty(topology.num_logical_experts, dtype=int)
    home[held] = np.arange(topology.num_ranks)[:, None]
    return home


def plan_reorder(step_load: np.ndarray, topology: ExpertTopology, current: np.ndarray,
                 cost: CostModel = CostModel()) -> np.ndarray:
    """Step 1 (once per step): new home ranks minimising the sum over micro-batches of the
    busiest rank's load, kept only if the time it saves beats the cost of moving experts.

    step_load: [M, E] tokens per expert in each micro-batch of the coming step (one layer).
    current: int [E] current home ranks. Returns int [E].
    """
    per_rank = check_topology(topology)
    ranks = topology.num_ranks
    step_load = np.asarray(step_load, dtype=float)
    order = np.argsort(-step_load.sum(axis=0), kind="stable")  # heaviest experts first
    rank_load = np.zeros((step_load.shape[0], ranks))
    free = np.full(ranks, per_rank)
    home = np.empty_like(current)
    for e in order:
        busiest = rank_load.max(axis=1, keepdims=True)
        objective = np.maximum(busiest, rank_load + step_load[:, e : e + 1]).sum(axis=0)
        objective[free == 0] = np.inf
        objective[current[e]] -= 1e-9  # ties: stay home
        r = int(np.argmin(objective))
        home[e], free[r] = r, free[r] - 1
        rank_load[:, r] += step_load[:, e]
    saved = (step_max_sum(step_load, current, ranks) - rank_load.max(axis=1).sum()) * cost.token_s
    moved = int(np.count_nonzero(home != current))
    return home if saved > moved * cost.move_s else current.copy()


def step_max_sum(step_load: np.ndarray, home: np.ndarray, ranks: int) -> float:
    """Sum over micro-batches of the busiest rank's tokens under ``home``."""
    per_rank = np.zeros((step_load.shape[0], ranks))
    np.add.at(per_rank.T, home, step_load.T)
    return float(per_rank.max(axis=1).sum())


def plan_replication(load: np.ndarray, home: np.ndarray, topology: ExpertTopology,
                     cost: CostModel = CostModel(), target: float = 1.02) -> tuple[np.ndarray, np.ndarray]:
    """Step 2 (per micro-batch and layer): replicate the hottest expert of the busiest rank onto
    the least-loaded rank of the same node with a free slot, moving just enough tokens to level
    the two, until max/mean <= ``target``, no spare slot is left in the node, or a new replica
    would cost more than the compute it saves.

    load: [E] tokens per expert in this micro-batch; home: int [E].
    Returns (physical_to_logical [R*S], token_share [R*S]); each expert's shares sum to 1.
    """
    per_rank = check_topology(topology)
    ranks, slots, rpn = topology.num_ranks, topology.slots_per_rank, topology.ranks_per_node
    load = np.asarray(load, dtype=float)
    p2l, share = home_layout(home, topology)
    used = np.full(ranks, per_rank)
    rank_load = np.zeros(ranks)
    np.add.at(rank_load, home, load)
    mean = rank_load.mean()
    for _ in range(ranks * (slots - per_rank) * 4):
        r = int(np.argmax(rank_load))
        if mean <= 0 or rank_load[r] / mean <= target:
            break
        node = np.arange(r // rpn * rpn, (r // rpn + 1) * rpn)
        mine = np.arange(r * slots, r * slots + used[r])
        served = load[p2l[mine]] * share[mine]
        slot = int(mine[np.argmax(served)])
        e = p2l[slot]
        # The least-loaded rank of the node that holds e already (no copy) or has a free slot.
        holders = {q for q in node if q != r and e in p2l[q * slots : q * slots + used[q]]}
        candidates = holders | {q for q in node if q != r and used[q] < slots}
        if not candidates:
            break
        q = min(candidates, key=lambda c: rank_load[c])
        moved = min(served.max(), (rank_load[r] - rank_load[q]) / 2)
        if moved <= 0 or (q not in holders and moved * cost.token_s <= cost.replica_s):
            break
        if q in holders:
            target_slot = q * slots + int(np.nonzero(p2l[q * slots : q * slots + used[q]] == e)[0][0])
        else:
            target_slot = q * slots + used[q]
            p2l[target_slot] = e
            used[q] += 1
        share[slot] -= moved / load[e]
        share[target_slot] += moved / load[e]
        rank_load[r] -= moved
        rank_load[q] += moved
    return p2l, share
