"""Skip-join multi-level feedback queue (FastServe, section 4; ``MLFQ`` in its reference code).

Levels ``p = 0 .. num_levels-1`` have quanta ``q_p = base_quantum_s * ratio**p``; level 0 is
served first. A request's rank is ``(priority, level, not promoted, entered_s, arrival order)``:

- **Explicit priority first.** A smaller ``priority`` (vLLM's convention) ranks ahead whatever
  the levels; MLFQ orders requests of equal priority. Serving traffic leaves every priority 0,
  so only the levels count; in RL the trajectory priority decides (makespan, not mean latency).
- **Skip-join.** A request joins the first level whose quantum covers its prefill time, so a
  long prompt does not interrupt short jobs only to be demoted after its first iteration.
- **Demotion by attained service** (``demote_by_service``, FastServe's rule). Every iteration
  that computes a request adds the iteration's wall time to the request's service at its
  level; above the level's quantum the request moves one level down, service reset (the last
  level keeps it). Without it, the caller places requests with :meth:`set_level` (rlweave's
  adaptive policy levels them by expected remaining work).
- **FIFO within a level by entry time.** A request that keeps its level keeps its place, so
  the running ones are not preempted by newcomers of the same level (FastServe pushes them back
  to the front of their queue); one that moves to a better level keeps its entry time too.
- **Starvation promotion.** At every decision, a request unserved for ``starvation_s`` (since
  its last iteration, or its arrival) moves to level 0, ahead of the level's other requests,
  with ``entered_s`` = its last service (oldest starving first); it stays promoted until it has
  used a level-0 quantum. Bound: a request waits at most ``starvation_s`` plus two iterations
  (the decision after the threshold, and the iteration then running) between two iterations
  that compute it, unless it competes for the ``slots`` batch slots with at least ``slots``
  requests of smaller priority value or promoted earlier (tested with one slot under a stream
  of short requests that alone would keep the engine busy).
- **Preemption.** The ``slots`` best-ranked requests should hold the engine's batch slots;
  running requests outside them are preempted, worst first, as many as the better-ranked
  waiting requests need beyond the free slots. Each preemption pairs a victim (worst first)
  with the waiting request that takes its slot (best first, after those the free slots admit);
  the caller may keep a victim against that entrant (a request about to finish costs more to
  recompute than it frees, or finishes before the entrant would), and the entrant then tries
  the next victim.

Ranks are kept sorted (a rank change costs a bisection and a list shift), so a decision reads
``slots + running`` of them whatever the queue's length; :attr:`version` changes whenever any
rank does, so a caller can reuse a decision while nothing changed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

Rank = tuple[int, int, bool, float, int]


@dataclass
class Job:
    """One request in the MLFQ."""

    request_id: str
    priority: int
    level: int
    entered_s: float  # when it entered its level: the FIFO key within a level
    last_served_s: float  # end of the last iteration that computed it, or its arrival
    seq: int  # arrival order, the last tie-break
    attained_s: float = 0.0  # service attained at its current level
    promoted: bool = False  # promoted for starvation and not demoted since
    in_unserved: bool = True  # has an entry in the starvation heap
    key: Rank = field(init=False)

    def __post_init__(self) -> None:
        self.rerank()

    def rerank(self) -> None:
        self.key = (self.priority, self.level, not self.promoted, self.entered_s, self.seq)


class SkipJoinMLFQ:
    """The queue state of one engine. Times are seconds on one clock (the caller's ``now``)."""

    def __init__(self, base_quantum_s: float, ratio: float = 2.0, num_levels: int = 8,
                 starvation_s: float = 3.0, demote_by_service: bool = True) -> None:
        if base_quantum_s <= 0 or ratio <= 1 or num_levels < 1 or starvation_s <= 0:
            raise ValueError("SkipJoinMLFQ needs base_quantum_s > 0, ratio > 1, "
                             "num_levels >= 1 and starvation_s > 0")
        self.base_quantum_s = base_quantum_s
        self.ratio = ratio
        self.num_levels = num_levels
        self.starvation_s = starvation_s
        self.demote_by_service = demote_by_service
        self.jobs: dict[str, Job] = {}
        self._seq = itertools.count()
        # Every job's rank, sorted (ranks are unique: they end in the arrival order), and the
        # job of each arrival order: the best waiting requests are the first few not running.
        self._ranked: list[Rank] = []
        self._by_seq: dict[int, Job] = {}
        # (served_s, seq, id): at most one entry per job, with served_s <= its last_served_s
        # (a job served since is pushed again only when its entry comes up), so that serving
        # the running requests every iteration costs no heap operation.
        self._unserved: list[tuple[float, int, str]] = []
        self.promotions = 0
        self.version = 0

    def quantum(self, level: int) -> float:
        return self.base_quantum_s * self.ratio ** level

    def join_level(self, work_s: float) -> int:
        """Skip-join: the first level whose quantum covers ``work_s`` (else the last)."""
        if work_s <= self.base_quantum_s:
            return 0
        level = math.ceil(math.log(work_s / self.base_quantum_s, self.ratio) - 1e-9)
        return min(level, self.num_levels - 1)

    def add(self, request_id: str, *, now: float, prefill_s: float = 0.0,
            priority: int = 0) -> Job:
        """A request arrives and joins the level covering ``prefill_s`` (0: the top level)."""
        job = Job(request_id, priority, self.join_level(prefill_s), now, now, next(self._seq))
        self.remove(request_id)  # an id used again is a new request
        self.jobs[request_id] = job
        self._by_seq[job.seq] = job
        bisect.insort(self._ranked, job.key)
        heapq.heappush(self._unserved, (now, job.seq, request_id))
        self.version += 1
        return job

    def remove(self, request_id: str) -> None:
        job = self.jobs.pop(request_id, None)
        if job is not None:
            del self._ranked[bisect.bisect_left(self._ranked, job.key)]
            del self._by_seq[job.seq]
            self.version += 1

    def _rerank(self, job: Job) -> None:
        del self._ranked[bisect.bisect_left(self._ranked, job.key)]
        job.rerank()
        bisect.insort(self._ranked, job.key)

    def set_level(self, request_id: str, level: int, now: float) -> None:
        """Move a request to ``level``: to the back of a worse level, keeping its entry time in
        a better one. A promoted request stays at the top until it has used its quantum."""
        job = self.jobs[request_id]
        if job.promoted or level == job.level:
            return
        if level > job.level:
            job.entered_s = now
        job.level, job.attained_s = level, 0.0
        self._rerank(job)
        self.version += 1

    def served(self, request_ids: Iterable[str], seconds: float, now: float) -> None:
        """An iteration of ``seconds`` that ended at ``now`` computed ``request_ids``."""
        for rid in request_ids:
            job = self.jobs.get(rid)
            if job is None:
                continue
            job.last_served_s = now
            if not job.in_unserved:
                job.in_unserved = True
                heapq.heappush(self._unserved, (now, job.seq, rid))
            if not (self.demote_by_service or job.promoted):
                continue  # its service moves nothing
            job.attained_s += seconds
            if job.attained_s <= self.quantum(job.level):
                continue
            if self.demote_by_service and job.level < self.num_levels - 1:
                job.level += 1
                job.entered_s = now
            elif not job.promoted:
                continue
            job.attained_s, job.promoted = 0.0, False
            self._rerank(job)
            self.version += 1

    def promote_starved(self, now: float) -> list[str]:
        """Move every request unserved for ``starvation_s`` to level 0; returns their ids."""
        promoted = []
        while self._unserved and self._unserved[0][0] <= now - self.starvation_s:
            served_s, seq, rid = heapq.heappop(self._unserved)
            job = self.jobs.get(rid)
            if job is None or job.seq != seq:
                continue  # gone
            if job.promoted:
                job.in_unserved = False  # pushed again when next served
                continue
            if job.last_served_s != served_s:  # served since: its entry moves up to then
                heapq.heappush(self._unserved, (job.last_served_s, seq, rid))
                continue
            job.level, job.entered_s, job.attained_s = 0, job.last_served_s, 0.0
            job.promoted, job.in_unserved = True, False
            self._rerank(job)
            promoted.append(rid)
        if promoted:
            self.promotions += len(promoted)
            self.version += 1
        return promoted

    def rank(self, request_id: str) -> Rank:
        return self.jobs[request_id].key

    def decide(self, waiting: Iterable[str] | None, running: Sequence[str], slots: int, now: float,
               can_preempt: bool = True, keep: Callable[[str, str], bool] | None = None,
               ) -> tuple[list[str], list[str]]:
        """``(best waiting ids, best first, at most slots of them; running ids to preempt)``.

        All ids must have been :meth:`add`-ed; ``waiting=None``: every request added and not
        removed that is not running. Without ``can_preempt`` only the order is set;
        ``keep(victim, entrant)`` true spares a running request that ``entrant`` would
        otherwise preempt.
        """
        self.promote_starved(now)
        if waiting is None:
            skip, best = set(running), []
            for key in self._ranked:  # at most slots + len(running) of them
                rid = self._by_seq[key[-1]].request_id
                if rid not in skip:
                    best.append(rid)
                    if len(best) == slots:
                        break
        else:
            best = heapq.nsmallest(slots, waiting, key=self.rank)
        if not can_preempt or not running or not best:
            return best, []
        top = set(heapq.nsmallest(slots, [*best, *running], key=self.rank))
        victims = sorted((r for r in running if r not in top), key=self.rank, reverse=True)
        entrants = iter([rid for rid in best if rid in top][max(0, slots - len(running)):])
        preempt, entrant = [], next(entrants, None)
        for victim in victims:
            if entrant is None:
                break
            if keep is None or not keep(victim, entrant):
                preempt.append(victim)
                entrant = next(entrants, None)
        return best, preempt
