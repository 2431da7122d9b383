"""Discrete-event simulation of an agentic rollout over continuous-batching engine instances.

A planning tool, not a result: it extrapolates ``rlweave bench agentic`` to cluster scale from
the per-iteration cost measured on the real engine (:class:`EngineCostModel`). Each instance runs
up to ``slots`` requests per iteration; an iteration with ``B`` requests takes
``iteration_s(B)``; admitting a request first stalls the batch for its prefill. A finished turn
enters its tool call, after which the next turn is placed and queued again. Token progress is
advanced lazily between events, so the cost is per event, not per iteration. An instance's
prefix cache keeps a trajectory's context between its turns, so a turn prefills only what is
new there (a migrated turn re-prefills its whole context).

Policies are the same objects the real run uses: verl's sticky least-loaded balancer logic and
FCFS queues, or rlweave's :class:`TrajectoryOrchestrator` with priority queues, told what the
agent loop tells it (each trajectory's start, its turns' starts and ends, its finish). The
preemptive queue and tail parallelism (:mod:`.agentic_tail`) are simulated ablations only.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from rlweave.benchmarks.agentic_workload import TOOL_OUTPUT_TOKENS, Trajectory
from rlweave.plugins.agentic_rollout.orchestrator import TrajectoryOrchestrator
from rlweave.benchmarks.agentic_tail import TailParallelism
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.types import InstanceLoad, TrajectoryInfo


@dataclass
class _Turn:
    traj: Trajectory
    index: int
    submit_s: float
    key: tuple
    left: float | None = None  # tokens still to generate, when moved mid-turn


@dataclass
class _Instance:
    iid: str
    cost: EngineCostModel
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
    tail_switch_s: float | None = None  # when the tail moved to merged instances


@dataclass(frozen=True)
class _Policy:
    placement: str
    queue: str
    orchestrator: TrajectoryOrchestrator | None
    seed: int
    tail: TailParallelism | None


def simulate(trajectories: list[Trajectory], instances: int, cost: EngineCostModel, *,
             placement: str = "sticky", queue: str = "fcfs",
             orchestrator: TrajectoryOrchestrator | None = None, seed: int = 0,
             tail: TailParallelism | None = None) -> SimResult:
    """verl's default is ``placement="sticky"`` (sticky least-in-flight) with ``queue="fcfs"``;
    rlweave's is ``"heddle"`` (the orchestrator's placement and migration) with ``"priority"``
    (the orchestrator's per-turn priority). Mixed pairs are the ablations. ``tail`` (with heddle
    placement) regroups instances once the orchestrator's loads say the switch pays."""
    if placement not in ("sticky", "heddle") or queue not in ("fcfs", "priority", "preemptive"):
        raise ValueError(f"unknown policy {placement!r}/{queue!r}: placement 'sticky' or "
                         "'heddle', queue 'fcfs', 'priority' or 'preemptive'")
    if (placement, queue) != ("sticky", "fcfs") and orchestrator is None:
        raise ValueError("heddle placement and priority queues need an orchestrator")
    if tail is not None and placement != "heddle":
        raise ValueError("tail parallelism is a decision of heddle placement")
    return _Rollout(trajectories, instances, cost, _Policy(placement, queue, orchestrator, seed, tail)).run()


class _Rollout:
    """One simulated rollout: the event loop and the state the policies read."""

    def __init__(self, trajectories: list[Trajectory], instances: int, cost: EngineCostModel,
                 policy: _Policy) -> None:
        self.trajectories, self.cost, self.policy = trajectories, cost, policy
        self.orchestrator = policy.orchestrator
        self.rng = random.Random(policy.seed)
        self.insts = [_Instance(f"i{k}", cost) for k in range(instances)]
        self.live = list(self.insts)  # instances placement may use (merging retires some)
        self.switched_at: float | None = None
        self.by_id = {i.iid: i for i in self.insts}
        self.sticky: dict[str, str] = {}
        self.inflight = {i.iid: 0 for i in self.insts}
        self.state = {t.id: {"turns": 0, "tokens": 0, "inst": None} for t in trajectories}
        self.queueing = {t.id: 0.0 for t in trajectories}
        self.cached: dict[tuple[str, str], int] = {}  # (instance, trajectory) -> context tokens cached
        self.finish: dict[str, float] = {}
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()

    def run(self) -> SimResult:
        for t in self.trajectories:
            if self.orchestrator is not None:
                self.orchestrator.started(self.info(t))
            heapq.heappush(self.events, (0.0, next(self.seq), "submit", t))
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind == "submit":
                self.submit(payload, now)
            else:
                self.iteration_boundary(payload, now)
        return SimResult(max(self.finish.values()), self.queueing, self.finish,
                         self.orchestrator.migrations if self.orchestrator is not None else 0, self.switched_at)

    def info(self, t: Trajectory) -> TrajectoryInfo:
        s = self.state[t.id]
        turn = min(s["turns"], len(t.turn_tokens) - 1)
        return TrajectoryInfo(t.id, t.group, s["turns"], s["tokens"], s["inst"], t.task,
                              t.prompt_len, t.context_before(turn))

    def advance(self, inst: _Instance, now: float) -> None:
        """Decode the running turns' tokens up to ``now`` (fractions of a token count)."""
        if inst.running and now > inst.progress_from:
            done = (now - inst.progress_from) / inst.cost.iteration_s(len(inst.running))
            for rid, (turn, left) in inst.running.items():
                inst.running[rid] = (turn, left - done)
        inst.progress_from = max(inst.progress_from, now)

    def reschedule(self, inst: _Instance, now: float) -> None:
        """Admit waiting turns (their prefill stalls the batch), then schedule the next finish."""
        prefill = self.admit(inst, now)
        if self.policy.queue == "preemptive":
            prefill += self.preempt_for_waiting(inst, now)
        inst.progress_from += prefill * inst.cost.prefill_s_per_token
        inst.version += 1
        if inst.running:
            left = min(left for _, left in inst.running.values())
            at = inst.progress_from + max(left, 0.0) * inst.cost.iteration_s(len(inst.running))
            heapq.heappush(self.events, (at, next(self.seq), "instance", (inst.iid, inst.version)))

    def admit(self, inst: _Instance, now: float) -> int:
        """Fill free slots from the waiting queue; returns the tokens to prefill. vLLM's prefix
        cache holds the trajectory's context where its last turn ran."""
        prefill = 0
        while inst.waiting and len(inst.running) < inst.cost.slots:
            _, rid, turn = heapq.heappop(inst.waiting)
            self.start_turn(inst, rid, turn, now)
            context = turn.traj.context_before(turn.index)
            prefill += max(context - self.cached.get((inst.iid, turn.traj.id), 0), 0)
        return prefill

    def start_turn(self, inst: _Instance, rid: int, turn: _Turn, now: float) -> float:
        """``turn`` leaves the queue and runs; returns its tokens left."""
        self.queueing[turn.traj.id] += now - turn.submit_s
        left = turn.traj.turn_tokens[turn.index] if turn.left is None else turn.left
        inst.running[rid] = (turn, float(left))
        return left

    def preempt_for_waiting(self, inst: _Instance, now: float) -> int:
        """Swap the worst-ranked running turns for better-ranked waiting ones (recompute: the
        resumed turn re-prefills its context and what it had generated); returns the tokens to
        prefill."""
        prefill = 0
        while inst.waiting and inst.running:
            rid, (worst, left) = max(inst.running.items(), key=lambda kv: kv[1][0].key)
            if inst.waiting[0][0] >= worst.key:
                break
            del inst.running[rid]
            worst.left, worst.submit_s = left, now
            heapq.heappush(inst.waiting, (worst.key, rid, worst))
            _, nrid, turn = heapq.heappop(inst.waiting)
            left = self.start_turn(inst, nrid, turn, now)
            done = turn.traj.turn_tokens[turn.index] - left
            prefill += turn.traj.context_before(turn.index) + int(done)
        return prefill

    def submit(self, t: Trajectory, now: float) -> None:
        """As rlweave's agent loop: report the turn and take its priority, then acquire."""
        s = self.state[t.id]
        if self.orchestrator is not None:
            self.orchestrator.turn_started(self.info(t), now)
        key: tuple = (self.orchestrator.priority(self.info(t)), now) if self.policy.queue != "fcfs" else (now,)
        iid = s["inst"] = self.place(t, now)
        self.inflight[iid] += 1
        inst = self.by_id[iid]
        self.advance(inst, now)
        heapq.heappush(inst.waiting, (key, next(self.seq), _Turn(t, s["turns"], now, key)))
        self.reschedule(inst, now)

    def place(self, t: Trajectory, now: float) -> str:
        """The orchestrator's choice, or, with sticky placement or when it leaves the choice to
        the framework (its predictions not shown skilled), verl's sticky least-in-flight."""
        if self.policy.placement == "heddle":
            loads = [InstanceLoad(i.iid, len(i.running), len(i.waiting)) for i in self.live]
            chosen = self.orchestrator.choose_instance(self.info(t), loads, now)
            if chosen is not None:
                return chosen
        iid = self.sticky.get(t.id)
        if iid is None or self.by_id[iid] not in self.live:
            low = min(self.inflight.values())
            iid = self.sticky[t.id] = self.rng.choice([k for k, v in self.inflight.items() if v == low])
        return iid

    def iteration_boundary(self, payload: tuple[str, int], now: float) -> None:
        """An instance's first running turn ends: retire what finished, refill, maybe switch."""
        iid, version = payload
        inst = self.by_id[iid]
        if version != inst.version:
            return
        self.advance(inst, now)
        for rid, (turn, left) in list(inst.running.items()):
            if left <= 1e-9:
                del inst.running[rid]
                self.turn_ended(iid, turn, now)
        self.reschedule(inst, now)
        self.maybe_switch_tail(now)

    def turn_ended(self, iid: str, turn: _Turn, now: float) -> None:
        """Its context stays cached there; the trajectory finishes or calls its tool."""
        self.inflight[iid] -= 1
        t, s = turn.traj, self.state[turn.traj.id]
        self.cached[(iid, t.id)] = t.context_before(turn.index) + t.turn_tokens[turn.index]
        s["turns"] += 1
        s["tokens"] += t.turn_tokens[turn.index]
        if self.orchestrator is not None:
            self.orchestrator.turn_ended(self.info(t), now)
        if s["turns"] == len(t.turn_tokens):
            self.finish[t.id] = now
            if self.orchestrator is not None:
                self.orchestrator.finished(self.info(t))
        else:
            heapq.heappush(self.events, (now + t.tool_s[turn.index], next(self.seq), "submit", t))

    def maybe_switch_tail(self, now: float) -> None:
        tail = self.policy.tail
        if tail is None or self.switched_at is not None or \
                len(self.trajectories) - len(self.finish) > len(self.live) // tail.merge * self.cost.slots:
            return
        active = [self.info(t) for t in self.trajectories if t.id not in self.finish]
        loads = [self.orchestrator.load(i) for i in active]
        if tail.should_switch(loads, len(self.live), self.cost):
            self.switch_tail(now)

    def switch_tail(self, now: float) -> None:
        """Merge each group of ``tail.merge`` instances into its first; moved turns keep their
        progress and re-prefill; the merged instance starts after the switch."""
        tail = self.policy.tail
        self.switched_at = now
        merged_cost = tail.merged_cost(self.cost)
        live = self.live
        groups = [live[k:k + tail.merge] for k in range(0, len(live) - len(live) % tail.merge, tail.merge)]
        for head, *rest in groups:
            self.advance(head, now)
            for other in rest:
                self.merge_into(head, other, now)
            head.cost = merged_cost
            for rid, (turn, left) in head.running.items():  # running turns pause for the switch
                turn.left = left
                heapq.heappush(head.waiting, (turn.key, rid, turn))
            head.running = {}
            head.progress_from = now + tail.switch_s
            self.reschedule(head, now + tail.switch_s)
        self.live = [g[0] for g in groups]

    def merge_into(self, head: _Instance, other: _Instance, now: float) -> None:
        """``other``'s turns, running (with their progress) and waiting, queue on ``head``."""
        self.advance(other, now)
        for rid, (turn, left) in other.running.items():
            turn.left = left
            heapq.heappush(head.waiting, (turn.key, rid, turn))
        for entry in other.waiting:
            heapq.heappush(head.waiting, entry)
        other.running, other.waiting = {}, []
        other.version += 1
        for s in self.state.values():
            if s["inst"] == other.iid:
                s["inst"] = head.iid


def serial_time(t: Trajectory, cost: EngineCostModel) -> float:
    """A trajectory alone on an idle engine, its context cached between turns: the makespan
    can never beat the longest of these."""
    prefill = t.prompt_len + TOOL_OUTPUT_TOKENS * (len(t.turn_tokens) - 1)
    return t.tokens * cost.iteration_s(1) + sum(t.tool_s) + prefill * cost.prefill_s_per_token


def throughput_time(trajectories: list[Trajectory], instances: int, cost: EngineCostModel) -> float:
    """Every token decoded in full batches on every instance: no schedule finishes sooner."""
    return (sum(t.tokens for t in trajectories) * cost.iteration_s(cost.slots)
            / (cost.slots * instances))


def lower_bound(trajectories: list[Trajectory], instances: int, cost: EngineCostModel) -> float:
    """The makespan lower bound: the longest trajectory alone, or the batch's throughput time."""
    return max(max(serial_time(t, cost) for t in trajectories),
               throughput_time(trajectories, instances, cost))
