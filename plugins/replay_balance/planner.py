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

from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class ReplicaSearch:
    """How :func:`grow_replicas` searches. ``in_node``: replicas stay in their owner's node
    (NVLink copies); ``target``: stop at max/mean <= ``target`` everywhere; ``candidates``:
    experts tried per replica (0: 3 for a step, 1 for one micro-batch); ``free_only``: only
    replicas that do not lengthen the copies; ``share`` [M, R*S]: the best split over the layout
    when known; ``copied_from``: the layout already in place (default: the layout grown), whose
    missing replicas count as copies."""

    in_node: bool
    target: float = 1.0
    candidates: int = 0
    free_only: bool = False
    share: np.ndarray | None = None
    copied_from: np.ndarray | None = None


def grow_replicas(load: np.ndarray, layout: np.ndarray, home: np.ndarray, topology: ExpertTopology,
                  cost: CostModel, search: ReplicaSearch) -> tuple[np.ndarray, np.ndarray]:
    """Fill spare slots of ``layout`` [R*S] with replicas while they pay over the loads ``load``
    [M, E] (the step's micro-batches, or one micro-batch), each replica copied once from its
    owner (``home`` [E]); ``search`` says how (:class:`ReplicaSearch`).

    Greedy: among the ``candidates`` experts serving most tokens on the busiest ranks (else each
    busiest rank's heaviest expert: a rank tied for busiest may hold none of their tokens), add
    the (expert, rank) replica whose water-filled split best lowers the busiest ranks, net of its
    copy time, even when that is negative: a replica that alone does not pay can with the next
    (two ranks near the peak each need one; relieving one alone lowers the peak only to the
    other). Stop when no replica relieves a busiest rank, after ``patience`` replicas without a
    new best, or at max/mean <= ``target`` everywhere. The replica sequence is then cut at its
    best prefix by modelled time (busiest-rank tokens + copies), so the result is never modelled
    slower than ``layout`` itself. When the greedy went past that prefix, a second pass from it
    adds only replicas that do not lengthen the copies (a link that has not yet carried as much
    as the busiest one): the path past the prefix may have spent the slots such a free replica
    needs. Returns (new layout [R*S], its best split [M, R*S]).
    """
    check_topology(topology)
    g = _Growth(np.asarray(load, dtype=float), layout, np.asarray(home), topology, cost, search)
    best_time, best_count = g.modelled_s(), 0
    while g.may_grow() and len(g.added) < best_count + g.patience:  # stop after replicas that did not pay
        best = g.next_replica()
        if best is None:
            break
        g.add(*best)
        if g.modelled_s() < best_time - 1e-15:
            best_time, best_count = g.modelled_s(), len(g.added)
    if not g.added:
        return g.p2l, g.share
    p2l, share = g.cut(best_count)
    if search.free_only or best_count == len(g.added):
        return p2l, share
    return grow_replicas(load, p2l, home, topology, cost,
                         replace(search, share=share, copied_from=g.base, free_only=True))


class _Copies:
    """Replica copies so far, per link: one copy of expert ``e`` to rank ``q`` takes ``each[q, e]``
    (NVLink in a node, the fabric across); an expert already sent into a node is not sent from
    its owner again (as :func:`transfer_s` counts). ``now``: the copies' time, the busiest link's."""

    def __init__(self, home: np.ndarray, topology: ExpertTopology, cost: CostModel) -> None:
        ranks = topology.num_ranks
        self.home = home
        self.node_of = np.arange(ranks) // topology.ranks_per_node
        intra, inter = cost.expert_bytes / cost.intra_node_bytes_per_s, cost.expert_bytes / cost.inter_node_bytes_per_s
        self.each = np.where(self.node_of[:, None] == self.node_of[home][None], intra, inter)  # [R, E]
        self.send, self.receive = np.zeros(ranks), np.zeros(ranks)
        self.sent = np.zeros((len(home), topology.nodes), dtype=bool)
        self.now = 0.0

    def add(self, e: int, q: int) -> None:
        self.send[self.home[e]] += self.each[q, e] * (not self.sent[e, self.node_of[q]])
        self.receive[q] += self.each[q, e]
        self.sent[e, self.node_of[q]] = True
        self.now = float(max(self.send.max(), self.receive.max()))

    def with_one(self, experts: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """The copies' time with one more copy of ``experts[i]`` to ``ranks[i]``, each alone."""
        one = self.each[ranks, experts]
        sending = self.send[self.home[experts]] + ~self.sent[experts, self.node_of[ranks]] * one
        return np.maximum(self.now, np.maximum(sending, self.receive[ranks] + one))


class _Growth:
    """The greedy's state over one layout: ``p2l`` [R*S] and the slots ``used`` per rank, the
    split ``share`` and the tokens each slot serves ``slot_load`` [M, R*S], each rank's
    ``rank_load`` [M, R], the copies, and the slots ``added`` in order."""

    def __init__(self, load: np.ndarray, layout: np.ndarray, home: np.ndarray, topology: ExpertTopology,
                 cost: CostModel, search: ReplicaSearch) -> None:
        self.load, self.home, self.cost, self.search = load, home, cost, search
        self.ranks, self.slots = topology.num_ranks, topology.slots_per_rank
        self.candidates = search.candidates or (3 if len(load) > 1 else 1)
        self.p2l = np.asarray(layout).copy()
        self.used = (self.p2l.reshape(self.ranks, self.slots) >= 0).sum(axis=1)
        self.share, self.rank_load = split_shares(load, self.p2l, self.slots, start=search.share,
                                                  sweeps=8 if search.share is None else 0)
        self.slot_load = load[:, np.maximum(self.p2l, 0)] * self.share
        self.mean = load.sum(axis=1) / self.ranks
        self.copies = _Copies(home, topology, cost)
        self.base = np.asarray(layout if search.copied_from is None else search.copied_from)
        for slot in np.nonzero((self.p2l >= 0) & (self.p2l != self.base))[0]:
            self.copies.add(self.p2l[slot], slot // self.slots)
        self.added: list[int] = []
        self.patience = 4

    def modelled_s(self) -> float:
        """Busiest-rank tokens and the copies."""
        return self.rank_load.max(axis=1).sum() * self.cost.token_s + self.copies.now

    def may_grow(self) -> bool:
        """A slot is free and some micro-batch is above target."""
        return bool(np.any(self.used < self.slots)
                    and np.any(self.rank_load.max(axis=1) > self.search.target * self.mean + 1e-9))

    def next_replica(self) -> tuple[int, int, np.ndarray, np.ndarray] | None:
        """The best replica of the top candidates, else of the busiest ranks' heaviest experts."""
        peak = self.rank_load.max(axis=1)
        busiest = self.rank_load >= peak[:, None] * (1 - 1e-9)  # [M, R]
        self.patience = 4 + int(busiest.sum(axis=1).max())  # tied busiest ranks need a replica each
        on_busiest = (self.slot_load * np.repeat(busiest, self.slots, axis=1)).sum(axis=0)  # [R*S]
        served = np.bincount(np.maximum(self.p2l, 0), weights=on_busiest * (self.p2l >= 0), minlength=len(self.home))
        top = np.argsort(-served)[:self.candidates]
        top = top[served[top] > 0]
        m, r = np.nonzero(busiest)
        per_slot = self.slot_load.reshape(len(self.load), self.ranks, self.slots)[m, r]
        heaviest = self.p2l.reshape(self.ranks, self.slots)[r, per_slot.argmax(axis=1)]
        for experts in (top, np.setdiff1d(heaviest[heaviest >= 0], top)):
            if experts.size and (best := _best_replica(self, experts, peak, busiest)) is not None:
                return best
        return None

    def add(self, e: int, q: int, x: np.ndarray, mine: np.ndarray) -> None:
        """Expert ``e``'s replica on rank ``q``; ``x`` [M, h+1]: the tokens of its slots
        ``mine`` and then the new one."""
        slot = q * self.slots + self.used[q]
        self.used[q] += 1
        self.p2l[slot] = e
        cols = np.concatenate([mine, [slot]])
        served = np.concatenate([self.slot_load[:, mine], np.zeros((len(self.load), 1))], axis=1)
        self.rank_load[:, cols // self.slots] += x - served
        self.slot_load[:, cols] = x
        self.copies.add(e, q)
        self.added.append(slot)

    def cut(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The layout with the first ``count`` replicas added, and its best split, warm-started
        from the greedy's with the dropped replicas' tokens handed back pro rata."""
        p2l, slot_load = self.p2l, self.slot_load
        p2l[self.added[count:]] = -1
        slot_load[:, p2l < 0] = 0.0
        per_expert = np.zeros_like(self.load)
        np.add.at(per_expert.T, np.maximum(p2l, 0), slot_load.T)
        start = np.divide(slot_load, per_expert[:, np.maximum(p2l, 0)], out=np.zeros_like(slot_load),
                          where=per_expert[:, np.maximum(p2l, 0)] > 0)
        return p2l, split_shares(self.load, p2l, self.slots, start=start)[0]


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


def _best_replica(g: _Growth, experts: np.ndarray, peak: np.ndarray, busiest: np.ndarray
                  ) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """Of the replicas of ``experts`` on free ranks that relieve a busiest rank (``busiest``
    [M, R], at ``peak`` [M]), the one that pays best net of its copy time (even when none pays),
    all pairs evaluated at once: (expert, rank, tokens per slot of the expert's slots then the
    new one [M, h+1], those slots), or None when none relieves a busiest rank."""
    mine = [np.nonzero(g.p2l == e)[0] for e in experts]
    which, free = _replica_pairs(g, experts, mine)
    copy = g.copies.with_one(experts[which], free)
    if g.search.free_only:
        keep = copy <= g.copies.now + 1e-12
        which, free, copy = which[keep], free[keep], copy[keep]
    if not which.size:
        return None
    x, relief = _relief(g, experts, mine, which, free, peak, busiest)
    if not np.any(relief):
        return None
    p = int(np.argmax(np.where(relief > 0, relief * g.cost.token_s - (copy - g.copies.now), -np.inf)))
    i = which[p]
    real = np.r_[np.arange(len(mine[i])), x.shape[2] - 1]
    return int(experts[i]), int(free[p]), x[p][:, real], mine[i]


def _replica_pairs(g: _Growth, experts: np.ndarray, mine: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every (index into ``experts``, rank) with a free slot that lacks the expert (in its
    owner's node where the search keeps replicas there)."""
    pairs = []
    for i, e in enumerate(experts):
        ok = g.used < g.slots
        ok[mine[i] // g.slots] = False
        if g.search.in_node:
            ok &= g.copies.node_of == g.copies.node_of[g.home[e]]
        pairs += [(i, q) for q in np.nonzero(ok)[0]]
    which, free = np.array(pairs, dtype=int).reshape(-1, 2).T
    return which, free


def _relief(g: _Growth, experts: np.ndarray, mine: list[np.ndarray], which: np.ndarray, free: np.ndarray,
            peak: np.ndarray, busiest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's water-filled split over its expert's holders and the new rank (``x`` [P, M,
    width + 1]) and the busiest-rank tokens it takes off ([P]). Holder sets are padded to one
    width with a phantom rank of infinite load, which water-filling never fills."""
    ranks, m = g.ranks, len(g.load)
    width = max((len(s) for s in mine), default=0)
    held = np.full((len(experts), width), ranks)  # phantom rank
    held_slots = np.full((len(experts), width), g.p2l.size)  # phantom slot
    for i, s in enumerate(mine):
        held[i, : len(s)], held_slots[i, : len(s)] = s // g.slots, s
    group = np.concatenate([held[which], free[:, None]], axis=1)  # [P, width + 1]
    loads = np.concatenate([g.rank_load, np.full((m, 1), np.inf)], axis=1)
    served = np.concatenate([g.slot_load, np.zeros((m, 1))], axis=1)
    base = loads[:, group].transpose(1, 0, 2)  # [P, M, width + 1]
    base[:, :, :-1] -= served[:, held_slots[which]].transpose(1, 0, 2)
    x = water_fill(base, g.load[:, experts[which]].T)
    after = np.where(np.isinf(base), -np.inf, base + x).max(axis=2)  # [P, M]
    holders = np.zeros((len(which), ranks + 1), dtype=bool)
    holders[np.arange(len(which))[:, None], held[which]] = True
    relieved = (busiest[None] & holders[:, None, :ranks]).any(axis=2)  # [P, M]: a holder is busiest
    holders[np.arange(len(which)), free] = True  # now the whole group
    # The busiest rank outside the group, ignoring the other busiest ones (optimistic: later
    # replicas may relieve those; the best-prefix cut in grow_replicas keeps only what paid).
    others = np.where(holders[:, None, :ranks] | busiest[None], -np.inf, g.rank_load[None]).max(axis=2)
    return x, ((peak[None] - np.maximum(after, others)).clip(min=0) * relieved).sum(axis=1)


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
        layouts = [grow_replicas(step_load, homes, home, topology, cost, ReplicaSearch(in_node=False))[0],
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
    search = ReplicaSearch(in_node=True, target=target, share=share)
    p2l, share = grow_replicas(np.asarray(load, dtype=float)[None], layout, home_of(layout, topology), topology,
                               cost, search)
    return p2l, share[0]
