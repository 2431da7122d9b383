"""One engine model and one continuous-batching simulator, shared by every planner, ceiling and
oracle in rlweave (issue 43 step 3). Neutral: no framework imports, so plugins may use it.

- :class:`EngineModel`: what one engine iteration costs, fitted to measurements;
- :class:`Simulator`: event-driven continuous batching over engine instances, with the queue
  order, the preemption rule and the placement as small swappable objects (the shape of vLLM's
  scheduler: a waiting queue with a policy, a running set capped by slots).

Every figure it produces is SIMULATED.
"""

from rlweave.sim.batching import Iteration, Request, Simulator
from rlweave.sim.engine import EngineModel
from rlweave.sim.policies import (
    ArrivalOrder,
    KeepRunning,
    PullGroups,
    RoundRobin,
    ShortestRemaining,
    ShortestRemainingPreempts,
)

__all__ = ["ArrivalOrder", "EngineModel", "Iteration", "KeepRunning", "PullGroups", "Request", "RoundRobin",
           "ShortestRemaining", "ShortestRemainingPreempts", "Simulator"]
