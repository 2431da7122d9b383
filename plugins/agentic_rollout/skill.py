"""Whether the predictor's ranking is worth following: its measured skill, against its noise.

Heddle's decisions (longest predicted first, placement by predicted load, migration) pay only
when the predictions rank trajectories by their true remaining time. Where nothing can be
learned (each trajectory's depth a coin flip no prompt or sibling reveals), the ranking is
noise, and following it costs: serving a random trajectory first is no better than first come,
first served, and every migration re-prefills a context the old instance had cached. So the
orchestrator scores its own predictions once the trajectories they were about have finished:
at each turn index, Kendall's S (concordant minus discordant pairs) between the remaining serial
time it predicted before that turn and the one that followed (the trajectory's own turns'
tokens at the engine's pace plus its tool seconds, neither of which depends on the schedule).
Summed over turn indices and over batches (older batches weighted by the predictor's decay),
S has mean 0 and a known variance when the predictions carry no information, so
``z = S / sqrt(Var S)`` says how many standard errors the skill stands above none: a threshold
on ``z`` is set by the statistic's own sampling noise, not by any one workload. Before any
evidence there is no ``z`` (:attr:`PredictiveSkill.scored` is false).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _tie_terms(values: np.ndarray) -> tuple[float, float, float]:
    """Over groups of tied values of size t: sums of t(t-1)(2t+5), t(t-1) and t(t-1)(t-2)."""
    _, counts = np.unique(values, return_counts=True)
    t = counts[counts > 1].astype(float)
    return float((t * (t - 1) * (2 * t + 5)).sum()), float((t * (t - 1)).sum()), \
        float((t * (t - 1) * (t - 2)).sum())


def kendall_s(predicted: Sequence[float], realised: Sequence[float]) -> tuple[float, float]:
    """Kendall's S between two rankings and its variance if they were independent, ties in
    either counted (Kendall's formula with tie corrections); (0, 0) for fewer than 2 values."""
    x, y = np.asarray(predicted, dtype=float), np.asarray(realised, dtype=float)
    n = len(x)
    if n < 2:
        return 0.0, 0.0
    i, j = np.triu_indices(n, 1)
    s = float((np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])).sum())
    (vt, t1, t2), (vu, u1, u2) = _tie_terms(x), _tie_terms(y)
    var = (n * (n - 1) * (2 * n + 5) - vt - vu) / 18 + t1 * u1 / (2 * n * (n - 1))
    if n > 2:
        var += t2 * u2 / (9 * n * (n - 1) * (n - 2))
    return s, max(var, 0.0)


def realised_remaining_s(turn_tokens: Sequence[int], tool_s: Sequence[float],
                         per_token_s: float) -> list[float]:
    """For each turn k of a finished trajectory: its turns' tokens from k on at ``per_token_s``
    plus the tool seconds after them (``tool_s[k]`` follows turn k)."""
    out, rest = [], 0.0
    for k in range(len(turn_tokens) - 1, -1, -1):
        rest += turn_tokens[k] * per_token_s + (tool_s[k] if k < len(tool_s) else 0.0)
        out.append(rest)
    return out[::-1]


@dataclass
class PredictiveSkill:
    """Kendall's S and its null variance, summed over the turn indices of every scored batch
    (older batches weighted ``decay`` per batch, as the predictor weighs its history)."""

    decay: float = 0.5
    s: float = 0.0
    var: float = 0.0
    _pending: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    _restored: tuple[float, float] = (0.0, 0.0)  # this batch's terms, as a saved state had them

    def record(self, predicted: Mapping[int, float], realised: Sequence[float]) -> None:
        """A finished trajectory: what was predicted before turn k, and what followed it."""
        for k, p in predicted.items():
            if k < len(realised):
                self._pending.setdefault(k, []).append((p, realised[k]))

    def _batch_terms(self) -> tuple[float, float]:
        """This batch's S and its variance without skill. A trajectory is in every turn index
        it reached, and its rank at one turn is much its rank at the next (for predictions and
        outcomes both), so the turn indices' S are not independent: their variance is bounded
        by the square of the summed standard deviations (as if fully correlated), which keeps
        a ranking that is right or wrong for the same trajectories from counting as evidence
        once per turn."""
        s, var = self._restored
        sd = 0.0
        for pairs in self._pending.values():
            ds, dv = kendall_s(*zip(*pairs, strict=True)) if len(pairs) >= 2 else (0.0, 0.0)
            s, sd = s + ds, sd + math.sqrt(dv)
        return s, var + sd ** 2

    def _folded(self) -> tuple[float, float]:
        ds, dv = self._batch_terms()
        return self.decay * self.s + ds, self.decay ** 2 * self.var + dv

    def close_batch(self) -> None:
        """A new rollout batch starts: the finished one's pairs join the evidence."""
        self.s, self.var = self._folded()
        self._pending, self._restored = {}, (0.0, 0.0)

    @property
    def scored(self) -> bool:
        """Whether any ranked pair was scored (no evidence either way before)."""
        return self.var > 0

    @property
    def z(self) -> float:
        """Standard errors above no skill (0 with no evidence)."""
        return self.s / math.sqrt(self.var) if self.var > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        """The scored batches' evidence, and this batch's so far (its finished trajectories)."""
        batch_s, batch_var = self._batch_terms()
        return {"s": self.s, "var": self.var, "batch_s": batch_s, "batch_var": batch_var}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.s, self.var, self._pending = float(state["s"]), float(state["var"]), {}
        self._restored = (float(state.get("batch_s", 0.0)), float(state.get("batch_var", 0.0)))
