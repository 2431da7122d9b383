"""What the engine has learnt about output lengths: the expected remaining tokens of a request.

FastServe's MLFQ is information-agnostic: it demotes a request by attained service because,
for heavy-tailed lengths, the longer a request has run the longer it is likely to run. That is
a property of the length distribution, and the engine sees the distribution: every request it
finishes is a sample. :class:`LengthModel` keeps the recent samples and answers
``E[final length - attained | final length > attained, final length <= max_tokens]``:

- **Heavy tail** (lognormal, Pareto): the expected remaining length grows with attained
  service, so a request that has run long ranks behind a newcomer (MLFQ's behaviour).
- **Light tail** (near-uniform lengths): it shrinks with attained service, so a running request ranks ahead
  of every newcomer and nothing is preempted (FCFS's behaviour, which is optimal there).
- **Caps that are lengths**: when nearly every request ends at its ``max_tokens`` (benchmark
  clients with ``ignore_eos``, RL rollouts truncated at the response length), the remaining
  length is ``max_tokens - attained``, known exactly: shortest remaining first.

A request's ``max_tokens`` truncates its distribution (a request cannot run past its cap), and
a request older than every sample is expected to run about as long again as it has.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Regime:
    """What the model believes about the lengths, for the log: ``name`` is one of
    ``warming up``, ``caps are lengths``, ``heavy-tailed``, ``memoryless``, ``light-tailed``."""

    name: str
    detail: str


class LengthModel:
    """The ``window`` most recent finished output lengths and their ``max_tokens``.

    Refitted lazily (sorted samples and prefix sums) after ``refit_every`` new samples, so a
    query costs two bisections. Until ``min_samples`` requests have finished it knows nothing
    (:meth:`expected_remaining` returns ``None``).
    """

    CAPS_ARE_LENGTHS = 0.9  # share of requests ending at max_tokens above which caps are lengths

    def __init__(self, window: int = 256, min_samples: int = 32, refit_every: int = 16) -> None:
        self.min_samples = min_samples
        self.refit_every = refit_every
        self._samples: deque[tuple[int, bool]] = deque(maxlen=window)
        self._since_fit = 0
        self._sorted: list[int] = []
        self._prefix: list[int] = [0]
        self.caps_are_lengths = False
        self.ready = False
        self.fits = 0  # how many times the model was refitted

    def observe(self, output_len: int, max_tokens: int | None) -> None:
        """A request finished after ``output_len`` tokens."""
        if output_len <= 0:
            return
        self._samples.append((output_len, max_tokens is not None and output_len >= max_tokens))
        self._since_fit += 1
        if self._since_fit >= self.refit_every or (not self.ready and len(self._samples) >= self.min_samples):
            self._fit()

    def _fit(self) -> None:
        self._since_fit = 0
        self._sorted = sorted(n for n, _ in self._samples)
        self._prefix = [0, *itertools.accumulate(self._sorted)]
        self.caps_are_lengths = sum(c for _, c in self._samples) >= self.CAPS_ARE_LENGTHS * len(self._samples)
        self.ready = len(self._samples) >= self.min_samples
        self.fits += 1

    def expected_remaining(self, attained: int, max_tokens: int | None) -> float | None:
        """Expected tokens still to generate for a request that has generated ``attained``."""
        if not self.ready:
            return None
        cap_left = None if max_tokens is None else max(max_tokens - attained, 0)
        if self.caps_are_lengths and cap_left is not None:
            return float(cap_left)
        lengths, n = self._sorted, len(self._sorted)
        i = bisect.bisect_right(lengths, attained)
        if i == n:  # longer than every sample: as long again as it has run, up to its cap
            guess = float(max(attained, 1))
            return guess if cap_left is None else min(guess, float(cap_left))
        j = n if max_tokens is None else max(bisect.bisect_left(lengths, max_tokens), i)
        total = self._prefix[j] - self._prefix[i] + (n - j) * (max_tokens or 0)
        return max(total / (n - i) - attained, 0.0)

    def regime(self) -> Regime:
        if not self.ready:
            return Regime("warming up", f"{len(self._samples)} of {self.min_samples} requests "
                          "finished: first come first served, no preemption")
        n = len(self._samples)
        if self.caps_are_lengths:
            share = sum(c for _, c in self._samples) / n
            return Regime("caps are lengths", f"{share:.0%} of the last {n} requests ended at "
                          "their max_tokens: shortest remaining max_tokens first")
        lengths = np.asarray(self._sorted, dtype=float)
        cv = float(lengths.std() / lengths.mean())
        upper = int(np.percentile(lengths, 75))
        fresh, aged = self.expected_remaining(0, None) or 0.0, self.expected_remaining(upper, None) or 0.0
        stats = (f"last {n} lengths: median {int(np.median(lengths))}, CV {cv:.2f}; expected "
                 f"remaining {fresh:.0f} tokens at 0, {aged:.0f} at the 75th percentile ({upper})")
        if aged > 1.25 * fresh:
            return Regime("heavy-tailed", f"{stats}: the longer a request has run, the longer it "
                          "is expected to run, so newcomers preempt it (MLFQ-like)")
        if aged < 0.8 * fresh:
            return Regime("light-tailed", f"{stats}: a running request is expected to end before "
                          "a newcomer, so nothing is preempted (FCFS-like)")
        return Regime("memoryless", f"{stats}: service says little about what is left, so "
                      "preempting does not pay; first come first served within a level")
