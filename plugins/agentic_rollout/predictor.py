"""Predicted remaining serial time of a trajectory: what lies on Heddle's critical path.

A trajectory's remaining serial time is how long it still takes if it never waits for an engine:
each remaining turn's generation and, between turns, its tool calls. In a synchronous rollout
every trajectory starts together, so the batch ends when the trajectory with the longest
remaining serial time, plus the queueing it still meets, ends: serving that one first is what
shortens the makespan (time already queued is sunk, the same for every ordering).

The predictor learns three quantities from what the agent loop reports, each at levels that
shrink towards one another (a level with few observations leans on the one above it, with the
weight of ``shrink`` observations):

- turns: the conditional mean of the total turns of the task's finished trajectories that
  outlived the turns already done (having survived ten turns, a trajectory is like those that
  lasted more than ten, which is what makes a heavy tail predictable), scaled by its group's
  scale (samples of one prompt, this step's and earlier epochs': finished ones, and censored
  ones, known to last past the turns they have done: running siblings, and the trajectory
  itself; one sibling that stopped after a turn, or four that are all still going, say much
  about the rest, and a sample that outlives its siblings says its prompt runs long);
- tokens per turn and tool seconds per call: the trajectory's own turns so far, shrunk towards
  its group's, shrunk towards its task's, shrunk towards a prior. How much its own turns count
  is learned per task, from how much finished trajectories varied within themselves against
  how much they differed from one another; how much its group's count, from how much a group's
  trajectories differed against how much groups did (a prompt may set its samples' verbosity,
  while each sample's tools run in a sandbox of its own speed).

History outlives the rollout batch: each new batch weighs older observations by ``decay`` once
more, each pool keeps its ``history`` newest observations and the ``max_groups`` most recently
used groups, and :meth:`state_dict` / :meth:`load_state_dict` carry it across restarts (the
adapter keeps it with the trainer's checkpoint).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATE_VERSION = 1


@dataclass(frozen=True)
class Prediction:
    remaining_turns: float
    tokens_per_turn: float
    tool_s_per_call: float

    @property
    def remaining_tokens(self) -> float:
        return self.remaining_turns * self.tokens_per_turn

    @property
    def remaining_tool_s(self) -> float:
        """Every remaining turn but the last is followed by a tool call."""
        return max(self.remaining_turns - 1.0, 0.0) * self.tool_s_per_call


@dataclass
class _Series:
    """Observations of one quantity in one pool, with the batch each was made in."""

    values: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    _cache: tuple[int, int, np.ndarray, np.ndarray, np.ndarray] | None = None
    # batch -> [sum of its values, their count], kept as values come and go: every turn adds a
    # token count, and re-sorting the whole series for its total cost the balancer most of a
    # prediction. None until first asked (a restored series is rebuilt from its lists).
    _per_batch: dict[int, list[float]] | None = None

    def add(self, value: float, batch: int, keep: int) -> None:
        self.values.append(float(value))
        self.batches.append(batch)
        if self._per_batch is not None:
            self._count(batch, float(value), 1)
            for old, b in zip(self.values[:-keep], self.batches[:-keep], strict=True):
                self._count(b, -old, -1)
        del self.values[:-keep], self.batches[:-keep]
        self._cache = None

    def _count(self, batch: int, value: float, n: int) -> None:
        assert self._per_batch is not None
        entry = self._per_batch.setdefault(batch, [0.0, 0])
        entry[0] += value
        entry[1] += n
        if not entry[1]:
            del self._per_batch[batch]

    def _sorted(self, batch: int, decay: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Values sorted, with suffix sums of weight x value and of weight (weights decayed to
        ``batch``), so that a conditional-mean query costs O(log n)."""
        if self._cache is None or self._cache[:2] != (batch, len(self.values)):
            v = np.asarray(self.values, dtype=float)
            w = decay ** (batch - np.asarray(self.batches, dtype=float))
            order = np.argsort(v, kind="stable")
            v, w = v[order], w[order]
            wv = np.r_[np.cumsum((w * v)[::-1])[::-1], 0.0]
            ws = np.r_[np.cumsum(w[::-1])[::-1], 0.0]
            self._cache = (batch, len(self.values), v, wv, ws)
        return self._cache[2:]

    def total(self, batch: int, decay: float) -> tuple[float, float]:
        """Decayed sum of values and of weights."""
        if self._per_batch is None:
            self._per_batch = {}
            for value, b in zip(self.values, self.batches, strict=True):
                self._count(b, value, 1)
        total = weight = 0.0
        for b, (sum_, n) in self._per_batch.items():
            w = decay ** (batch - b)
            total += w * sum_
            weight += w * n
        return total, weight

    def above(self, threshold: float, batch: int, decay: float) -> tuple[float, float]:
        """Decayed sum of the values greater than ``threshold``, and of their weights."""
        if not self.values:
            return 0.0, 0.0
        v, wv, ws = self._sorted(batch, decay)
        first = int(np.searchsorted(v, threshold, side="right"))
        return float(wv[first]), float(ws[first])


@dataclass
class _Spread:
    """Per finished trajectory: its group, how many turns (or tool calls) it had, their mean and
    their sum of squared deviations, so that the spread within trajectories can be set against
    the spread between them, and the spread between a group's trajectories against the spread
    between groups."""

    rows: list[tuple[int, float, float, int, str]] = field(default_factory=list)  # n, mean, m2, batch, group
    _added: int = 0
    _cache: dict[str, tuple[tuple[int, int, float], float]] = field(default_factory=dict)

    def add(self, n: int, mean: float, m2: float, batch: int, keep: int, group: str = "") -> None:
        if n >= 1:
            self.rows.append((n, mean, m2, batch, group))
            del self.rows[:-keep]
            self._added += 1

    def cached(self, name: str, batch: int, decay: float, default: float) -> float:
        """``strength`` or ``group_strength``, computed once per batch and per finished
        trajectory: every prediction of every turn asks for them."""
        key = (batch, self._added, default)
        hit = self._cache.get(name)
        if hit is None or hit[0] != key:
            hit = self._cache[name] = (key, getattr(self, name)(batch, decay, default))
        return hit[1]

    def strength(self, batch: int, decay: float, default: float) -> float:
        """How many of a trajectory's own observations weigh as much as its group's mean: the
        within-trajectory variance over the between-trajectory variance (empirical Bayes).
        Large when a trajectory's turns are as varied as the whole task's (its own past says
        little), small when each trajectory keeps its own pace (its sandbox, its verbosity)."""
        rows = [r for r in self.rows if r[0] >= 2]
        if len(rows) < 4:
            return default
        n, mean, m2, b = (np.asarray(x, dtype=float) for x in list(zip(*rows, strict=True))[:4])
        w = decay ** (batch - b)
        within = float((w * m2).sum() / (w * (n - 1)).sum())
        return _variance_ratio(mean, w, within / n, within)

    def group_strength(self, batch: int, decay: float, default: float) -> float:
        """How many of a group's observations weigh as much as its task's mean: the variance of
        trajectory means within a group over the variance between the groups' means, times the
        observations a trajectory makes. Large when a prompt says nothing of its samples' pace
        (each sample draws its own sandbox): a group's few samples are then noise, not signal."""
        # Summed per group with numpy: every finished trajectory asks again, and a Python loop
        # per group cost the balancer about a millisecond a turn (bench agentic's depth-mix).
        grouped = [(n, mean, b, g) for n, mean, _, b, g in self.rows if g]
        if not grouped:
            return default
        n, mean, b = (np.asarray(x, dtype=float) for x in list(zip(*grouped, strict=True))[:3])
        _, group, counts = np.unique([r[3] for r in grouped], return_inverse=True, return_counts=True)
        if int((counts >= 2).sum()) < 4:
            return default
        keep = counts[group] >= 2  # a group of one sample has no spread within
        n, mean, group, w = n[keep], mean[keep], group[keep], decay ** (batch - b[keep])
        sizes = np.bincount(group).astype(float)
        sw = np.bincount(group, w)
        centres = np.bincount(group, w * mean) / np.where(sizes > 0, sw, 1.0)
        dev = mean - centres[group]
        real = sizes > 0
        sizes, sw, centres = sizes[real], sw[real], centres[real]
        dof = float((sizes - 1).sum() / sizes.sum())
        within = float((w * dev ** 2).sum() / w.sum() / dof)
        return float(n.mean()) * _variance_ratio(centres, sw / sizes, within / sizes, within)


def _variance_ratio(means: np.ndarray, w: np.ndarray, noise: np.ndarray, within: float) -> float:
    """``within`` over the variance of ``means`` (weights ``w``) less their own ``noise``: the
    shrinkage strength, clipped to [0.25, 64]."""
    centre = float((w * means).sum() / w.sum())
    between = float((w * (means - centre) ** 2).sum() / w.sum() - (w * noise).sum() / w.sum())
    return float(np.clip(within / max(between, 1e-9 * max(within, 1e-12)), 0.25, 64.0))


@dataclass
class _Pool:
    """One task's or one group's history: finished trajectories' turns, tokens of each turn,
    seconds of each tool call."""

    turns: _Series = field(default_factory=_Series)
    tokens: _Series = field(default_factory=_Series)
    tools: _Series = field(default_factory=_Series)
    token_spread: _Spread = field(default_factory=_Spread)
    tool_spread: _Spread = field(default_factory=_Spread)

    def to_dict(self, batch: int) -> dict[str, list[list[float]]]:
        out = {name: [[v, batch - b] for v, b in zip(s.values, s.batches, strict=True)]
               for name, s in (("turns", self.turns), ("tokens", self.tokens), ("tools", self.tools))}
        for name in ("token_spread", "tool_spread"):
            out[name] = [[n, m, m2, batch - b, g] for n, m, m2, b, g in getattr(self, name).rows]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, list[list[float]]], batch: int) -> _Pool:
        pool = cls()
        for name in ("turns", "tokens", "tools"):
            series = getattr(pool, name)
            for value, age in data.get(name, ()):
                series.values.append(float(value))
                series.batches.append(batch - int(age))
        for name in ("token_spread", "tool_spread"):
            getattr(pool, name).rows = [(int(n), float(m), float(m2), batch - int(age),
                                         str(group[0]) if group else "")
                                        for n, m, m2, age, *group in data.get(name, ())]
        return pool


_SPREADS = {"tokens": "token_spread", "tools": "tool_spread"}


def _shrunk(sum_: float, weight: float, towards: float, strength: float) -> float:
    return (sum_ + strength * towards) / (weight + strength)


class SerialTimePredictor:
    """``task`` keys a task or prompt family; ``group`` the samples of one prompt."""

    def __init__(self, prior_turns: float = 4.0, prior_tokens_per_turn: float = 64.0,
                 prior_tool_s: float = 0.5, shrink: float = 2.0, decay: float = 0.5,
                 history: int = 2048, max_groups: int = 65536) -> None:
        if not 0.0 < decay <= 1.0 or shrink <= 0 or history < 1 or max_groups < 1:
            raise ValueError("the predictor needs 0 < decay <= 1, shrink > 0, history >= 1 and "
                             f"max_groups >= 1 (got {decay}, {shrink}, {history}, {max_groups})")
        self.prior_turns = prior_turns
        self.prior_tokens_per_turn = prior_tokens_per_turn
        self.prior_tool_s = prior_tool_s
        self.shrink, self.decay, self.history, self.max_groups = shrink, decay, history, max_groups
        self.batch = 0
        self._tasks: dict[str, _Pool] = {}
        self._groups: OrderedDict[str, _Pool] = OrderedDict()

    # -- learning -------------------------------------------------------------------------------
    def new_batch(self) -> None:
        """A new rollout batch starts: older observations weigh ``decay`` times less."""
        self.batch += 1

    def has_history(self) -> bool:
        """Whether anything was observed (in this or an earlier batch, or restored)."""
        return bool(self._tasks)

    def _pools(self, task: str, group: str) -> tuple[_Pool, _Pool]:
        t = self._tasks.setdefault(task, _Pool())
        g = self._groups.pop(group, None) or _Pool()
        self._groups[group] = g  # most recently used last
        while len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)
        return t, g

    def observe_turn(self, task: str, group: str, tokens: int) -> None:
        for pool in self._pools(task, group):
            pool.tokens.add(tokens, self.batch, self.history)

    def observe_tool(self, task: str, group: str, seconds: float) -> None:
        for pool in self._pools(task, group):
            pool.tools.add(max(seconds, 0.0), self.batch, self.history)

    def observe_finished(self, task: str, group: str, turns: int,
                         own_tokens: tuple[int, float, float] = (0, 0.0, 0.0),
                         own_tools: tuple[int, float, float] = (0, 0.0, 0.0)) -> None:
        """``own_*``: the trajectory's count, mean and sum of squared deviations of its turns'
        tokens and its tool calls' seconds."""
        t, g = self._pools(task, group)
        for pool in (t, g):
            pool.turns.add(turns, self.batch, self.history)
        t.token_spread.add(*own_tokens, self.batch, self.history, group)
        t.tool_spread.add(*own_tools, self.batch, self.history, group)

    # -- prediction -----------------------------------------------------------------------------
    def _level_means(self, task: str, group: str, name: str, prior: float) -> float:
        """The group's mean of one quantity, shrunk towards the task's (as strongly as the task's
        groups are shown to differ), shrunk towards ``prior``."""
        b, d, k = self.batch, self.decay, self.shrink
        t, g = self._tasks.get(task), self._groups.get(group)
        est = prior if t is None else _shrunk(*getattr(t, name).total(b, d), prior, k)
        if g is not None:
            spread = getattr(t, _SPREADS[name]) if t is not None else None
            k_group = spread.cached("group_strength", b, d, k) if spread is not None else k
            est = _shrunk(*getattr(g, name).total(b, d), est, k_group)
        return est

    def _total_turns(self, task: str, group: str, done: int, siblings_running: tuple[int, ...]
                     ) -> float:
        """Expected total turns of a trajectory given that it has lasted ``done`` turns.

        The group scales the task: its samples' totals over the task's mean give its scale ``r``
        (shrunk towards 1), and a trajectory of a group of scale ``r`` that survived ``done``
        turns is expected to last ``r`` times a task trajectory that survived ``done / r``.
        The samples are finished ones and censored ones: the running siblings and the
        trajectory itself, each known to last past the turns it has done. A censored sample
        counts as its expected total given that survival, with the weight of the share of the
        task's totals it has already outlived (one at its first turn says nothing, and counting
        it as a whole sample would pull every group to the task's mean).

        Counting the trajectory's own survival keeps the estimate from pointing the wrong way on
        a mixture of depths: the siblings that finish first are the short ones, so a sample
        that outlives them is itself the evidence that its prompt runs long, and rises.
        """
        b, d, k = self.batch, self.decay, self.shrink
        pool = self._tasks.get(task)

        def outlived(x: float) -> float:
            """The task's conditional mean total over totals above ``x``. Past everything seen
            (or nothing seen): in a heavy tail the expected remainder grows with the age reached
            (Lindy), so expect half as much again, and at least one turn."""
            fallback = max(self.prior_turns, 1.5 * x, x + 1.0)
            return fallback if pool is None else _shrunk(*pool.turns.above(x, b, d), fallback, k)

        seen = pool.turns.total(b, d)[1] if pool is not None else 0.0

        def ruled_out(x: float) -> float:
            """The share of the task's totals that a trajectory still running after ``x``
            turns has outlived."""
            return 1.0 - pool.turns.above(x, b, d)[1] / seen if seen else 0.0

        mean = outlived(0.0)
        g = self._groups.get(group)
        s, w = g.turns.total(b, d) if g is not None else (0.0, 0.0)
        for c in (*siblings_running, done):
            weight = ruled_out(c)
            s, w = s + weight * outlived(c), w + weight
        scale = _shrunk(s, w, mean, k) / mean
        # Turns are whole: lasting past ``done`` is a total of at least ``done + 1``, so the
        # task's totals that count are those past ``done + 0.5`` once scaled (a scale a hair
        # above 1 must not bring back the totals equal to ``done``).
        return max(scale * outlived((done + 0.5) / scale), done + 1.0)

    def predict(self, task: str, group: str, turns_done: int,
                own_tokens: tuple[float, int] = (0.0, 0),
                own_tools: tuple[float, int] = (0.0, 0),
                siblings_running: tuple[int, ...] = ()) -> Prediction:
        """Before the trajectory's turn ``turns_done + 1``; ``own_*``: the sum and count of its
        own turns' tokens and tool calls' seconds so far; ``siblings_running``: the turns done by
        the other running samples of its group."""
        pool = self._tasks.get(task)
        b, d, k = self.batch, self.decay, self.shrink
        own_k = (pool.token_spread.cached("strength", b, d, k),
                 pool.tool_spread.cached("strength", b, d, k)) \
            if pool is not None else (k, k)
        tokens = _shrunk(*own_tokens, self._level_means(task, group, "tokens",
                                                        self.prior_tokens_per_turn), own_k[0])
        tool_s = _shrunk(*own_tools, self._level_means(task, group, "tools", self.prior_tool_s),
                         own_k[1])
        remaining = self._total_turns(task, group, turns_done, siblings_running) - turns_done
        return Prediction(remaining, tokens, tool_s)

    # -- persistence ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable history (observation ages in batches, not absolute batch numbers)."""
        return {"version": STATE_VERSION,
                "tasks": {k: p.to_dict(self.batch) for k, p in self._tasks.items()},
                "groups": {k: p.to_dict(self.batch) for k, p in self._groups.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"predictor state version {state.get('version')!r}, expected "
                             f"{STATE_VERSION}")
        self._tasks = {k: _Pool.from_dict(p, self.batch) for k, p in state["tasks"].items()}
        self._groups = OrderedDict((k, _Pool.from_dict(p, self.batch))
                                   for k, p in state["groups"].items())
