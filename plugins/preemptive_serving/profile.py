"""Iteration time as measured on the running engine: the profile skip-join needs.

FastServe looks a request's prefill time up in a table profiled offline for each model and GPU
(its shipped OPT-13B table puts every request in the top level, see the research note). Here
the table is a line fitted to the engine's own iterations, so it is right for the machine, the
model and the load the engine actually runs with: rlweave's one engine model
(:class:`rlweave.sim.EngineModel`), with every computed token priced as a prefill token.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rlweave.sim import EngineModel


class IterationProfile:
    """``seconds(tokens) = fixed_s + per_token_s * tokens``, least squares over recent
    iterations.

    Samples are kept per power-of-two bucket of token counts (``per_bucket`` newest each), so
    the many one-token-per-request decode iterations do not crowd out the few prefills that
    pin the slope. The line is refitted after ``refit_every`` new samples, not after each (an
    iteration is one sample, and a fit costs as much as a decision).
    """

    def __init__(self, per_bucket: int = 32, min_samples: int = 8, refit_every: int = 64) -> None:
        self.per_bucket = per_bucket
        self.min_samples = min_samples
        self.refit_every = refit_every
        self._since_fit = 0
        self._buckets: dict[int, deque[tuple[int, float]]] = {}
        self._fit: EngineModel | None = None
        self.shortest_s = float("inf")
        self.ready = False  # enough samples, over at least two token buckets, to fit a line

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        key = int(tokens).bit_length()
        if key not in self._buckets:  # a new range of token counts: refit at once
            self._buckets[key] = deque(maxlen=self.per_bucket)
            self._fit = None
        self._buckets[key].append((tokens, seconds))
        self.shortest_s = min(self.shortest_s, seconds)
        self._since_fit += 1
        if self._since_fit >= self.refit_every:
            self._fit = None
        if not self.ready:  # once ready it stays so (buckets only fill up)
            self.ready = (len(self._buckets) >= 2
                          and sum(map(len, self._buckets.values())) >= self.min_samples)
            self._fit = None

    def model(self) -> EngineModel:
        """The engine model fitted to the kept samples (``base_s`` the fixed cost, each token a
        ``prefill_s_per_token``), refitted on the cadence above. Requires :attr:`ready`."""
        if self._fit is None:
            self._since_fit = 0
            samples = np.array([s for b in self._buckets.values() for s in b], dtype=float)
            self._fit = EngineModel.fit(np.ones(len(samples)), samples[:, 1], prefill_tokens=samples[:, 0])
        return self._fit

    def line(self) -> tuple[float, float]:
        """``(fixed_s, per_token_s)``; both clamped at >= 0. Requires :attr:`ready`."""
        model = self.model()
        return model.base_s, model.prefill_s_per_token

    def prefill_s(self, prompt_len: int) -> float:
        """Estimated wall time of an iteration that prefills ``prompt_len`` tokens alone."""
        return self.model().iteration_s(0, prompt_len)
