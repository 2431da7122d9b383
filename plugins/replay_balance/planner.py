"""ReLibra's planners over exactly known loads, at its two timescales.

Per step (:func:`plan_step`): expert reordering (new home ranks) and step replicas in spare
slots, both from the loads of all of the step's micro-batches and both paid once per step.
Per micro-batch (:func:`plan_replication`): the best token split over the step's layout (free:
no weight moves) and further in-node replicas where they pay within the micro-batch.

Shapes: ``E`` logical experts, ``R = nodes * ranks_per_node`` ranks, ``S`` slots per rank
(``E // R`` home slots plus spare slots for replicas), ``M`` micro-batches in a step.
A *home* assignment is int [E]: the rank that owns each expert's weights and optimizer state.
A *layout* is physical_to_logical [R*S] (-1 = empty slot); a *placement* adds token_share [R*S]
for one layer and micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlweave.plugins.replay_balance.split import split_shares, water_fill
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
    intra_node_bytes_per_s / inter_node_bytes_per_s: per-rank link speed inside a node (NVLink)
        and across nodes; micro-batch replicas stay in a node, step replicas and reordering may
        cross nodes.
    """

    token_s: float = 2e-6
    expert_bytes: float = 3 * 4096 * 1408 * 2
    state_factor: float = 4.0
    intra_node_bytes_per_s: float = 300e9
    inter_node_bytes_per_s: float = 25e9


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


def transfer_s(src: np.ndarray, dst: np.ndarray, topology: ExpertTopology, cost: CostModel,
               state: bool = False, experts: np.ndarray | None = None) -> float:
    """Time to send one expert from each ``src`` rank to the matching ``dst`` rank, all at once:
    each rank's link carries its sends and its receives, at NVLink speed inside a node and the
    network's across nodes. ``state``: owner moves carry weights, gradients and optimizer state
    (``state_factor`` x the weights); a replica copy carries the weights alone. ``experts``: what
    each copy carries; copies of one expert into one node leave its sender once (a broadcast
    chain forwards them inside the node)."""
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    if src.size == 0:
        return 0.0
    rpn = topology.ranks_per_node
    nbytes = cost.expert_bytes * (cost.state_factor if state else 1.0)
    each = np.where(src // rpn == dst // rpn, nbytes / cost.intra_node_bytes_per_s, nbytes / cost.inter_node_bytes_per_s)
    first = np.ones(src.size, dtype=bool)
    if experts is not None:
        _, index = np.unique(np.stack([np.asarray(experts), dst // rpn]), axis=1, return_index=True)
        first[:] = False
        first[index] = True
    send = np.bincount(src[first], weights=each[first], minlength=topology.num_ranks)
    receive = np.bincount(dst, weights=each, minlength=topology.num_ranks)
    return float(max(send.max(), receive.max()))


def move_s(current: np.ndarray, home: np.ndarray, topology: ExpertTopology, cost: CostModel) -> float:
    """Time to move every expert whose home changes, with its gradients and optimizer state."""
    moved = np.nonzero(np.asarray(home) != np.asarray(current))[0]
    return transfer_s(np.asarray(current)[moved], np.asarray(home)[moved], topology, cost, state=True)


def copy_s(physical_to_logical: np.ndarray, base: np.ndarray, home: np.ndarray, topology: ExpertTopology,
           cost: CostModel) -> float:
    """Time to copy, from their owners (``home`` [E]), the replicas in ``physical_to_logical``
    [R*S] that ``base`` (a layout already in place) does not hold."""
    new = np.nonzero((physical_to_logical >= 0) & (physical_to_logical != base))[0]
    experts = physical_to_logical[new]
    return transfer_s(np.asarray(home)[experts], new // topology.slots_per_rank, topology, cost, experts=experts)


def reorder_search(step_load: np.ndarray, topology: ExpertTopology, current: np.ndarray) -> np.ndarray:
    """Home ranks [E] packed in two steps, like EPLB's hierarchy: experts to nodes (what in-node
    replication cannot even out), then to ranks inside their node. Heaviest expert first, each
    to the place with a free home slot that least raises the sum over micro-batches of the
    busiest node, then rank (ties: where it is now)."""
    per_rank = check_topology(topology)
    rpn = topology.ranks_per_node
    step_load = np.asarray(step_load, dtype=float)
    order = np.argsort(-step_load.sum(axis=0), kind="stable")  # heaviest experts first
    node = _pack(step_load, order, np.asarray(current) // rpn, np.full(topology.nodes, per_rank * rpn),
                 np.zeros(len(current), dtype=int), topology.nodes)
    return _pack(step_load, order, np.asarray(current), np.full(topology.num_ranks, per_rank), node, rpn)


def _pack(step_load: np.ndarray, order: np.ndarray, current: np.ndarray, free: np.ndarray,
          group: np.ndarray, width: int) -> np.ndarray:
    """Bins [E] for the experts in ``order``: expert e may go to bins ``group[e] * width ...
    + width`` with room in ``free`` [bins], the one least raising the sum over micro-batches of
    the fullest bin (ties: ``current[e]``)."""
    bin_load = np.zeros((step_load.shape[0], free.size))
    out = np.empty(len(order), dtype=int)
    for e in order:
        busiest = bin_load.max(axis=1, keepdims=True)
        objective = np.maximum(busiest, bin_load + step_load[:, e : e + 1]).sum(axis=0)
        allowed = np.zeros(free.size, dtype=bool)
        allowed[group[e] * width : (group[e] + 1) * width] = True
        objective[~allowed | (free == 0)] = np.inf
        objective[current[e]] -= 1e-9
        b = int(np.argmin(objective))
        out[e], free[b] = b, free[b] - 1
        bin_load[:, b] += step_load[:, e]
    return out


def step_max_sum(step_load: np.ndarray, home: np.ndarray, ranks: int) -> float:
    """Sum over micro-batches of the busiest rank's tokens under ``home``."""
    per_rank = np.zeros((step_load.shape[0], ranks))
    np.add.at(per_rank.T, home, step_load.T)
    return float(per_rank.max(axis=1).sum())


def grow_replicas(load: np.ndarray, layout: np.ndarray, home: np.ndarray, topology: ExpertTopology,
                  cost: CostModel, in_node: bool, target: float = 1.0, share: np.ndarray | None = None,
                  candidates: int = 0, copied_from: np.ndarray | None = None,
                  free_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Fill spare slots of ``layout`` [R*S] with replicas while they pay over the loads ``load``
    [M, E] (the step's micro-batches, or one micro-batch), each replica copied once from its
    owner (``home`` [E]). ``in_node`` keeps replicas in their owner's node (NVLink copies).

    Greedy: among the ``candidates`` experts (default 3 for a step, 1 for one micro-batch)
    serving most tokens on the busiest ranks (else each busiest rank's heaviest expert: a rank
    tied for busiest may hold none of their tokens), add the (expert, rank) replica whose
    water-filled split best lowers the busiest ranks, net of its copy time, even when that is
    negative: a replica that alone does not pay can with the next (two ranks near the peak each
    need one; relieving one alone lowers the peak only to the other). Stop when no replica
    relieves a busiest rank, after ``patience`` replicas without a new best, or at max/mean <=
    ``target`` everywhere. The
    replica sequence is then cut at its best prefix by modelled time (busiest-rank tokens +
    copies), so the result is never modelled slower than ``layout`` itself. When the greedy went
    past that prefix, a second pass from it adds only replicas that do not lengthen the copies
    (a link that has not yet carried as much as the busiest one): the path past the prefix may
    have spent the slots such a free replica needs.

    ``share`` [M, R*S]: the best split over ``layout`` when known. ``copied_from``: the layout
    already in place (default ``layout``): replicas of ``layout`` that it lacks count as copies.
    ``free_only``: only replicas that do not lengthen the copies. Returns (new layout [R*S], its
    best split [M, R*S]).
    """
    check_topology(topology)
    ranks, slots, rpn = topology.num_ranks, topology.slots_per_rank, topology.ranks_per_node
    load = np.asarray(load, dtype=float)
    candidates = candidates or (3 if len(load) > 1 else 1)
    home = np.asarray(home)
    p2l = np.asarray(layout).copy()
    used = (p2l.reshape(ranks, slots) >= 0).sum(axis=1)
    share, rank_load = split_shares(load, p2l, slots, start=share, sweeps=8 if share is None else 0)
    slot_load = load[:, np.maximum(p2l, 0)] * share  # [M, R*S] tokens each slot serves
    mean = load.sum(axis=1) / ranks
    copy_intra = cost.expert_bytes / cost.intra_node_bytes_per_s
    copy_inter = cost.expert_bytes / cost.inter_node_bytes_per_s
    send, receive = np.zeros(ranks), np.zeros(ranks)  # replica copies so far, per link
    sent = np.zeros((len(home), topology.nodes), dtype=bool)  # expert already sent into node (transfer_s)
    node_of = np.arange(ranks) // rpn
    each = np.where(node_of[:, None] == node_of[home][None], copy_intra, copy_inter)  # [R, E] one copy

    def copy(e: int, q: int) -> float:
        """Account one copy of expert e to rank q; returns the copies' time so far."""
        send[home[e]] += each[q, e] * (not sent[e, node_of[q]])
        receive[q] += each[q, e]
        sent[e, node_of[q]] = True
        return float(max(send.max(), receive.max()))

    base = np.asarray(layout if copied_from is None else copied_from)
    copy_now = 0.0
    for slot in np.nonzero((p2l >= 0) & (p2l != base))[0]:
        copy_now = copy(p2l[slot], slot // slots)
    added: list[int] = []  # slots filled, in order
    best_time, best_count = rank_load.max(axis=1).sum() * cost.token_s + copy_now, 0
    patience = 4
    while (np.any(used < slots) and np.any(rank_load.max(axis=1) > target * mean + 1e-9)
           and len(added) < best_count + patience):  # stop after replicas that did not pay
        peak = rank_load.max(axis=1)
        busiest = rank_load >= peak[:, None] * (1 - 1e-9)  # [M, R]
        patience = 4 + int(busiest.sum(axis=1).max())  # tied busiest ranks need a replica each
        on_busiest = (slot_load * np.repeat(busiest, slots, axis=1)).sum(axis=0)  # [R*S]
        served = np.bincount(np.maximum(p2l, 0), weights=on_busiest * (p2l >= 0), minlength=len(home))
        top = np.argsort(-served)[:candidates]
        top = top[served[top] > 0]
        m, r = np.nonzero(busiest)
        heaviest = p2l.reshape(ranks, slots)[r, slot_load.reshape(len(load), ranks, slots)[m, r].argmax(axis=1)]
        best = None
        for experts in (top, np.setdiff1d(heaviest[heaviest >= 0], top)):
            if best is None and experts.size:
                best = _best_replica(experts, p2l, used, slots, in_node, node_of, home, load, rank_load,
                                     slot_load, peak, busiest, each, send, receive, sent, copy_now, cost.token_s,
                                     free_only)
        if best is None:
            break
        e, q, x, mine = best
        slot = q * slots + used[q]
        used[q] += 1
        p2l[slot] = e
        cols = np.concatenate([mine, [slot]])
        rank_load[:, cols // slots] += x - np.concatenate([slot_load[:, mine], np.zeros((len(load), 1))], axis=1)
        slot_load[:, cols] = x
        copy_now = copy(e, q)
        added.append(slot)
        total = rank_load.max(axis=1).sum() * cost.token_s + copy_now
        if total < best_time - 1e-15:
            best_time, best_count = total, len(added)
    if not added:
        return p2l, share
    p2l[added[best_count:]] = -1
    # Warm start from the greedy's split, the dropped replicas' tokens handed back pro rata.
    slot_load[:, p2l < 0] = 0.0
    per_expert = np.zeros_like(load)
    np.add.at(per_expert.T, np.maximum(p2l, 0), slot_load.T)
    start = np.divide(slot_load, per_expert[:, np.maximum(p2l, 0)], out=np.zeros_like(slot_load),
                      where=per_expert[:, np.maximum(p2l, 0)] > 0)
    share = split_shares(load, p2l, slots, start=start)[0]
    if free_only or best_count == len(added):
        return p2l, share
    return grow_replicas(load, p2l, home, topology, cost, in_node, target, share, candidates, base, free_only=True)


def pinned_eplb(step_load: np.ndarray, home: np.ndarray, topology: ExpertTopology) -> np.ndarray:
    """EPLB's replicas with the owners kept home: the expert with the most load per copy gets
    the next copy until every spare slot is taken, then copies go heaviest first to the lightest
    rank with a free slot that lacks the expert. Returns a layout [R*S]. A step-tier candidate
    that fills every slot at once, where the replica-by-replica greedy would stop on a plateau."""
    ranks, slots = topology.num_ranks, topology.slots_per_rank
    weight = np.asarray(step_load, dtype=float).sum(axis=0) + 1e-9
    p2l = home_layout(home, topology)[0]
    used = (p2l.reshape(ranks, slots) >= 0).sum(axis=1)
    copies = np.ones(len(weight), dtype=int)
    for _ in range(int((slots - used).sum())):
        open_ = np.where(copies < ranks, weight / copies, -np.inf)
        copies[int(np.argmax(open_))] += 1
    rank_load = np.bincount(home, weights=weight / copies, minlength=ranks)
    holds = np.zeros((ranks, len(weight)), dtype=bool)
    holds[home, np.arange(len(weight))] = True
    extra = np.repeat(np.arange(len(weight)), copies - 1)
    for e in extra[np.argsort(-(weight / copies)[extra], kind="stable")]:
        fits = np.nonzero((used < slots) & ~holds[:, e])[0]
        if fits.size == 0:
            continue
        r = fits[np.argmin(rank_load[fits])]
        p2l[r * slots + used[r]] = e
        used[r] += 1
        holds[r, e] = True
        rank_load[r] += weight[e] / copies[e]
    return p2l


@dataclass(frozen=True)
class StepPlan:
    """One layer's plan for a whole step: ``home`` [E], the step ``layout`` [R*S] (home slots and
    step replicas), each micro-batch's placement ``physical_to_logical`` and ``token_share``
    [M, R*S] (the layout plus micro-batch replicas), and its modelled time ``time_s``."""

    home: np.ndarray
    layout: np.ndarray
    physical_to_logical: np.ndarray
    token_share: np.ndarray
    time_s: float


def _best_replica(experts: np.ndarray, p2l: np.ndarray, used: np.ndarray, slots: int, in_node: bool,
                  node_of: np.ndarray, home: np.ndarray, load: np.ndarray, rank_load: np.ndarray,
                  slot_load: np.ndarray, peak: np.ndarray, busiest: np.ndarray, each: np.ndarray,
                  send: np.ndarray, receive: np.ndarray, sent: np.ndarray, copy_now: float,
                  token_s: float, free_only: bool) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """Of the replicas of ``experts`` on free ranks that relieve a busiest rank, the one that
    pays best net of its copy time (even when none pays), all pairs evaluated at once: (expert,
    rank, tokens per slot of the expert's slots then the new one [M, h+1], those slots), or
    None when none relieves a busiest rank. Holder sets are padded to one width with a phantom
    rank of infinite load, which water-filling never fills. ``each`` [R, E]: one copy's time to
    a rank. ``free_only``: only replicas that do not lengthen the copies (``copy_now``)."""
    ranks = len(used)
    mine = [np.nonzero(p2l == e)[0] for e in experts]
    width = max((len(m) for m in mine), default=0)
    pairs = []  # (candidate index, free rank)
    for i, e in enumerate(experts):
        ok = used < slots
        ok[mine[i] // slots] = False
        if in_node:
            ok &= node_of == node_of[home[e]]
        pairs += [(i, q) for q in np.nonzero(ok)[0]]
    which, free = np.array(pairs, dtype=int).reshape(-1, 2).T
    owner = home[experts[which]]
    one = each[free, experts[which]]
    copy = np.maximum(copy_now, np.maximum(send[owner] + ~sent[experts[which], node_of[free]] * one,
                                           receive[free] + one))
    if free_only:
        keep = copy <= copy_now + 1e-12
        which, free, copy = which[keep], free[keep], copy[keep]
    if not which.size:
        return None
    held = np.full((len(experts), width), ranks)  # phantom rank
    held_slots = np.full((len(experts), width), p2l.size)  # phantom slot
    for i, m in enumerate(mine):
        held[i, : len(m)], held_slots[i, : len(m)] = m // slots, m
    group = np.concatenate([held[which], free[:, None]], axis=1)  # [P, width + 1]
    loads = np.concatenate([rank_load, np.full((len(load), 1), np.inf)], axis=1)
    served = np.concatenate([slot_load, np.zeros((len(load), 1))], axis=1)
    base = loads[:, group].transpose(1, 0, 2)  # [P, M, width + 1]
    base[:, :, :-1] -= served[:, held_slots[which]].transpose(1, 0, 2)
    x = water_fill(base, load[:, experts[which]].T)
    after = np.where(np.isinf(base), -np.inf, base + x).max(axis=2)  # [P, M]
    holders = np.zeros((len(which), ranks + 1), dtype=bool)
    holders[np.arange(len(which))[:, None], held[which]] = True
    relieved = (busiest[None] & holders[:, None, :ranks]).any(axis=2)  # [P, M]: a holder is busiest
    in_group = holders
    in_group[np.arange(len(which)), free] = True
    # The busiest rank outside the group, ignoring the other busiest ones (optimistic: later
    # replicas may relieve those; the best-prefix cut in grow_replicas keeps only what paid).
    others = np.where(in_group[:, None, :ranks] | busiest[None], -np.inf, rank_load[None]).max(axis=2)
    relief = ((peak[None] - np.maximum(after, others)).clip(min=0) * relieved).sum(axis=1)
    if not np.any(relief):
        return None
    p = int(np.argmax(np.where(relief > 0, relief * token_s - (copy - copy_now), -np.inf)))
    i = which[p]
    real = np.r_[np.arange(len(mine[i])), width]
    return int(experts[i]), int(free[p]), x[p][:, real], mine[i]


def plan_step(step_load: np.ndarray, topology: ExpertTopology, current: np.ndarray,
              cost: CostModel = CostModel(), target: float = 1.02) -> StepPlan:
    """Both tiers for one layer's step, from the loads of all of its micro-batches.

    Step tier: home ranks (reordered) and step replicas in spare slots, paid once per step
    (weights do not change between a step's micro-batches), their token shares re-split per
    micro-batch for free. Micro-batch tier: :func:`plan_replication` on each micro-batch, as
    the micro-batch hook will run it. Candidates (current or reordered homes; no step replicas,
    which leaves the spare slots to micro-batch replicas, better when hot experts shift every
    micro-batch; greedy step replicas; or EPLB's replicas around the homes, :func:`pinned_eplb`)
    are compared by modelled time: busiest-rank tokens, moves and copies.

    step_load: [M, E]; current: int [E] current home ranks.
    """
    step_load = np.asarray(step_load, dtype=float)
    slots = topology.slots_per_rank
    plans = []
    floor = step_load.sum() / topology.num_ranks * cost.token_s  # every micro-batch perfectly balanced
    for home in (np.asarray(current), reorder_search(step_load, topology, current)):
        if plans and not _reorder_may_pay(step_load, topology, current, home, cost,
                                          min(p.time_s for p in plans) - floor):
            continue
        homes = home_layout(home, topology)[0]
        moving = move_s(current, home, topology, cost)
        layouts = [grow_replicas(step_load, homes, home, topology, cost, in_node=False)[0],
                   pinned_eplb(step_load, home, topology), homes]
        for layout in layouts:
            if any(np.array_equal(layout, q.layout) and np.array_equal(home, q.home) for q in plans):
                continue  # the greedy or EPLB added no replica
            # Micro-batch replicas stay in their node: with none kept for the step, no micro-batch
            # beats its busiest node spread evenly. Skip the layout when even that is too slow.
            if (plans and layout is homes and moving + step_max_sum(step_load, home // topology.ranks_per_node,
                                                                    topology.nodes)
                    / topology.ranks_per_node * cost.token_s >= min(p.time_s for p in plans)):
                continue
            placed = [plan_replication(step_load[m], layout, topology, cost, target) for m in range(len(step_load))]
            p2l = np.stack([p for p, _ in placed])
            shares = np.stack([q for _, q in placed])
            served = np.where(p2l >= 0, np.take_along_axis(step_load, np.maximum(p2l, 0), axis=1), 0.0) * shares
            busiest = served.reshape(len(step_load), topology.num_ranks, slots).sum(axis=2).max(axis=1)
            time_s = (busiest.sum() * cost.token_s + moving
                      + copy_s(layout, homes, home, topology, cost)
                      + sum(copy_s(p, layout, home, topology, cost) for p in p2l))
            plans.append(StepPlan(home, layout, p2l, shares, float(time_s)))
    return min(plans, key=lambda p: (p.time_s, int(np.count_nonzero(p.home != current)), int(np.sum(p.layout >= 0))))


def _reorder_may_pay(step_load: np.ndarray, topology: ExpertTopology, current: np.ndarray, home: np.ndarray,
                     cost: CostModel, headroom_s: float) -> bool:
    """Whether moving from ``current`` to ``home`` could pay: what it saves on the busiest rank,
    or on the busiest node spread over its ranks (what in-node replicas reach), and what is left
    above perfect balance (``headroom_s``), both beat the move."""
    rpn = topology.ranks_per_node
    saved = max(step_max_sum(step_load, current, topology.num_ranks) - step_max_sum(step_load, home, topology.num_ranks),
                (step_max_sum(step_load, current // rpn, topology.nodes)
                 - step_max_sum(step_load, home // rpn, topology.nodes)) / rpn)
    return min(saved * cost.token_s, headroom_s) > move_s(current, home, topology, cost)


def plan_replication(load: np.ndarray, layout: np.ndarray, topology: ExpertTopology,
                     cost: CostModel = CostModel(), target: float = 1.02,
                     share: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batch tier (per micro-batch and layer): the best split of this micro-batch's tokens
    over ``layout`` [R*S] (home slots plus the step's replicas: free), plus in-node replicas of
    hot experts in the spare slots left, each copied for this micro-batch only, while they pay
    and max/mean rank load > ``target``.

    load: [E] tokens per expert in this micro-batch; share: [1, R*S] the best split over
    ``layout`` when known. Returns (physical_to_logical [R*S], token_share [R*S]); each
    expert's shares sum to 1.
    """
    layout = np.asarray(layout)
    p2l, share = grow_replicas(np.asarray(load, dtype=float)[None], layout, home_of(layout, topology), topology,
                               cost, in_node=True, target=target, share=share)
    return p2l, share[0]
