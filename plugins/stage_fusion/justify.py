"""Serial schedule generation with insertion, and forward–backward improvement (justification).

The search does not move tasks one swap at a time: it decodes a *priority list* (every task,
each after the task its micro-batch needs first) into a schedule by the serial schedule
generation scheme: take the tasks in list order and put each at the earliest idle gap of its
GPU, after its predecessor has ended, that is long enough. Gaps left earlier are filled later,
which an append-only list schedule cannot do.

Forward–backward improvement (Tormos & Lova; Valls et al., "Justification and RCPSP",
EJOR 2005) then alternates two decodings: *backward*, the tasks by decreasing end time, each
as late as possible before the makespan (the time-mirrored problem, whose pipelines run the
other way); *forward*, the tasks by the backward schedule's start times, each as early as
possible. Each pass compacts the schedule; it stops when the makespan no longer drops. Both
passes cost ``O(tasks * gaps per GPU)``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
from rlweave.plugins.stage_fusion.schedule import Evaluator, Order

EPS = 1e-9


class TaskGraph:
    """Every task as an integer: its GPU, duration, and the task of the same micro-batch just
    before (``pred``) and after (``succ``) it, -1 for none."""

    def __init__(self, problem: FusedPipelineProblem) -> None:
        ev = Evaluator(problem)
        self.evaluator = ev
        counts = (problem.actor_mb, problem.actor_mb, problem.critic_mb, problem.critic_mb)
        self.index: dict[tuple[int, int, int], int] = {}
        self.key: list[tuple[int, int, int]] = []  # (gpu, kind, local micro-batch)
        for g in range(problem.gpus):
            for kind in range(4):
                for k in range(counts[kind]):
                    self.index[g, kind, k] = len(self.key)
                    self.key.append((g, kind, k))
        self.n = len(self.key)
        self.gpus = problem.gpus
        self.gpu = [g for g, _, _ in self.key]
        self.duration = [ev.duration[g][kind] for g, kind, _ in self.key]
        self.pred = [-1] * self.n
        self.succ = [-1] * self.n
        for t, (g, kind, k) in enumerate(self.key):
            j = kind >> 1
            if kind & 1:
                pg = ev.bwd_pred[j][g]
                q = self.index[pg, kind, k] if pg >= 0 else self.index[g, kind - 1, k]
            else:
                pg = ev.fwd_pred[j][g]
                q = self.index[pg, kind, k] if pg >= 0 else -1
            self.pred[t] = q
            if q >= 0:
                self.succ[q] = t

    def decode(self, priority: Sequence[int], forward: bool = True, horizon: float = 0.0) -> list[float]:
        """Start times from a priority list (predecessors first; for ``forward=False``,
        successors first, placed as late as possible so that all end by ``horizon``)."""
        starts: list[list[float]] = [[] for _ in range(self.gpus)]
        ends: list[list[float]] = [[] for _ in range(self.gpus)]
        start = [0.0] * self.n
        link, duration, gpu = (self.pred if forward else self.succ), self.duration, self.gpu
        for t in priority:
            d, q = duration[t], link[t]
            if forward:  # earliest: after the predecessor's end
                ready = start[q] + duration[q] if q >= 0 else 0.0
            else:  # mirrored time (horizon - end): before the successor's start
                ready = horizon - start[q] if q >= 0 else 0.0
            s, e = starts[gpu[t]], ends[gpu[t]]
            i = bisect.bisect_left(e, ready + EPS)
            while True:  # the first gap at or after `ready` that is long enough
                lo = e[i - 1] if i and e[i - 1] > ready else ready
                if i == len(s) or s[i] - lo >= d - EPS:
                    break
                i += 1
            s.insert(i, lo)
            e.insert(i, lo + d)
            start[t] = lo if forward else horizon - lo - d
        return start

    def makespan(self, start: Sequence[float]) -> float:
        return max(s + d for s, d in zip(start, self.duration))

    def by_start(self, start: Sequence[float]) -> list[int]:
        return sorted(range(self.n), key=start.__getitem__)

    def justify(self, start: list[float], rounds: int = 32) -> tuple[float, list[float]]:
        """Forward–backward improvement of a schedule; ``(makespan, start)`` of the best."""
        best, best_start = self.makespan(start), start
        for _ in range(rounds):
            horizon = self.makespan(best_start)
            late = self.decode(sorted(range(self.n), key=lambda t: -best_start[t] - self.duration[t]),
                               forward=False, horizon=horizon)
            start = self.decode(self.by_start(late))
            makespan = self.makespan(start)
            if makespan >= best - EPS:
                break
            best, best_start = makespan, start
        return best, best_start

    def orders(self, start: Sequence[float]) -> list[Order]:
        """Per GPU, its tasks by start time (the compact orders the simulator runs)."""
        orders: list[Order] = [[] for _ in range(self.gpus)]
        for t in self.by_start(start):
            g, kind, k = self.key[t]
            orders[g].append((kind, k))
        return orders

    def starts(self, orders: Sequence[Order]) -> list[float]:
        """Task start times of compact orders (which must be valid)."""
        timed = self.evaluator.times(orders)
        assert timed is not None, "orders deadlock"
        start = [0.0] * self.n
        for g, order in enumerate(orders):
            for pos, (kind, k) in enumerate(order):
                start[self.index[g, kind, k]] = timed[0][g][pos]
        return start

    def topological(self, priority: Sequence[int]) -> list[int]:
        """``priority`` with each task moved after its predecessors, otherwise in order."""
        out, placed = [], [False] * self.n
        for t in priority:
            chain = []
            while t >= 0 and not placed[t]:
                chain.append(t)
                t = self.pred[t]
            for x in reversed(chain):
                placed[x] = True
                out.append(x)
        return out

    def decode_capped(self, priority: Sequence[int], cap: int) -> list[float] | None:
        """Start times from a priority list by parallel list scheduling under a memory cap:
        whenever a GPU is idle it starts its first ready task in list order, a forward only
        while fewer than ``cap`` activations are resident there (a backward frees its own).
        Insertion cannot be used here, since a task placed in an earlier gap would change the
        activations resident after it. ``None`` if the cap deadlocks the order."""
        rank = [0] * self.n
        for r, t in enumerate(priority):
            rank[t] = r
        forwards: list[list[tuple[int, int]]] = [[] for _ in range(self.gpus)]
        backwards: list[list[tuple[int, int]]] = [[] for _ in range(self.gpus)]
        for t in range(self.n):
            if self.pred[t] < 0:
                heapq.heappush(forwards[self.gpu[t]], (rank[t], t))
        start, resident, busy = [0.0] * self.n, [0] * self.gpus, [False] * self.gpus
        events: list[tuple[float, int]] = []
        now, done = 0.0, 0
        while done < self.n:
            for g in range(self.gpus):
                if busy[g]:
                    continue
                fwd, bwd = forwards[g], backwards[g]
                can_fwd = bool(fwd) and resident[g] < cap
                if not can_fwd and not bwd:
                    continue
                use_bwd = bool(bwd) and (not can_fwd or bwd[0][0] < fwd[0][0])
                _, t = heapq.heappop(bwd if use_bwd else fwd)
                resident[g] += -1 if use_bwd else 1
                start[t], busy[g] = now, True
                heapq.heappush(events, (now + self.duration[t], t))
            if not events:
                return None
            now, t = heapq.heappop(events)
            busy[self.gpu[t]] = False
            done += 1
            s = self.succ[t]
            if s >= 0:
                g, kind, _ = self.key[s]
                heapq.heappush(backwards[g] if kind & 1 else forwards[g], (rank[s], s))
        return start
