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
    turns: list[int] = field(default_factory=list)
    tokens_per_turn: list[float] = field(default_factory=list)


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
        for pool in (self._tasks[task], self._groups[group]):
            pool.turns.append(turns)
            pool.tokens_per_turn.append(per_turn)
            del pool.turns[:-self.history], pool.tokens_per_turn[:-self.history]

    def predict(self, task: str, group: str, turns_done: int, tokens_done: int) -> Prediction:
        siblings, peers = self._groups.get(group, _Pool()), self._tasks.get(task, _Pool())
        turns = np.array(siblings.turns + peers.turns, dtype=float)
        per_turn = np.array(siblings.tokens_per_turn + peers.tokens_per_turn, dtype=float)
        weights = np.r_[np.full(len(siblings.turns), self.sibling_weight),
                        np.ones(len(peers.turns))]
        survived = turns > turns_done
        if survived.any():
            total_turns = float(np.average(turns[survived], weights=weights[survived]))
        elif turns_done == 0:
            total_turns = self.prior_turns
        else:
            # Longer than anything seen so far: in a heavy tail the expected remainder grows with
            # the age reached (Lindy), so predict as much again as half of what was done.
            total_turns = 1.5 * turns_done
        tokens_per_turn = (float(np.average(per_turn, weights=weights)) if len(per_turn)
                           else tokens_done / turns_done if turns_done
                           else self.prior_tokens_per_turn)
        remaining_turns = max(total_turns - turns_done, 0.0)
        return Prediction(remaining_turns, remaining_turns * tokens_per_turn)
