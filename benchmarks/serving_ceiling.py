"""What any scheduler could reach on ``bench serving``'s workload: SIMULATED, a planning figure.

``bench serving``'s lower bound is each request's latency with no queueing and no co-runners. At
a load near capacity no scheduler reaches it: the slots are full, so requests wait or share
iterations. How near a scheduler can come is what decides whether a goal such as "within 2x of
the bound" is reachable at all. This module replays the measured requests (arrivals at the
round's rate, prompt and output lengths) on an iteration-level model of the engine fitted to the
same round's FCFS measurements, under two schedules:

- **FCFS** (vLLM's default): a request keeps its slot until it ends; the simulator's check
  against the FCFS engine's measured latency;
- **SRPT oracle**: every iteration runs the requests with the fewest output tokens left (true
  lengths, which no real scheduler knows), preempting the others with their KV kept, so at no
  cost. Shortest remaining first minimises mean latency on one server; here it is the ceiling
  of attained-service schedulers such as FastServe's MLFQ and rlweave's adaptive policy.

The engine model is the shared :class:`rlweave.sim.EngineModel`: an iteration decoding ``b``
sequences takes ``base_s + per_seq_s * b``, plus ``prefill_s_per_token`` per prompt token of each
request that starts in it. ``base_s + per_seq_s`` is the per-output-token cost of a request alone
and ``prefill_s_per_token`` its per-prompt-token cost (the bench's fit to requests run alone); the
iteration at full batch comes from the saturation probe. Both schedules run on the shared
simulator (:class:`rlweave.sim.Simulator`), one engine, with the queue order and preemption of
each schedule.

Near capacity, queueing magnifies every per cent of the engine's speed: a model a few per cent
faster than the engine under the real mix of lengths puts FCFS at a fraction of its measured
latency. :func:`calibrate_speed` therefore scales the model until its FCFS matches the measured
FCFS at one load (the highest); the factor is the model's error in speed, and FCFS at the other
loads stays the simulator's check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rlweave.sim import (
    ArrivalOrder,
    EngineModel,
    KeepRunning,
    Request,
    ShortestRemaining,
    ShortestRemainingPreempts,
    Simulator,
)

# policy -> (queue order, preemption): FCFS keeps its slot; the SRPT oracle re-chooses every
# iteration with true lengths and keeps the preempted KV (free preemption)
POLICIES = {"fcfs": (ArrivalOrder, KeepRunning), "srpt": (ShortestRemaining, ShortestRemainingPreempts)}


@dataclass(frozen=True)
class SimulatedRun:
    """Per request its latency over its output tokens (seconds per token), and the run's output
    tokens over its last finish, as the bench measures throughput."""

    norm_latency: np.ndarray
    tokens_per_s: float


def fit_engine(alone_fit: Sequence[float], probe_tokens_per_s: float, probe_prompt: int, probe_output: int,
               slots: int, probe_requests: int = 0) -> EngineModel:
    """The model from the bench's fit to requests alone (``[fixed, per prompt token, per output
    token]``) and its saturation probe (equal requests of ``probe_prompt`` + ``probe_output``
    tokens filling ``slots``): a request's share of the probe is its prefill plus ``probe_output``
    iterations at full batch, shared by ``slots`` requests. Given ``probe_requests`` (how many
    the probe submitted at once), the fixed cost is kept as the model's ``request_s``: latency
    outside the iterations (vLLM's front end and the hops to and from its engine core, which
    no iteration waits for), so the probe's wall holds it once, its first request's way in and
    its last one's way out, and the iterations get the rest; without, it is dropped."""
    fixed, prefill, alone = (float(x) for x in alone_fit)
    request_s = fixed if probe_requests else 0.0
    per_request = probe_output / probe_tokens_per_s - request_s / max(probe_requests, 1)
    full = max(alone, slots * (per_request - prefill * probe_prompt) / probe_output)
    per_seq = (full - alone) / (slots - 1) if slots > 1 else 0.0
    return EngineModel(base_s=alone - per_seq, per_seq_s=per_seq, slots=slots, prefill_s_per_token=prefill,
                       request_s=request_s)


def simulate(requests: Sequence[dict], rate_req_s: float, engine: EngineModel, policy: str) -> SimulatedRun:
    """``requests`` served at ``rate_req_s`` (their ``arrival_s`` are at unit rate, as the
    bench's) under ``policy``: ``fcfs`` or ``srpt``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: fcfs or srpt")
    order, preemption = POLICIES[policy]
    sim = Simulator([engine], order(), preemption())
    sim.submit([Request(i, r["arrival_s"] / rate_req_s, int(r["output_len"]), int(r["prompt_len"]))
                for i, r in enumerate(requests)])
    finish = sim.run().finish_array() + engine.request_s
    arrival = np.array([r["arrival_s"] for r in requests]) / rate_req_s
    output = np.array([int(r["output_len"]) for r in requests])
    return SimulatedRun((finish - arrival) / output, float(output.sum() / finish.max()))


SPEED_BOUNDS = (0.5, 2.0)  # beyond these the engine model is wrong by more than a speed


def calibrate_speed(requests: Sequence[dict], rate_req_s: float, engine: EngineModel,
                    measured_fcfs_s: float) -> float | None:
    """The factor by which ``engine`` must be slowed (< 1: sped up) for its simulated FCFS mean
    normalised latency to match ``measured_fcfs_s`` on ``requests`` at ``rate_req_s``, or
    ``None`` where no factor within ``SPEED_BOUNDS`` does (the model is wrong by more than a speed).
    The mean grows with the factor, so a bisection finds it."""
    def fcfs_mean(factor: float) -> float:
        return float(simulate(requests, rate_req_s, engine.scaled(factor), "fcfs").norm_latency.mean())

    low, high = SPEED_BOUNDS
    if not fcfs_mean(low) <= measured_fcfs_s <= fcfs_mean(high):
        return None
    while high / low > 1.001:
        mid = (low * high) ** 0.5
        low, high = (mid, high) if fcfs_mean(mid) < measured_fcfs_s else (low, mid)
    return (low * high) ** 0.5
