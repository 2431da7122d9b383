"""The fused schedule search: FlexFusion's problem, solved on a laptop-class CPU.

FlexFusion runs simulated annealing over adjacent swaps on hundreds of MPI workers. Here one
process gets there (and closer to the lower bound) by searching over *priority lists* decoded
with insertion and compacted by forward–backward improvement (:mod:`.justify`):

1. **Makespan.** Start from the greedy list schedule and separate 1F1B, each justified. Then
   iterated local search: perturb the incumbent's start times with uniform noise of a random
   width (half to four task lengths), decode that order, justify it, and keep the result if it
   is no longer than the incumbent (equal ones too, to walk plateaus). Stop at the lower bound.
With a memory cap (the most micro-batch activations of both models resident together on a
GPU), a candidate is first judged by how far it exceeds the cap, then by its makespan: the
search walks down from separate 1F1B's memory towards the cap, and shortens within it.

2. **Memory.** At the best makespan, lower the activation peaks: start from the better of the
   incumbent and its as-late-as-possible twin (forwards pushed towards their backwards), then,
   swap a forward with the next task of another kind on its GPU, and now and then move the
   forward that first reaches a GPU's peak to just after that model's next backward there;
   keep a change when the makespan stays and neither the peaks nor the resident-activation
   area grow; stop when nothing has improved for a while.

The budget is *work*, not wall-clock time: ``seconds`` buys ``seconds * TASKS_PER_SECOND`` task
placements (decoded or simulated), calibrated so that a unit takes about a second on the
2-core machine rlweave is developed on. The same problem, seed and budget give the same
schedule on any machine, however loaded; the seconds actually spent are reported.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from rlweave.plugins.stage_fusion.baselines import greedy, separate_1f1b
from rlweave.plugins.stage_fusion.bounds import LowerBound, lower_bound
from rlweave.plugins.stage_fusion.justify import EPS, TaskGraph
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, ProblemError
from rlweave.plugins.stage_fusion.schedule import Evaluator, FusedPipelineSchedule, Order

TASKS_PER_SECOND = 400_000  # task placements per second here (decode ~ simulation)
MEMORY_SHARE = 0.25  # of the budget, for the memory phase (more if the makespan phase stops early)
NOISE_WIDTHS = (0.5, 1.0, 2.0, 4.0)  # perturbation widths, in longest-task lengths


@dataclass(frozen=True)
class SearchResult:
    schedule: FusedPipelineSchedule
    makespan: float
    peak_memory: np.ndarray  # [gpus, 2]: resident micro-batch activations (actor, critic)
    lower_bound: LowerBound
    separate_1f1b: float
    greedy: float
    seconds: float
    memory_cap: int | None = None
    resident_peak: int = 0  # the most activations of both models together on one GPU
    separate_1f1b_resident_peak: int = 0

    def to_json(self) -> dict[str, object]:
        """The fields of ``rlweave fusion schedule --json``."""
        return {"makespan": self.makespan, "lower_bound": self.lower_bound.value,
                "separate_1f1b": self.separate_1f1b, "greedy": self.greedy,
                "peak_memory": self.peak_memory.tolist(), "resident_peak": self.resident_peak,
                "separate_1f1b_resident_peak": self.separate_1f1b_resident_peak,
                "memory_cap": self.memory_cap, "seconds": round(self.seconds, 3),
                "schedule": self.schedule.to_json()}


class _Budget:
    def __init__(self, units: float) -> None:
        self.left = units

    def spend(self, units: int) -> bool:
        self.left -= units
        return self.left > 0


def search(problem: FusedPipelineProblem, seconds: float = 10.0, seed: int = 0,
           memory_cap: int | None = None) -> SearchResult:
    """The best fused schedule found within the budget (see the module docstring), holding at
    most ``memory_cap`` activations on any GPU; :class:`ProblemError` if none was found."""
    t0 = time.perf_counter()
    if memory_cap is not None and (isinstance(memory_cap, bool) or not isinstance(memory_cap, int) or memory_cap < 1):
        raise ProblemError(f"the memory cap (--memory-cap) must be a positive number of micro-batch activations, "
                           f"got {memory_cap!r}.")
    graph, evaluator, bound = TaskGraph(problem), Evaluator(problem), lower_bound(problem)
    excess = _Excess(graph, memory_cap)
    baselines = {"separate_1f1b": separate_1f1b(problem), "greedy": greedy(problem)}
    makespans = {name: evaluator.makespan(orders) for name, orders in baselines.items()}
    budget = _Budget(seconds * TASKS_PER_SECOND)
    memory_units = seconds * TASKS_PER_SECOND * MEMORY_SHARE
    raw = [graph.starts(o) for o in baselines.values()]  # as they are, too: justifying adds memory
    candidates = [graph.justify(start) for start in raw] + [(graph.makespan(start), start) for start in raw]
    best_makespan, best_start = min(candidates, key=lambda r: (excess.of_start(r[1]), r[0]))
    budget.spend(4 * graph.n)
    rng = random.Random(seed)
    best_makespan, best_start = _shorten(graph, bound.value, best_makespan, best_start, rng,
                                         budget, budget.left - memory_units, excess)
    orders = _renumber(evaluator, _lower_memory(graph, evaluator, best_makespan, best_start, rng, budget, excess))
    schedule = evaluator.expand(orders)
    makespan = evaluator.makespan(orders)
    assert makespan is not None and makespan <= best_makespan + EPS
    peak, separate_peak = (int(evaluator.resident_peak(o).max()) for o in (orders, baselines["separate_1f1b"]))
    if memory_cap is not None and peak > memory_cap:
        raise ProblemError(f"no fused schedule holding at most {memory_cap} micro-batch activations on a GPU was "
                           f"found: the best holds {peak} (separate 1F1B holds {separate_peak}). Raise --memory-cap, "
                           f"or give the search more --seconds.")
    return SearchResult(schedule, makespan, evaluator.peak_memory(orders), bound,
                        makespans["separate_1f1b"], makespans["greedy"], time.perf_counter() - t0,
                        memory_cap, peak, separate_peak)


class _Excess:
    """How far a schedule's most resident activations on a GPU exceed the cap (0 without one)."""

    def __init__(self, graph: TaskGraph, cap: int | None) -> None:
        self.graph, self.cap = graph, cap

    def of_orders(self, orders: list[Order]) -> int:
        return 0 if self.cap is None else max(0, int(Evaluator.resident_peak(orders).max()) - self.cap)

    def of_start(self, start: list[float]) -> int:
        return 0 if self.cap is None else self.of_orders(self.graph.orders(start))


def _shorten(graph: TaskGraph, bound: float, makespan: float, start: list[float],
             rng: random.Random, budget: _Budget, keep: float, excess: _Excess) -> tuple[float, list[float]]:
    """Phase 1: iterated perturb–decode–justify until the bound (within the cap) or until
    ``keep`` units are left; a candidate is judged by its excess over the cap, then its makespan."""
    widest = max(graph.duration)
    over = excess.of_start(start)
    while (makespan > bound + EPS or over) and budget.left > keep:
        budget.spend(3 * graph.n)  # one decode, one backward and one forward pass at least
        width = rng.choice(NOISE_WIDTHS) * widest
        noisy = [s + rng.random() * width for s in start]
        order = graph.topological(sorted(range(graph.n), key=noisy.__getitem__))
        candidate, candidate_start = graph.justify(graph.decode(order))
        candidate_over = excess.of_start(candidate_start)
        if candidate_over and excess.cap is not None:  # decode it within the cap instead
            capped = graph.decode_capped(order, excess.cap)
            if capped is None:
                continue
            candidate, candidate_start, candidate_over = graph.makespan(capped), capped, excess.of_start(capped)
        if candidate_over < over or (candidate_over == over and candidate <= makespan + EPS):
            makespan, start, over = candidate, candidate_start, candidate_over
    return makespan, start


def _lower_memory(graph: TaskGraph, evaluator: Evaluator, makespan: float, start: list[float],
                  rng: random.Random, budget: _Budget, excess: _Excess) -> list[Order]:
    """Phase 2: the lowest-memory orders found that keep ``makespan``."""
    late = graph.decode(sorted(range(graph.n), key=lambda t: -start[t] - graph.duration[t]),
                        forward=False, horizon=makespan)
    budget.spend(graph.n)
    valid = [o for o in (graph.orders(start), graph.orders(late))
             if (evaluator.makespan(o) or np.inf) <= makespan + EPS]
    orders = min(valid, key=lambda o: (excess.of_orders(o), *_memory_key(evaluator, o)))
    key = (excess.of_orders(orders), *_memory_key(evaluator, orders))
    peaks = [(g, j) for g in range(graph.gpus) for j in (0, 1)]
    stale, patience = 0, 40 * graph.gpus
    while stale < patience and budget.left > 0:
        if stale % (4 * graph.gpus) == 0:  # now and then, try to lower each peak directly
            g, j = peaks[rng.randrange(len(peaks))]
            moved = _delay_peak_forward(orders[g], j)
            trial = None if moved is None else orders[:g] + [moved] + orders[g + 1:]
        else:  # otherwise a forward swaps with the next task of another kind on its GPU
            g = rng.randrange(graph.gpus)
            p = rng.randrange(len(orders[g]) - 1)
            (kind, _), (other, _) = orders[g][p], orders[g][p + 1]
            trial = None
            if not kind & 1 and kind != other:
                moved = orders[g][:]
                moved[p], moved[p + 1] = moved[p + 1], moved[p]
                trial = orders[:g] + [moved] + orders[g + 1:]
        stale += 1
        if trial is None:
            continue
        budget.spend(graph.n)
        candidate = (excess.of_orders(trial), *_memory_key(evaluator, trial))
        if candidate <= key and (evaluator.makespan(trial) or np.inf) <= makespan + EPS:
            stale = 0 if candidate < key else stale
            orders, key = trial, candidate
    return orders


def _delay_peak_forward(order: Order, model: int) -> Order | None:
    """``order`` with the forward of ``model`` that first reaches its peak moved to just after
    that model's next backward (one activation fewer resident there), micro-batches renumbered
    in order of appearance; ``None`` if there is no such backward."""
    live, peak, at = 0, 0, -1
    for p, (kind, _) in enumerate(order):
        if kind >> 1 == model:
            live += -1 if kind & 1 else 1
            if live > peak:
                peak, at = live, p
    after = next((q for q in range(at + 1, len(order)) if order[q][0] == 2 * model + 1), None)
    if after is None:
        return None
    kinds = [kind for kind, _ in order]
    kinds.insert(after, kinds.pop(at))
    seen = [0, 0, 0, 0]
    renumbered = []
    for kind in kinds:
        renumbered.append((kind, seen[kind]))
        seen[kind] += 1
    return renumbered


def _memory_key(evaluator: Evaluator, orders: list[Order]) -> tuple[int, int]:
    """(sum of per-GPU, per-model peaks, resident-activation area over positions)."""
    area = 0
    for order in orders:
        live = [0, 0]
        for kind, _ in order:
            live[kind >> 1] += -1 if kind & 1 else 1
            area += live[0] + live[1]
    return int(evaluator.peak_memory(orders).sum()), area


def _renumber(evaluator: Evaluator, orders: list[Order]) -> list[Order]:
    """The same schedule with each pipeline's micro-batches numbered in the order their
    forwards start on its first stage (micro-batches are interchangeable; this only reads
    better)."""
    problem = evaluator.problem
    firsts = [(0, 0)] + [(2, (r + 1) * problem.critic_pp - 1) for r in range(problem.replicas)]
    rename: dict[tuple[int, int], dict[int, int]] = {}  # (model, pipeline's first GPU) -> map
    for kind, first in firsts:
        forwards = [k for kind_, k in orders[first] if kind_ == kind]
        rename[kind >> 1, first] = {old: new for new, old in enumerate(forwards)}
    result = []
    for g, order in enumerate(orders):
        first = {0: 0, 1: (problem.critic_replica(g) + 1) * problem.critic_pp - 1}
        result.append([(kind, rename[kind >> 1, first[kind >> 1]][k]) for kind, k in order])
    return result
