"""StreamRL's output-length ranker and skewness-aware dispatch.

Long-tailed output lengths leave most engines idle while the last few samples finish (the
skewness bubble). If the tail starts first, it overlaps with the short samples instead of
trailing them. Only the *order* of lengths matters for that, so the ranker is judged by rank
correlation (Kendall's tau), not by length error.

The model is deliberately small, because it must learn online from the run's own finished
samples and predict on the dispatch path: ridge regression of ``log(1 + response_len)`` on
cheap prompt features, updated with exact sufficient statistics (``A = sum x x^T``,
``b = sum x y``, optionally discounted by ``decay`` per observation so that it follows lengths
that drift as training goes on). An observation runs in the trainer's replay-buffer poll, on
the host cores that the trainer and the engines share, so it touches only the few nonzero
features of its prompt and keeps the discount as one running scale (a dense ``dim x dim``
update per sample took about 5% of the on-policy trainer's driver time). Features (``x``,
length ``dim``):

- ``x[0] = 1`` (bias) and ``x[1] = log(1 + prompt_len)``;
- each ``PromptInfo.features`` entry ``name: value``, hashed (CRC32) into one of the remaining
  buckets with a hashed sign, so any feature set fits a fixed ``dim`` (a categorical feature is
  ``"task=code": 1.0``);
- the prompt's identity (``PromptInfo.prompt_id``, hashed the same way): RL revisits the same
  prompts every epoch, and a prompt's own past lengths are its best predictor.

Finished samples name only their GRPO group (``SampleRecord.group_id``), so the ranker keeps
the features of recently dispatched groups (``memory`` of them) to learn from.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from rlweave.types import PromptInfo

_RESERVED = 2  # bias, log prompt length


def _bucket(key: str, dim: int) -> tuple[int, float]:
    h = zlib.crc32(key.encode())
    return _RESERVED + h % (dim - _RESERVED), 1.0 if (h >> 31) & 1 else -1.0


def kendall_tau(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b between two score vectors of length n (O(n^2), fine for n of a few
    thousand). 1: same order, 0: unrelated, -1: reversed. Ties count for neither side."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"need two 1-D arrays of the same length >= 2, got {x.shape} and {y.shape}")
    iu = np.triu_indices(len(x), k=1)
    dx, dy = np.sign(x[:, None] - x[None, :])[iu], np.sign(y[:, None] - y[None, :])[iu]
    denom = np.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
    return float(np.sum(dx * dy) / denom) if denom else 0.0


class LengthRanker:
    """Predicts each prompt's output-length rank from features, learning from finished samples.

    ``dim``: feature buckets. ``l2``: ridge penalty. ``decay``: discount of old observations
    per new one (1 = none). ``min_samples``: observations before the ranker gives an order
    (before that, the framework keeps its own). ``memory``: dispatched groups remembered.
    ``prompt_identity``: learn a per-prompt offset from ``prompt_id``.
    """

    def __init__(self, dim: int = 256, l2: float = 1.0, decay: float = 1.0, min_samples: int = 32,
                 memory: int = 65536, prompt_identity: bool = True) -> None:
        if dim <= _RESERVED or l2 <= 0 or not 0 < decay <= 1 or min_samples < 1 or memory < 1:
            raise ValueError(f"bad LengthRanker settings: dim={dim} (> {_RESERVED}), l2={l2} (> 0), "
                             f"decay={decay} (in (0, 1]), min_samples={min_samples} (>= 1), "
                             f"memory={memory} (>= 1)")
        self.dim, self.l2, self.decay = dim, l2, decay
        self.min_samples, self.memory, self.prompt_identity = min_samples, memory, prompt_identity
        self.samples_seen = 0
        self.unmatched = 0  # finished samples of groups this ranker never saw dispatched
        # A = _scale * _a and b = _scale * _b: a discount rescales once, not every entry.
        self._a = np.zeros((dim, dim))
        self._b = np.zeros(dim)
        self._scale = 1.0
        self._w: np.ndarray | None = None
        self._groups: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()  # nonzero ids, values

    @property
    def ready(self) -> bool:
        return self.samples_seen >= self.min_samples

    def featurize(self, prompt: PromptInfo) -> np.ndarray:
        """Feature vector [dim] of one prompt."""
        x = np.zeros(self.dim)
        x[0], x[1] = 1.0, np.log1p(prompt.prompt_len)
        items = sorted(prompt.features.items())
        if self.prompt_identity:
            items.append((f"prompt_id={prompt.prompt_id}", 1.0))
        for name, value in items:
            i, sign = _bucket(name, self.dim)
            x[i] += sign * float(value)
        return x

    def remember(self, prompts: Sequence[PromptInfo]) -> None:
        """Keep the features of dispatched prompts, keyed by GRPO group, for :meth:`observe`."""
        for p in prompts:
            x = self.featurize(p)
            nonzero = np.flatnonzero(x)
            self._groups[p.group_id or p.prompt_id] = nonzero, x[nonzero]
            self._groups.move_to_end(p.group_id or p.prompt_id)
        while len(self._groups) > self.memory:
            self._groups.popitem(last=False)

    def observe(self, group_id: str, response_len: int) -> None:
        """Learn from one finished sample of a remembered group (others are counted, not used)."""
        features = self._groups.get(group_id)
        if features is None:
            self.unmatched += 1
            return
        ids, x = features
        self._scale *= self.decay
        if self._scale < 1e-100:  # fold the scale in before it underflows
            self._a *= self._scale
            self._b *= self._scale
            self._scale = 1.0
        self._a[np.ix_(ids, ids)] += np.outer(x, x) / self._scale
        self._b[ids] += x * np.log1p(response_len) / self._scale
        self.samples_seen += 1
        self._w = None

    def predict(self, prompts: Sequence[PromptInfo]) -> np.ndarray:
        """Predicted ``log(1 + response_len)`` per prompt, [len(prompts)]: a ranking score."""
        if self._w is None:
            self._w = np.linalg.solve(self._scale * self._a + self.l2 * np.eye(self.dim), self._scale * self._b)
        return np.array([self.featurize(p) @ self._w for p in prompts])

    def dispatch_order(self, prompts: Sequence[PromptInfo], long_tail_fraction: float = 1.0) -> list[str] | None:
        """Skewness-aware dispatch: prompt ids in :func:`tail_first_order` of the predicted
        lengths. ``None`` until the ranker has seen ``min_samples`` samples."""
        if not self.ready or not prompts:
            return None
        order = tail_first_order(self.predict(prompts), long_tail_fraction)
        return [prompts[i].prompt_id for i in order]


def tail_first_order(scores: np.ndarray, long_tail_fraction: float) -> np.ndarray:
    """Dispatch order of a batch from predicted lengths: the predicted-longest
    ``long_tail_fraction`` of it (at least one) first, longest first; then the rest shortest
    first. Ties keep the given order.

    The tail starts at once, so it overlaps the rest instead of trailing it (the skewness
    bubble). The rest go shortest first because a trainer that consumes the stream is a second
    stage after generation, and a two-stage flow shop finishes soonest when the first stage
    releases short jobs first (Johnson's rule): the trainer gets work early. With fraction 1
    the whole batch goes longest first, which only minimises the batch's makespan.
    """
    if not 0 < long_tail_fraction <= 1:
        raise ValueError(f"long_tail_fraction must be in (0, 1], got {long_tail_fraction}")
    longest_first = np.argsort(-np.asarray(scores), kind="stable")
    tail = max(1, int(round(long_tail_fraction * len(longest_first))))
    rest = longest_first[tail:]
    return np.concatenate([longest_first[:tail], rest[np.argsort(np.asarray(scores)[rest], kind="stable")]])
