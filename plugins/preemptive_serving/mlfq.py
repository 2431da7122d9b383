"""Skip-join multi-level feedback queue (FastServe, section 4; ``MLFQ`` in its reference code).

Levels ``p = 0 .. num_levels-1`` have quanta ``q_p = base_quantum_s * ratio**p``; level 0 is
served first. A request's rank is ``(priority, level, not promoted, entered_s, arrival order)``:

- **Explicit priority first.** A smaller ``priority`` (vLLM's convention) ranks ahead whatever
  the levels; MLFQ orders requests of equal priority. Serving traffic leaves every priority 0,
  so only the levels count; in RL the trajectory priority decides (makespan, not mean latency).
- **Skip-join.** A request joins the first level whose quantum covers its prefill time, so a
  long prompt does not interrupt short jobs only to be demoted after its first iteration.
- **Demotion by attained service.** Every iteration that computes a request adds the
  iteration's wall time to the request's service at its level; above the level's quantum the
  request moves one level down, service reset (the last level keeps it).
- **FIFO within a level by entry time.** A request that keeps its level keeps its place, so
  the running ones are not preempted by newcomers of the same level (FastServe pushes them back
  to the front of their queue).
- **Starvation promotion.** At every decision, a request unserved for ``starvation_s`` (since
  its last iteration, or its arrival) moves to level 0, ahead of the level's other requests,
  with ``entered_s`` = its last service (oldest starving first); it stays promoted until it is
  demoted again. Bound: a request waits at most ``starvation_s`` plus two iterations (the
  decision after the threshold, and the iteration then running) between two iterations that
  compute it, unless it competes for the ``slots`` batch slots with at least ``slots``
  requests of smaller priority value or promoted earlier (tested with one slot under a stream
  of short requests that alone would keep the engine busy).
- **Preemption.** The ``slots`` best-ranked requests should hold the engine's batch slots;
  running requests outside them are preempted, as many as the better-ranked waiting requests
  need beyond the free slots.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


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


class SkipJoinMLFQ:
    """The queue state of one engine. Times are seconds on one clock (the caller's ``now``)."""

    def __init__(self, base_quantum_s: float, ratio: float = 2.0, num_levels: int = 8,
                 starvation_s: float = 3.0) -> None:
        if base_quantum_s <= 0 or ratio <= 1 or num_levels < 1 or starvation_s <= 0:
            raise ValueError("SkipJoinMLFQ needs base_quantum_s > 0, ratio > 1, "
                             "num_levels >= 1 and starvation_s > 0")
        self.base_quantum_s = base_quantum_s
        self.ratio = ratio
        self.num_levels = num_levels
        self.starvation_s = starvation_s
        self.jobs: dict[str, Job] = {}
        self._seq = itertools.count()
        self.promotions = 0

    def quantum(self, level: int) -> float:
        return self.base_quantum_s * self.ratio ** level

    def join_level(self, prefill_s: float) -> int:
        """Skip-join: the first level whose quantum covers ``prefill_s`` (else the last)."""
        level = 0
        while level < self.num_levels - 1 and self.quantum(level) < prefill_s:
            level += 1
        return level

    def add(self, request_id: str, *, now: float, prefill_s: float = 0.0,
            priority: int = 0) -> Job:
        """A request arrives; ``prefill_s = 0`` joins the top level (plain MLFQ)."""
        job = Job(request_id, priority, self.join_level(prefill_s), now, now, next(self._seq))
        self.jobs[request_id] = job
        return job

    def remove(self, request_id: str) -> None:
        self.jobs.pop(request_id, None)

    def served(self, request_ids: Iterable[str], seconds: float, now: float) -> None:
        """An iteration of ``seconds`` that ended at ``now`` computed ``request_ids``."""
        for rid in request_ids:
            job = self.jobs.get(rid)
            if job is None:
                continue
            job.last_served_s = now
            job.attained_s += seconds
            if job.attained_s > self.quantum(job.level) and job.level < self.num_levels - 1:
                job.level += 1
                job.entered_s = now
                job.attained_s = 0.0
                job.promoted = False

    def promote_starved(self, now: float) -> list[str]:
        """Move every request unserved for ``starvation_s`` to level 0; returns their ids."""
        promoted = []
        for job in self.jobs.values():
            if not job.promoted and now - job.last_served_s >= self.starvation_s:
                job.level, job.entered_s, job.attained_s = 0, job.last_served_s, 0.0
                job.promoted = True
                promoted.append(job.request_id)
        self.promotions += len(promoted)
        return promoted

    def rank(self, request_id: str) -> tuple[int, int, bool, float, int]:
        job = self.jobs[request_id]
        return job.priority, job.level, not job.promoted, job.entered_s, job.seq

    def decide(self, waiting: Sequence[str], running: Sequence[str], slots: int, now: float,
               can_preempt: bool = True) -> tuple[list[str], list[str]]:
        """``(waiting ids best first, running ids to preempt)`` for the next iteration.

        All ids must have been :meth:`add`-ed. Without ``can_preempt`` only the order is set.
        """
        self.promote_starved(now)
        order = sorted(waiting, key=self.rank)
        if not can_preempt or not running or not waiting:
            return order, []
        top = set(sorted([*order, *running], key=self.rank)[:slots])
        preempt = [rid for rid in running if rid not in top]
        need = sum(rid in top for rid in order) - max(0, slots - len(running))
        preempt.sort(key=self.rank, reverse=True)  # worst first
        return order, preempt[:max(0, need)]
