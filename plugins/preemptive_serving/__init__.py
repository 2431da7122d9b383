"""Iteration-level preemptive serving: FastServe's skip-join MLFQ (Wu et al., arXiv 2305.05920,
NSDI'26; reference code LLMServe/FastServe ``fastserve/scheduler.py``, class ``MLFQ``).

Output lengths are unknown but prompt lengths are known, so the scheduler approximates
shortest-remaining-first by *attained service*, in levels of exponentially growing quanta:

1. :class:`.profile.IterationProfile` fits iteration wall time against computed tokens from the
   running engine's own iterations (no shipped table), giving a request's prefill time alone;
2. :class:`.mlfq.SkipJoinMLFQ` puts an arriving request into the first level whose quantum
   covers that prefill time (skip-join), demotes it when its attained service exceeds its
   level's quantum, promotes it to the top when it starves, and names the running requests to
   preempt so that the best-ranked requests hold the engine's batch slots;
3. :class:`.scheduler.PreemptiveScheduler` turns engine events into those calls and returns a
   :class:`~rlweave.types.ScheduleDecision`; :mod:`.plugin` is its hook implementations.

Explicit priority (vLLM's ``priority``, the trajectory priority of agentic RL) ranks before any
MLFQ level: in RL, makespan rather than mean latency is the goal, so the trajectory scheduler
decides and MLFQ only orders requests of equal priority. Pure Python and numpy.
"""
