"""Discrete-event simulation of an agentic rollout over continuous-batching engine instances.

A planning tool, not a result: it extrapolates ``rlweave bench agentic`` to cluster scale from
the per-iteration cost measured on the real engine (:class:`EngineCostModel`). Each instance runs
up to ``slots`` requests per iteration; an iteration with ``B`` requests takes
``iteration_s(B)``; admitting a request first stalls the batch for its prefill. A finished turn
enters its tool call, after which the next turn is placed and queued again. Token progress is
advanced lazily between events, so the cost is per event, not per iteration.

Policies are the same objects the real run uses: verl's sticky least-loaded balancer logic and
FCFS queues, or rlweave's :class:`TrajectoryOrchestrator` with priority queues.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from rlweave.benchmarks.agentic_workload import TOOL_OUTPUT_TOKENS, Trajectory
from rlweave.plugins.agentic_rollout.orchestrator import TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.types import InstanceLoad, TrajectoryInfo


@dataclass
class _Turn:
    traj: Trajectory
    index: int
    submit_s: float
    key: tuple


@dataclass
class _Instance:
    iid: str
    running: dict[int, tuple[_Turn, float]] = field(default_factory=dict)  # id -> (turn, left)
    waiting: list[tuple[tuple, int, _Turn]] = field(default_factory=list)
    progress_from: float = 0.0
    version: int = 0


@dataclass
class SimResult:
    makespan_s: float
    queueing_s: dict[str, float]  # per trajectory, summed over its turns
    finish_s: dict[str, float]
    migrations: int = 0


def simulate(trajectories: list[Trajectory], instances: int, cost: EngineCostModel, *,
             placement: str = "sticky", queue: str = "fcfs",
             orchestrator: TrajectoryOrchestrator | None = None, seed: int = 0) -> SimResult:
    """verl's default is ``placement="sticky"`` (sticky least-in-flight) with ``queue="fcfs"``;
    rlweave's is ``"heddle"`` (the orchestrator's placement and migration) with ``"priority"``
    (the orchestrator's per-turn priority). Mixed pairs are the ablations."""
    if placement not in ("sticky", "heddle") or queue not in ("fcfs", "priority"):
        raise ValueError(f"unknown policy {placement!r}/{queue!r}: placement 'sticky' or "
                         "'heddle', queue 'fcfs' or 'priority'")
    if (placement, queue) != ("sticky", "fcfs") and orchestrator is None:
        raise ValueError("heddle placement and priority queues need an orchestrator")
    rng = random.Random(seed)
    insts = [_Instance(f"i{k}") for k in range(instances)]
    by_id = {i.iid: i for i in insts}
    sticky: dict[str, str] = {}
    inflight = {i.iid: 0 for i in insts}
    state = {t.id: {"turns": 0, "tokens": 0, "queued": 0.0, "inst": None} for t in trajectories}
    queueing = {t.id: 0.0 for t in trajectories}
    finish: dict[str, float] = {}
    events: list[tuple[float, int, str, object]] = []
    seq = itertools.count()

    def info(t: Trajectory) -> TrajectoryInfo:
        s = state[t.id]
        return TrajectoryInfo(t.id, t.group, s["turns"], s["tokens"], s["queued"], s["inst"],
                              t.task, t.prompt_len)

    def advance(inst: _Instance, now: float) -> None:
        if inst.running and now > inst.progress_from:
            done = (now - inst.progress_from) / cost.iteration_s(len(inst.running))
            for rid, (turn, left) in inst.running.items():
                inst.running[rid] = (turn, left - done)
        inst.progress_from = max(inst.progress_from, now)

    def reschedule(inst: _Instance, now: float) -> None:
        prefill = 0
        while inst.waiting and len(inst.running) < cost.slots:
            _, rid, turn = heapq.heappop(inst.waiting)
            waited = now - turn.submit_s
            queueing[turn.traj.id] += waited
            state[turn.traj.id]["queued"] += waited
            inst.running[rid] = (turn, float(turn.traj.turn_tokens[turn.index]))
            prefill += turn.traj.prompt_len + sum(turn.traj.turn_tokens[:turn.index]) \
                + TOOL_OUTPUT_TOKENS * turn.index
        inst.progress_from += prefill * cost.prefill_s_per_token
        inst.version += 1
        if inst.running:
            left = min(left for _, left in inst.running.values())
            at = inst.progress_from + max(left, 0.0) * cost.iteration_s(len(inst.running))
            heapq.heappush(events, (at, next(seq), "instance", (inst.iid, inst.version)))

    def submit(t: Trajectory, now: float) -> None:
        s = state[t.id]
        if placement == "sticky":
            iid = sticky.get(t.id)
            if iid is None:
                low = min(inflight.values())
                iid = sticky[t.id] = rng.choice([k for k, v in inflight.items() if v == low])
        else:
            loads = [InstanceLoad(i.iid, len(i.running), len(i.waiting)) for i in insts]
            iid = orchestrator.choose_instance(info(t), loads, now)
        key: tuple = (orchestrator.priority(info(t)), now) if queue == "priority" else (now,)
        s["inst"] = iid
        inflight[iid] += 1
        inst = by_id[iid]
        advance(inst, now)
        turn = _Turn(t, s["turns"], now, key)
        heapq.heappush(inst.waiting, (key, next(seq), turn))
        reschedule(inst, now)

    for t in trajectories:
        if orchestrator is not None:
            orchestrator.started(info(t))
        heapq.heappush(events, (0.0, next(seq), "submit", t))
    now = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "submit":
            if orchestrator is not None and state[payload.id]["turns"]:
                orchestrator.tool_ended(info(payload), now)
            submit(payload, now)
            continue
        iid, version = payload
        inst = by_id[iid]
        if version != inst.version:
            continue
        advance(inst, now)
        for rid, (turn, left) in list(inst.running.items()):
            if left > 1e-9:
                continue
            del inst.running[rid]
            inflight[iid] -= 1
            t, s = turn.traj, state[turn.traj.id]
            s["turns"] += 1
            s["tokens"] += t.turn_tokens[turn.index]
            if s["turns"] == len(t.turn_tokens):
                finish[t.id] = now
                if orchestrator is not None:
                    orchestrator.finished(info(t))
            else:
                if orchestrator is not None:
                    orchestrator.tool_started(info(t), now)
                heapq.heappush(events, (now + t.tool_s[turn.index], next(seq), "submit", t))
        reschedule(inst, now)
    return SimResult(max(finish.values()), queueing, finish,
                     orchestrator.migrations if orchestrator is not None else 0)


def serial_time(t: Trajectory, cost: EngineCostModel) -> float:
    """A trajectory alone on an idle engine: the makespan can never beat the longest of these."""
    prefill = sum(t.prompt_len + sum(t.turn_tokens[:i]) + TOOL_OUTPUT_TOKENS * i
                  for i in range(len(t.turn_tokens)))
    return t.tokens * cost.iteration_s(1) + sum(t.tool_s) + prefill * cost.prefill_s_per_token
