"""Discrete-event simulation of an agentic rollout over continuous-batching engine instances.

A planning tool, not a result: it extrapolates ``rlweave bench agentic`` to cluster scale from
the per-iteration cost measured on the real engine (:class:`EngineCostModel`). The engines are
:mod:`rlweave.sim`'s fluid, eager simulator (each instance runs up to ``slots`` turns an
iteration; a turn is admitted when the agent loop submits it, its prefill stalling the batch);
this module is the agent loop around it: a finished turn enters its tool call, after which the
next turn is placed and queued again. An instance's prefix cache keeps a trajectory's context
between its turns, so a turn prefills only what is new there (a migrated turn re-prefills its
whole context; a preempted one, swapped back in, its context and what it had made).

Policies are the same objects the real run uses: verl's sticky least-loaded balancer logic and
FCFS queues, or rlweave's :class:`TrajectoryOrchestrator` with priority queues, told what the
agent loop tells it (each trajectory's start, its turns' starts and ends, its finish). The
preemptive queue and tail parallelism (:mod:`.agentic_tail`) are simulated ablations only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlweave.benchmarks.agentic_tail import TailParallelism
from rlweave.benchmarks.agentic_workload import TOOL_OUTPUT_TOKENS, Trajectory
from rlweave.plugins.agentic_rollout.orchestrator import TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.sim import KeepRunning, Request, ShortestRemainingPreempts, Simulator
from rlweave.types import InstanceLoad, TrajectoryInfo


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
    return _AgentLoop(trajectories, instances, cost, _Policy(placement, queue, orchestrator, seed, tail)).run()


class _AgentLoop:
    """The agent loops of one rollout around :class:`rlweave.sim.Simulator`: its placement (each
    turn on arrival), queue order (the key the turn was submitted with), prefill rule (the
    instance's prefix cache) and listener (starts, preemptions, finishes, the tail switch)."""

    def __init__(self, trajectories: list[Trajectory], instances: int, cost: EngineCostModel,
                 policy: _Policy) -> None:
        self.trajectories, self.cost, self.policy = trajectories, cost, policy
        self.orchestrator = policy.orchestrator
        self.rng = random.Random(policy.seed)
        self.live = list(range(instances))  # instances placement may use (merging retires some)
        self.switched_at: float | None = None
        self.sticky: dict[str, int] = {}
        self.inflight = [0] * instances
        self.state = {t.id: {"turns": 0, "tokens": 0, "inst": None} for t in trajectories}
        self.queueing = {t.id: 0.0 for t in trajectories}
        self.cached: dict[tuple[int, str], int] = {}  # (instance, trajectory) -> context tokens cached
        self.finish: dict[str, float] = {}
        self.turns: list[tuple[Trajectory, int]] = []  # request id -> (trajectory, turn)
        self.keys: dict[int, tuple] = {}
        self.queued_since: dict[int, float] = {}
        preemption = ShortestRemainingPreempts(recompute=True) if policy.queue == "preemptive" else KeepRunning()
        self.sim = Simulator([cost] * instances, order=self, preemption=preemption, placement=self, fluid=True,
                             eager=True, prefill=self, listener=self)

    def run(self) -> SimResult:
        if self.orchestrator is not None:
            for t in self.trajectories:
                self.orchestrator.started(self.info(t))
        for t in self.trajectories:
            self.submit(t, 0.0)
        self.sim.run()
        return SimResult(max(self.finish.values()), self.queueing, self.finish,
                         self.orchestrator.migrations if self.orchestrator is not None else 0, self.switched_at)

    def info(self, t: Trajectory) -> TrajectoryInfo:
        s = self.state[t.id]
        turn = min(s["turns"], len(t.turn_tokens) - 1)
        inst = None if s["inst"] is None else f"i{s['inst']}"
        return TrajectoryInfo(t.id, t.group, s["turns"], s["tokens"], inst, t.task, t.prompt_len,
                              t.context_before(turn))

    def _priority(self, t: Trajectory) -> int:
        """The turn's engine priority: the plugin's, or, where it leaves the decision to the
        framework (``None``), the priority verl's agent loops give every turn (none: 0)."""
        decided = self.orchestrator.priority(self.info(t))
        return 0 if decided is None else decided

    def submit(self, t: Trajectory, at: float) -> None:
        """The trajectory's next turn reaches the agent loop at ``at``."""
        turn = self.state[t.id]["turns"]
        self.turns.append((t, turn))
        self.sim.submit([Request(len(self.turns) - 1, at, float(t.turn_tokens[turn]))])

    # -- placement: as rlweave's agent loop, report the turn and take its priority, then acquire
    def arrive(self, sim: Simulator, requests: list[Request], now: float) -> None:
        for r in requests:
            t, _ = self.turns[r.id]
            if self.orchestrator is not None:
                self.orchestrator.turn_started(self.info(t), now)
            self.keys[r.id] = (self._priority(t), now) if self.policy.queue != "fcfs" else (now,)
            self.queued_since[r.id] = now
            k = self.state[t.id]["inst"] = self.place(t, now)
            self.inflight[k] += 1
            sim.enqueue(k, [r], now)

    def refill(self, sim: Simulator, engine: int, now: float) -> None:
        """Nothing is held back: every turn was placed on arrival."""

    def place(self, t: Trajectory, now: float) -> int:
        """The orchestrator's choice, or, with sticky placement or when it leaves the choice to
        the framework (its predictions not shown skilled), verl's sticky least-in-flight."""
        if self.policy.placement == "heddle":
            loads = [InstanceLoad(f"i{k}", self.sim.running(k), self.sim.waiting(k)) for k in self.live]
            chosen = self.orchestrator.choose_instance(self.info(t), loads, now)
            if chosen is not None:
                return int(chosen[1:])
        k = self.sticky.get(t.id)
        if k is None or k not in self.live:
            low = min(self.inflight)
            k = self.sticky[t.id] = self.rng.choice([j for j, v in enumerate(self.inflight) if v == low])
        return k

    # -- queue order and prefill rule
    def key(self, request: Request, left: float) -> tuple:
        """The turn's priority when it was submitted (FCFS: its submission time)."""
        return self.keys[request.id]

    def tokens(self, sim: Simulator, request: int, engine: int, displaced: bool) -> float:
        """vLLM's prefix cache holds the trajectory's context where its last turn ran; a turn
        swapped in by preemption recomputes its context and the tokens it had made."""
        t, turn = self.turns[request]
        if displaced:
            return t.context_before(turn) + int(t.turn_tokens[turn] - sim.left[request])
        return max(t.context_before(turn) - self.cached.get((engine, t.id), 0), 0)

    # -- listener
    def started(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        self.queueing[self.turns[request][0].id] += now - self.queued_since[request]

    def preempted(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        self.queued_since[request] = now

    def finished(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        """Its context stays cached there; the trajectory finishes or calls its tool."""
        t, turn = self.turns[request]
        s = self.state[t.id]
        self.inflight[engine] -= 1
        self.cached[(engine, t.id)] = t.context_before(turn) + t.turn_tokens[turn]
        s["turns"] += 1
        s["tokens"] += t.turn_tokens[turn]
        if self.orchestrator is not None:
            self.orchestrator.turn_ended(self.info(t), now)
        if s["turns"] == len(t.turn_tokens):
            self.finish[t.id] = now
            if self.orchestrator is not None:
                self.orchestrator.finished(self.info(t))
        else:
            self.submit(t, now + t.tool_s[turn])

    def boundary(self, sim: Simulator, engine: int, now: float) -> None:
        """After each iteration boundary: maybe switch the tail."""
        tail = self.policy.tail
        if tail is None or self.switched_at is not None or \
                len(self.trajectories) - len(self.finish) > len(self.live) // tail.merge * self.cost.slots:
            return
        active = [self.info(t) for t in self.trajectories if t.id not in self.finish]
        if tail.should_switch([self.orchestrator.load(i) for i in active], len(self.live), self.cost):
            self.switch_tail(now)

    def switch_tail(self, now: float) -> None:
        """Merge each group of ``tail.merge`` instances into its first; moved turns keep their
        progress and re-prefill; the merged instance starts after the switch."""
        tail = self.policy.tail
        self.switched_at = now
        live = self.live
        groups = [live[k:k + tail.merge] for k in range(0, len(live) - len(live) % tail.merge, tail.merge)]
        for head, *rest in groups:
            for s in self.state.values():
                if s["inst"] in rest:
                    s["inst"] = head
            self.sim.rebuild(head, rest, tail.merged_cost(self.cost), now + tail.switch_s, now)
        self.live = [g[0] for g in groups]


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
