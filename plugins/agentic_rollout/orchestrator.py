"""Heddle's three decisions per trajectory turn: when (priority), where (placement, migration).

One :class:`TrajectoryOrchestrator` sees every turn of every trajectory of a rollout (verl: the
request load balancer actor; the benchmark: its client). Per turn it

- refreshes the trajectory's predicted remaining time (:mod:`.predictor`), converts it to an
  engine priority that grows with predicted remaining work and with the queueing the trajectory
  has already suffered (progressive priority: the critical path stops waiting), and
- places the turn. The presorted partition of all active trajectories over the instances
  (:mod:`.placement`, refreshed at most every ``replan_s``) names each trajectory's preferred
  instance. A turn goes there unless that would make it queue while another instance could start
  it at once: the orchestrator places every turn, so it knows how many more urgent turns each
  instance holds, and picks the instance where this turn waits behind the fewest (the plan's
  choice, then the current instance, break ties). A trajectory whose turn follows a tool call
  thereby moves (migrates) when re-prefilling its context elsewhere costs less than
  ``migrate_fraction`` of its predicted remaining time. Migration re-sends the whole context to
  the new instance, so the tokens it generates are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from rlweave.plugins.agentic_rollout.placement import (
    EngineCostModel,
    TrajectoryLoad,
    assign_runs,
    presorted_partition,
)
from rlweave.plugins.agentic_rollout.predictor import RemainingWorkPredictor
from rlweave.types import InstanceLoad, TrajectoryInfo


@dataclass(frozen=True)
class OrchestratorSettings:
    queue_weight: float = 1.0  # seconds of urgency per second already spent queueing
    replan_s: float = 0.25
    migrate_fraction: float = 0.1
    prior_tool_s: float = 0.5


_KEPT_WHEN_EMPTY = ("task", "group_id", "prompt_len", "queued_s")


@dataclass
class _Trajectory:
    info: TrajectoryInfo
    tool_started_s: float | None = None
    in_turn_at: str | None = None  # instance serving its current turn, None between turns
    priority: int = 0


@dataclass
class TrajectoryOrchestrator:
    cost: EngineCostModel
    settings: OrchestratorSettings = field(default_factory=OrchestratorSettings)
    predictor: RemainingWorkPredictor = field(default_factory=RemainingWorkPredictor)
    migrations: int = 0
    _active: dict[str, _Trajectory] = field(default_factory=dict)
    _placed: dict[str, str] = field(default_factory=dict)
    _plan: dict[str, str] = field(default_factory=dict)
    _plan_time: float = float("-inf")
    _plan_instances: tuple[str, ...] = ()
    _tool_s_sum: float = 0.0
    _tool_calls: int = 0
    _in_turn: dict[str, dict[str, int]] = field(default_factory=dict)  # instance -> id -> priority

    # -- what the adapter reports -------------------------------------------------------------
    def started(self, trajectory: TrajectoryInfo) -> None:
        self._active[trajectory.trajectory_id] = _Trajectory(trajectory)

    def tool_started(self, trajectory: TrajectoryInfo, now: float) -> None:
        t = self._track(trajectory)
        t.tool_started_s = now
        self._leave_turn(t)

    def tool_ended(self, trajectory: TrajectoryInfo, now: float) -> None:
        t = self._track(trajectory)
        if t.tool_started_s is not None:
            self._tool_s_sum += now - t.tool_started_s
            self._tool_calls += 1
            t.tool_started_s = None

    def finished(self, trajectory: TrajectoryInfo) -> None:
        """Learn from a finished trajectory; a second report of the same one is ignored."""
        if trajectory.trajectory_id not in self._active:
            return
        t = self._track(trajectory)
        info = t.info
        self._leave_turn(t)
        del self._active[trajectory.trajectory_id]
        self._placed.pop(trajectory.trajectory_id, None)
        self.predictor.observe_finished(info.task, info.group_id, info.turns_done,
                                        info.tokens_so_far)

    # -- decisions ------------------------------------------------------------------------------
    def remaining_s(self, trajectory: TrajectoryInfo) -> float:
        load = self.load(trajectory)
        return load.remaining_tokens * self.cost.iteration_s(self.cost.slots) + load.remaining_tool_s

    def priority(self, trajectory: TrajectoryInfo) -> int:
        """vLLM priority (smaller runs first) in milliseconds of negative urgency."""
        info = self._track(trajectory).info
        urgency = self.remaining_s(info) + self.settings.queue_weight * info.queued_s
        return -round(urgency * 1000)

    def _queue_position(self, instance_id: str, priority: int) -> int:
        """0 when an instance has a free slot for a turn of ``priority``; otherwise 1 (the next
        slot to free) plus the more urgent turns that would be waiting before it."""
        turns = self._in_turn.get(instance_id, {})
        if len(turns) < self.cost.slots:
            return 0
        urgent = sum(1 for p in turns.values() if p <= priority)
        return 1 + max(urgent - self.cost.slots, 0)

    def choose_instance(self, trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad],
                        now: float) -> str:
        mine = self._track(trajectory)
        trajectory = mine.info
        ids = tuple(i.instance_id for i in instances)
        if not ids:
            raise ValueError("no engine instance to place a trajectory on")
        tid = trajectory.trajectory_id
        stale = now - self._plan_time > self.settings.replan_s
        if stale or ids != self._plan_instances or tid not in self._plan:
            self._replan(ids, now)
        planned = self._plan[tid]
        current = trajectory.instance_id if trajectory.instance_id in ids else None
        mine.priority = self.priority(trajectory)
        if current is not None and not self._migration_pays(trajectory):
            target = current
        else:
            target = min(ids, key=lambda i: (self._queue_position(i, mine.priority),
                                             i != current, i != planned))
        if current is not None and target != current:
            self.migrations += 1
        self._leave_turn(mine)
        self._placed[tid] = mine.in_turn_at = target
        self._in_turn.setdefault(target, {})[tid] = mine.priority
        return target

    # -- internals ------------------------------------------------------------------------------
    def _track(self, trajectory: TrajectoryInfo) -> _Trajectory:
        """The trajectory's record, updated with ``trajectory``. Fields a caller leaves empty
        keep what an earlier caller reported: verl's balancer knows request ids only, the agent
        loop knows the task, group, prompt and queueing."""
        t = self._active.get(trajectory.trajectory_id)
        if t is None:
            t = self._active[trajectory.trajectory_id] = _Trajectory(trajectory)
        else:
            kept = {f: getattr(t.info, f) for f in _KEPT_WHEN_EMPTY if not getattr(trajectory, f)}
            t.info = replace(trajectory, **kept)
        return t

    def _leave_turn(self, t: _Trajectory) -> None:
        if t.in_turn_at is not None:
            self._in_turn.get(t.in_turn_at, {}).pop(t.info.trajectory_id, None)
            t.in_turn_at = None

    def _mean_tool_s(self) -> float:
        return self._tool_s_sum / self._tool_calls if self._tool_calls else self.settings.prior_tool_s

    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        """Predicted remaining decode tokens and tool time (placement's and parallelism's input)."""
        p = self.predictor.predict(trajectory.task, trajectory.group_id, trajectory.turns_done,
                                   trajectory.tokens_so_far)
        # Every remaining turn but the last is followed by a tool call.
        tool_s = max(p.remaining_turns - 1.0, 0.0) * self._mean_tool_s()
        return TrajectoryLoad(trajectory.trajectory_id, p.remaining_tokens, tool_s)

    def _replan(self, instance_ids: tuple[str, ...], now: float) -> None:
        loads = [self.load(t.info) for t in self._active.values()]
        runs = presorted_partition(loads, len(instance_ids), self.cost)
        self._plan = assign_runs(runs, instance_ids, self._placed)
        self._plan_time, self._plan_instances = now, instance_ids

    def _migration_pays(self, trajectory: TrajectoryInfo) -> bool:
        context = trajectory.prompt_len + trajectory.tokens_so_far
        reprefill_s = context * self.cost.prefill_s_per_token
        return reprefill_s < self.settings.migrate_fraction * self.remaining_s(trajectory)
