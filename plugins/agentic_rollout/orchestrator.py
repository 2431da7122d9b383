"""Heddle's decisions per trajectory turn: when (priority) and where (placement, migration).

One :class:`TrajectoryOrchestrator` sees every turn of every trajectory of a rollout (verl: in
the request balancer actor, which the agent loops report to and which places every turn). From
the agent loop's reports (a trajectory's start, each turn's start and end, its finish) it learns
(:mod:`.predictor`) and, before each turn,

- gives the turn an engine priority: the trajectory's predicted remaining serial time (its
  remaining turns' generation at the engine's time per token, plus its remaining tool calls),
  longest first, so that the critical path stops waiting behind short trajectories;
- places the turn. The presorted balance of all active trajectories over the instances
  (:mod:`.placement`, refreshed at most every ``replan_s``) names each trajectory's preferred
  instance. A turn goes there unless that would make it queue while another instance could start
  it at once: the orchestrator places every turn, so it knows how many more urgent turns each
  instance holds, and picks the instance where this turn waits behind the fewest (the current
  instance, then the plan's choice, break ties). A trajectory moves (migrates) only when
  re-prefilling its context elsewhere costs less than ``migrate_fraction`` of its predicted
  remaining time. Migration re-sends the whole context to the new instance, so the tokens it
  generates are unchanged.

All of this is followed only while the predictions have shown skill (:mod:`.skill`): each
finished trajectory scores what was predicted for it (in batches that began with an earlier
batch's history: the predictions of a first batch, learned from nothing, say little of those
that follow), and once a scored ranking stands less than ``skill_z`` standard errors above
none on the batches scored so far, the framework decides both: every turn keeps the
priority the framework gives it (verl's agent loops: none, the engine's first come, first
served) and the framework places it (verl: sticky, least in-flight; no migration). Where nothing can be learned, rlweave then does what verl
does; it keeps predicting and scoring, so its decisions come back as skill appears. Before
any batch is scored (a run's first two batches) the decisions are Heddle's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlweave.plugins.agentic_rollout.placement import (
    EngineCostModel,
    TrajectoryLoad,
    presorted_balance,
)
from rlweave.plugins.agentic_rollout.predictor import SerialTimePredictor
from rlweave.plugins.agentic_rollout.skill import PredictiveSkill, realised_remaining_s
from rlweave.types import InstanceLoad, TrajectoryInfo


@dataclass(frozen=True)
class OrchestratorSettings:
    replan_s: float = 0.25
    migrate_fraction: float = 0.1
    # Follow the predictions once their measured skill is this many standard errors above none
    # (one-sided, about 2% of no-skill batches pass); None: always (the oracle, ablations).
    skill_z: float | None = 2.0


@dataclass
class _Running:
    """Count, mean and sum of squared deviations of a stream of values (Welford)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def sum_count(self) -> tuple[float, int]:
        return self.mean * self.n, self.n

    @property
    def summary(self) -> tuple[int, float, float]:
        return self.n, self.mean, self.m2


@dataclass
class _Trajectory:
    info: TrajectoryInfo
    turn_ended_s: float | None = None
    own_tokens: _Running = field(default_factory=lambda: _Running())  # its turns' tokens
    own_tools: _Running = field(default_factory=lambda: _Running())  # seconds between its turns
    in_turn_at: str | None = None  # instance serving its current turn, None between turns
    priority: int = 0
    turn_tokens: list[int] = field(default_factory=list)  # what skill is scored against
    tool_s: list[float] = field(default_factory=list)
    predicted_s: dict[int, float] = field(default_factory=dict)  # turns done -> predicted remaining


@dataclass
class TrajectoryOrchestrator:
    cost: EngineCostModel
    settings: OrchestratorSettings = field(default_factory=OrchestratorSettings)
    predictor: SerialTimePredictor = field(default_factory=SerialTimePredictor)
    migrations: int = 0
    _active: dict[str, _Trajectory] = field(default_factory=dict)
    _placed: dict[str, str] = field(default_factory=dict)
    _plan: dict[str, str] = field(default_factory=dict)
    _plan_time: float = float("-inf")
    _plan_instances: tuple[str, ...] = ()
    _in_turn: dict[str, dict[str, int]] = field(default_factory=dict)  # instance -> id -> priority
    _groups: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> id -> turns done
    skill: PredictiveSkill = field(default_factory=PredictiveSkill)
    _scoring: bool = False  # this batch's predictions drew on earlier batches' history

    def __post_init__(self) -> None:
        self.skill.decay = self.predictor.decay  # skill ages as the history it measures

    @property
    def following(self) -> bool:
        """Whether the predictions decide, or the framework's defaults: the latter only on
        evidence, once a scored batch's ranking stood less than ``skill_z`` standard errors
        above no skill (before any batch is scored, Heddle's own decisions)."""
        needed = self.settings.skill_z
        return needed is None or not self.skill.scored or self.skill.z >= needed

    @property
    def per_token_s(self) -> float:
        """Decode time per token on a busy engine (a full batch): the contended regime."""
        return self.cost.iteration_s(self.cost.slots)

    # -- what the agent loop reports ------------------------------------------------------------
    def started(self, trajectory: TrajectoryInfo) -> None:
        if not self._active:  # a new rollout batch: the previous one's history ages
            self.predictor.new_batch()
            self.skill.close_batch()
            self._scoring = self.predictor.has_history()
        self._active[trajectory.trajectory_id] = _Trajectory(trajectory)
        self._groups.setdefault(trajectory.group_id, {})[trajectory.trajectory_id] = trajectory.turns_done

    def turn_started(self, trajectory: TrajectoryInfo, now: float) -> None:
        t = self._track(trajectory)
        if t.turn_ended_s is not None:  # the time since the last turn ended: its tool calls
            gap = max(now - t.turn_ended_s, 0.0)
            t.own_tools.add(gap)
            t.tool_s.append(gap)
            self.predictor.observe_tool(t.info.task, t.info.group_id, gap)
            t.turn_ended_s = None

    def turn_ended(self, trajectory: TrajectoryInfo, now: float) -> None:
        t = self._active.get(trajectory.trajectory_id)
        if t is None:
            return
        generated = max(trajectory.tokens_so_far - t.info.tokens_so_far, 0)
        t.info = replace(trajectory, instance_id=t.info.instance_id)
        t.own_tokens.add(generated)
        t.turn_tokens.append(generated)
        self._groups.setdefault(t.info.group_id, {})[t.info.trajectory_id] = t.info.turns_done
        self.predictor.observe_turn(t.info.task, t.info.group_id, generated)
        t.turn_ended_s = now
        self._leave_turn(t)

    def finished(self, trajectory: TrajectoryInfo) -> None:
        """Learn from a finished trajectory; a second report of the same one is ignored."""
        t = self._active.pop(trajectory.trajectory_id, None)
        if t is None:
            return
        self._leave_turn(t)
        self._placed.pop(trajectory.trajectory_id, None)
        siblings = self._groups.get(t.info.group_id, {})
        siblings.pop(trajectory.trajectory_id, None)
        if not siblings:
            self._groups.pop(t.info.group_id, None)
        self.predictor.observe_finished(t.info.task, t.info.group_id, trajectory.turns_done,
                                        t.own_tokens.summary, t.own_tools.summary)
        if self._scoring:  # a first batch's predictions, learned from nothing, say little of later ones'
            self.skill.record(t.predicted_s, realised_remaining_s(t.turn_tokens, t.tool_s, self.per_token_s))

    # -- decisions ------------------------------------------------------------------------------
    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        """Predicted remaining decode tokens and tool time (placement's input)."""
        t = self._active.get(trajectory.trajectory_id)
        own = (t.own_tokens.sum_count, t.own_tools.sum_count) if t else ((0.0, 0), (0.0, 0))
        group = self._groups.get(trajectory.group_id, {})
        siblings = tuple(n for tid, n in group.items() if tid != trajectory.trajectory_id)
        p = self.predictor.predict(trajectory.task, trajectory.group_id, trajectory.turns_done, *own,
                                   siblings_running=siblings)
        return TrajectoryLoad(trajectory.trajectory_id, p.remaining_tokens, p.remaining_tool_s)

    def remaining_s(self, trajectory: TrajectoryInfo) -> float:
        """Predicted remaining serial time: generation at the busy engine's pace, plus tools."""
        load = self.load(trajectory)
        return load.remaining_tokens * self.per_token_s + load.remaining_tool_s

    def priority(self, trajectory: TrajectoryInfo) -> int | None:
        """vLLM priority (smaller runs first): minus the remaining serial time in milliseconds,
        or ``None`` while the predictions show no skill: the framework's own priority then, as
        placement is the framework's own. The prediction is made and kept either way, to be
        scored when the trajectory finishes."""
        t = self._active.get(trajectory.trajectory_id)
        info = t.info if t is not None else trajectory
        remaining = self.remaining_s(info)
        priority = -round(remaining * 1000) if self.following else None
        if t is not None:
            t.priority = 0 if priority is None else priority
            t.predicted_s[info.turns_done] = remaining
        return priority

    def _queue_position(self, instance_id: str, priority: int) -> int:
        """0 when an instance has a free slot for a turn of ``priority``; otherwise 1 (the next
        slot to free) plus the more urgent turns that would be waiting before it."""
        turns = self._in_turn.get(instance_id, {})
        if len(turns) < self.cost.slots:
            return 0
        urgent = sum(1 for p in turns.values() if p <= priority)
        return 1 + max(urgent - self.cost.slots, 0)

    def choose_instance(self, trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad],
                        now: float) -> str | None:
        """The instance for the trajectory's next turn; ``None`` for a trajectory no agent loop
        reported, or while the predictions show no skill (the framework's own choice then)."""
        mine = self._active.get(trajectory.trajectory_id)
        if mine is None or not self.following:
            return None
        ids = tuple(i.instance_id for i in instances)
        if not ids:
            raise ValueError("no engine instance to place a trajectory on")
        tid = trajectory.trajectory_id
        if now - self._plan_time > self.settings.replan_s or ids != self._plan_instances \
                or tid not in self._plan:
            self._replan(ids, now)
        planned = self._plan[tid]
        previous = trajectory.instance_id or mine.info.instance_id
        current = previous if previous in ids else None
        context = max(trajectory.context_len, mine.info.context_len)
        if current is not None and not self._migration_pays(mine.info, context):
            target = current
        else:
            target = min(ids, key=lambda i: (self._queue_position(i, mine.priority),
                                             i != current, i != planned))
        if current is not None and target != current:
            self.migrations += 1
        self._leave_turn(mine)
        mine.info = replace(mine.info, instance_id=target)
        self._placed[tid] = mine.in_turn_at = target
        self._in_turn.setdefault(target, {})[tid] = mine.priority
        return target

    # -- persistence ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"predictor": self.predictor.state_dict(), "skill": self.skill.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state saved before skill was scored has none: the predictions must show it again."""
        self.predictor.load_state_dict(state["predictor"])
        self.skill.load_state_dict(state.get("skill", {"s": 0.0, "var": 0.0}))

    # -- internals ------------------------------------------------------------------------------
    def _track(self, trajectory: TrajectoryInfo) -> _Trajectory:
        """The trajectory's record with the agent loop's latest view of it (a trajectory first
        seen mid-way, e.g. after a restart, is tracked from here)."""
        t = self._active.get(trajectory.trajectory_id)
        if t is None:
            self.started(trajectory)
            t = self._active[trajectory.trajectory_id]
        t.info = replace(trajectory, instance_id=trajectory.instance_id or t.info.instance_id)
        return t

    def _leave_turn(self, t: _Trajectory) -> None:
        if t.in_turn_at is not None:
            self._in_turn.get(t.in_turn_at, {}).pop(t.info.trajectory_id, None)
            t.in_turn_at = None

    def _replan(self, instance_ids: tuple[str, ...], now: float) -> None:
        loads = [self.load(t.info) for t in self._active.values()]
        self._plan = presorted_balance(loads, instance_ids, self.cost, self._placed)
        self._plan_time, self._plan_instances = now, instance_ids

    def _migration_pays(self, trajectory: TrajectoryInfo, context: int) -> bool:
        context = max(context, trajectory.prompt_len + trajectory.tokens_so_far)
        reprefill_s = context * self.cost.prefill_s_per_token
        return reprefill_s < self.settings.migrate_fraction * self.remaining_s(trajectory)
