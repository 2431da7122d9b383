"""Runtime prediction of a trajectory's remaining work, learned online from finished ones.

Agentic trajectories are heavy-tailed: most end after a few turns, a few run for dozens. What a
scheduler can know before a trajectory ends is its task, how far it has come, and how its
siblings (other samples of the same prompt in a GRPO group, which have similar lengths) ended.
The predictor combines these without assuming a distribution:

- the remaining turns are the *conditional* mean of past totals that outlived the turns already
  done (a trajectory that has survived ten turns is predicted from the ones that lasted more than
  ten, which is what makes a heavy tail predictable at all);
- the history it conditions on is the trajectory's finished siblings where there are any
  (weighted ``sibling_weight`` times), pooled with finished trajectories of the same task;
- tokens per turn are the running mean of the same pool.

It is refreshed every turn by :meth:`predict` and updated by :meth:`observe_finished`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Prediction:
    remaining_turns: float
    remaining_tokens: float


@dataclass
class _Pool:
    """Finished trajectories of one task or group, with what a conditional mean needs: totals
    sorted once per change and their suffix sums, so that a query costs O(log n)."""

    turns: list[int] = field(default_factory=list)
    tokens_per_turn: list[float] = field(default_factory=list)
    _sorted: np.ndarray | None = None
    _suffix: np.ndarray | None = None
    _per_turn_sum: float | None = None

    def add(self, turns: int, per_turn: float, keep: int) -> None:
        self.turns.append(turns)
        self.tokens_per_turn.append(per_turn)
        del self.turns[:-keep], self.tokens_per_turn[:-keep]
        self._sorted = self._per_turn_sum = None

    def survivors(self, done: int) -> tuple[float, int]:
        """Sum and count of totals greater than ``done``."""
        if self._sorted is None:
            self._sorted = np.sort(np.asarray(self.turns, dtype=float))
            self._suffix = np.r_[np.cumsum(self._sorted[::-1])[::-1], 0.0]
        first = int(np.searchsorted(self._sorted, done, side="right"))
        return float(self._suffix[first]), len(self._sorted) - first

    def per_turn(self) -> tuple[float, int]:
        """Sum and count of tokens per turn."""
        if self._per_turn_sum is None:
            self._per_turn_sum = float(sum(self.tokens_per_turn))
        return self._per_turn_sum, len(self.tokens_per_turn)


class RemainingWorkPredictor:
    """``task`` keys the history (a task or prompt family); ``group`` keys GRPO siblings."""

    def __init__(self, prior_turns: float = 4.0, prior_tokens_per_turn: float = 64.0,
                 sibling_weight: float = 4.0, history: int = 4096) -> None:
        self.prior_turns = prior_turns
        self.prior_tokens_per_turn = prior_tokens_per_turn
        self.sibling_weight = sibling_weight
        self.history = history
        self._tasks: dict[str, _Pool] = defaultdict(_Pool)
        self._groups: dict[str, _Pool] = defaultdict(_Pool)

    def observe_finished(self, task: str, group: str, turns: int, tokens: int) -> None:
        per_turn = tokens / max(turns, 1)
        self._tasks[task].add(turns, per_turn, self.history)
        self._groups[group].add(turns, per_turn, self.history)

    def predict(self, task: str, group: str, turns_done: int, tokens_done: int) -> Prediction:
        siblings, peers = self._groups.get(group, _Pool()), self._tasks.get(task, _Pool())
        w = self.sibling_weight
        (s_sum, s_n), (p_sum, p_n) = siblings.survivors(turns_done), peers.survivors(turns_done)
        if s_n or p_n:
            total_turns = (w * s_sum + p_sum) / (w * s_n + p_n)
        elif turns_done == 0:
            total_turns = self.prior_turns
        else:
            # Longer than anything seen so far: in a heavy tail the expected remainder grows with
            # the age reached (Lindy), so predict as much again as half of what was done.
            total_turns = 1.5 * turns_done
        (s_tok, s_cnt), (p_tok, p_cnt) = siblings.per_turn(), peers.per_turn()
        if s_cnt or p_cnt:
            tokens_per_turn = (w * s_tok + p_tok) / (w * s_cnt + p_cnt)
        else:
            tokens_per_turn = tokens_done / turns_done if turns_done else self.prior_tokens_per_turn
        remaining_turns = max(total_turns - turns_done, 0.0)
        return Prediction(remaining_turns, remaining_turns * tokens_per_turn)
