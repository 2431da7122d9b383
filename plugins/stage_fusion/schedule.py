"""A fused pipeline schedule and its list-scheduling simulator.

A :class:`FusedPipelineSchedule` gives, per GPU, the order of all its tasks. Its timing follows
from the order alone: each task starts when its predecessor on the same micro-batch has ended
and its GPU has finished the task before it (FlexFusion's list-scheduling evaluation). An order
is invalid when some GPU waits forever (a task ordered before one it depends on, directly or
through other GPUs) or when it does not hold exactly the GPU's tasks.

Peak activation memory is counted per GPU and per model in micro-batch activations: a
micro-batch's activation is resident on a stage from the start of its forward there to the end
of its backward there, so the peak is the largest number of forwards minus backwards over the
prefixes of the GPU's order.

The search evaluates orders millions of times, so the simulation runs on a compact form
(:class:`Evaluator`): per GPU a list of ``(kind, local micro-batch)`` pairs, where ``kind`` is
``2 * model + phase`` (actor F, actor B, critic F, critic B) and the critic's micro-batch is
counted within its replica.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlweave.plugins.stage_fusion.problem import (
    ACTOR, BACKWARD, CRITIC, FORWARD, MODELS, FusedPipelineProblem, Task,
)

Order = list[tuple[int, int]]  # compact: (kind, local micro-batch) per position of one GPU


class InvalidSchedule(ValueError):
    """An order that cannot run: the message names the GPU and task, and why."""


@dataclass(frozen=True)
class FusedPipelineSchedule:
    """Per GPU, the order of its tasks (``orders[g]``)."""

    orders: tuple[tuple[Task, ...], ...]

    def to_json(self) -> list[list[list[str | int]]]:
        """Per GPU the ordered ``[model, micro_batch, stage, "F"|"B"]`` (the CLI's ``schedule``)."""
        return [[list(task) for task in order] for order in self.orders]

    @classmethod
    def from_json(cls, data: Sequence[Sequence[Sequence[str | int]]]) -> FusedPipelineSchedule:
        try:
            return cls(tuple(tuple(Task(str(m), int(b), int(s), str(p)) for m, b, s, p in order)
                             for order in data))
        except (TypeError, ValueError) as err:
            raise InvalidSchedule("a schedule is, per GPU, a list of [model, micro_batch, stage, "
                                  f"'F'|'B'] entries: {err}") from None


@dataclass(frozen=True)
class Simulation:
    """What an order costs. ``start``/``end``: per GPU, per position; ``peak_memory``:
    [gpus, 2] resident micro-batch activations (actor, critic)."""

    makespan: float
    peak_memory: np.ndarray
    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]

    @property
    def memory_objective(self) -> int:
        """What the memory phase lowers: the sum over GPUs and models of the peaks."""
        return int(self.peak_memory.sum())


class Evaluator:
    """Fast list-scheduling simulation of compact orders for one problem."""

    def __init__(self, problem: FusedPipelineProblem) -> None:
        self.problem = problem
        gpus = problem.gpus
        self.gpus = gpus
        stage = [list(range(gpus)), [problem.critic_stage(g) for g in range(gpus)]]
        last = [problem.actor_pp - 1, problem.critic_pp - 1]
        # Where each model's chain predecessor lives: the forward of stage s waits for stage s-1
        # (actor: GPU g-1; critic, reversed: GPU g+1); the backward of stage s for stage s+1
        # (-1: the last stage, whose backward waits for its own forward on the same GPU).
        self.fwd_pred = [[g - 1 if g > 0 else -1 for g in range(gpus)],
                         [g + 1 if stage[1][g] > 0 else -1 for g in range(gpus)]]
        self.bwd_pred = [[g + 1 if g < last[0] else -1 for g in range(gpus)],
                         [g - 1 if stage[1][g] < last[1] else -1 for g in range(gpus)]]
        costs = [problem.actor_costs, problem.critic_costs]
        # duration[g][kind]
        self.duration = [[costs[j].fwd[stage[j][g]] if ph == 0 else costs[j].bwd[stage[j][g]]
                          for j in (0, 1) for ph in (0, 1)] for g in range(gpus)]
        self.local_mb = (problem.actor_mb, problem.critic_mb)
        self.stage = stage

    def times(self, orders: Sequence[Order]) -> tuple[list[list[float]], list[list[float]]] | None:
        """Start and end of every position, or ``None`` if the orders deadlock."""
        starts, ends, ran = self.run(orders)
        return None if any(r < len(o) for r, o in zip(ran, orders)) else (starts, ends)

    def run(self, orders: Sequence[Order]) -> tuple[list[list[float]], list[list[float]], list[int]]:
        """Simulate as far as the orders go: starts, ends, and per GPU how many tasks ran."""
        gpus = self.gpus
        m0, m1 = self.local_mb
        # end[kind][g][k]: end time of that task (-1: not yet run)
        end = [[[-1.0] * (m0 if kind < 2 else m1) for _ in range(gpus)] for kind in range(4)]
        starts = [[0.0] * len(o) for o in orders]
        ends = [[0.0] * len(o) for o in orders]
        ptr = [0] * gpus
        free = [0.0] * gpus
        fwd_pred, bwd_pred, duration = self.fwd_pred, self.bwd_pred, self.duration
        remaining = sum(len(o) for o in orders)
        progress = True
        while remaining and progress:
            progress = False
            for g in range(gpus):
                order, p, t = orders[g], ptr[g], free[g]
                n, dur, st_g, en_g = len(order), duration[g], starts[g], ends[g]
                while p < n:
                    kind, k = order[p]
                    j = kind >> 1
                    if kind & 1:
                        pg = bwd_pred[j][g]
                        ready = end[kind][pg][k] if pg >= 0 else end[kind - 1][g][k]
                    else:
                        pg = fwd_pred[j][g]
                        ready = end[kind][pg][k] if pg >= 0 else 0.0
                    if ready < 0:
                        break
                    if ready > t:
                        t = ready
                    st_g[p] = t
                    t += dur[kind]
                    en_g[p] = t
                    end[kind][g][k] = t
                    p += 1
                if p != ptr[g]:
                    remaining -= p - ptr[g]
                    ptr[g], free[g] = p, t
                    progress = True
        return starts, ends, ptr

    def makespan(self, orders: Sequence[Order]) -> float | None:
        timed = self.times(orders)
        return None if timed is None else max(e[-1] for e in timed[1] if e)

    @staticmethod
    def peak_memory(orders: Sequence[Order]) -> np.ndarray:
        """[gpus, 2]: the most resident activations of each model on each GPU."""
        peaks = np.zeros((len(orders), 2), dtype=np.int64)
        for g, order in enumerate(orders):
            live = [0, 0]
            for kind, _ in order:
                j = kind >> 1
                live[j] += -1 if kind & 1 else 1
                if live[j] > peaks[g, j]:
                    peaks[g, j] = live[j]
        return peaks

    @staticmethod
    def resident_peak(orders: Sequence[Order]) -> np.ndarray:
        """[gpus]: the most activations of both models resident together on each GPU (what a
        memory cap bounds; the two models' peaks need not coincide)."""
        peaks = np.zeros(len(orders), dtype=np.int64)
        for g, order in enumerate(orders):
            live = 0
            for kind, _ in order:
                live += -1 if kind & 1 else 1
                peaks[g] = max(peaks[g], live)
        return peaks

    # conversion between compact orders and tasks
    def compact(self, schedule: FusedPipelineSchedule) -> list[Order]:
        problem = self.problem
        out = []
        for g, order in enumerate(schedule.orders):
            offset = problem.critic_replica(g) * problem.critic_mb
            out.append([(2 * MODELS.index(t.model) + (t.phase == BACKWARD),
                         t.micro_batch - (offset if t.model == CRITIC else 0)) for t in order])
        return out

    def expand(self, orders: Sequence[Order]) -> FusedPipelineSchedule:
        problem = self.problem
        result = []
        for g, order in enumerate(orders):
            offset = problem.critic_replica(g) * problem.critic_mb
            result.append(tuple(
                Task(MODELS[kind >> 1], k + (offset if kind >> 1 else 0), self.stage[kind >> 1][g],
                     BACKWARD if kind & 1 else FORWARD) for kind, k in order))
        return FusedPipelineSchedule(tuple(result))


def check(problem: FusedPipelineProblem, schedule: FusedPipelineSchedule) -> list[Order]:
    """The compact orders of a valid schedule; :class:`InvalidSchedule` naming the first fault."""
    if len(schedule.orders) != problem.gpus:
        raise InvalidSchedule(f"the schedule has {len(schedule.orders)} GPU orders; the problem "
                              f"has {problem.gpus} GPUs (one per actor stage).")
    for g, order in enumerate(schedule.orders):
        want, got = Counter(problem.tasks(g)), Counter(order)
        if want != got:
            missing, extra = sorted(want - got), sorted(got - want)
            raise InvalidSchedule(f"GPU {g} must run each of its tasks exactly once; "
                                  f"missing {_names(missing)}, not its own or repeated {_names(extra)}.")
    evaluator = Evaluator(problem)
    orders = evaluator.compact(schedule)
    ran = evaluator.run(orders)[2]
    if any(r < len(o) for r, o in zip(ran, orders)):
        raise InvalidSchedule(_deadlock(problem, schedule, ran))
    return orders


def simulate(problem: FusedPipelineProblem, schedule: FusedPipelineSchedule) -> Simulation:
    """Makespan, peak memory and every task's start and end; raises :class:`InvalidSchedule`."""
    orders = check(problem, schedule)
    evaluator = Evaluator(problem)
    starts, ends = evaluator.times(orders)  # type: ignore[misc]
    return Simulation(max(e[-1] for e in ends if e), evaluator.peak_memory(orders),
                      tuple(map(tuple, starts)), tuple(map(tuple, ends)))


def _deadlock(problem: FusedPipelineProblem, schedule: FusedPipelineSchedule, ptr: list[int]) -> str:
    """Say which task waits for which, where no GPU can go on (``ptr``: tasks each GPU ran)."""
    blocked = [(g, ptr[g]) for g, order in enumerate(schedule.orders) if ptr[g] < len(order)]
    for g, p in blocked:  # the plainest fault first: a task ordered before its own GPU's predecessor
        later = {task: i for i, task in enumerate(schedule.orders[g]) if i >= p}
        inverted = [(i, t) for t, i in later.items() if later.get(problem.predecessor(t), -1) > i]  # type: ignore[arg-type]
        if inverted:
            p, task = min(inverted)
            break
    else:
        g, p = blocked[0]
        task = schedule.orders[g][p]
    pred = problem.predecessor(task)
    assert pred is not None
    return (f"dependency violated: GPU {g} runs {_name(task)} at position {p}, which needs "
            f"{_name(pred)} (GPU {problem.gpu(pred.model, pred.micro_batch, pred.stage)}) first, "
            "but that task can never run before it; order each micro-batch's forward stage by "
            "stage and its backward after its forward, in reverse.")


def _name(task: Task) -> str:
    return f"{task.model} {'forward' if task.phase == FORWARD else 'backward'} of micro-batch " \
           f"{task.micro_batch} at stage {task.stage}"


def _names(tasks: list[Task]) -> str:
    shown = ", ".join(f"{t.model}/{t.micro_batch}/{t.stage}/{t.phase}" for t in tasks[:4])
    return (shown + (f" and {len(tasks) - 4} more" if len(tasks) > 4 else "")) or "none"


__all__ = ["ACTOR", "CRITIC", "Evaluator", "FusedPipelineSchedule", "InvalidSchedule", "Simulation",
           "check", "simulate"]
