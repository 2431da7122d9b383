"""A queue order that knows the length distribution but not the lengths: the non-clairvoyant
index beside :class:`~rlweave.sim.policies.ShortestRemaining`'s oracle.

A scheduler sees how many tokens a request has made (its attained service) and, from the
requests it has finished, the distribution of lengths. Ranking by the expected tokens still to
make given the attained service, ``E[L - a | L > a]``, is the best a policy without knowledge of
the future can do on that information (for heavy tails it demotes requests that have run long,
as FastServe's MLFQ does; for light tails it keeps them). Beside the oracle's gain it separates a
plugin's shortfall from the information ceiling (issue 44, "Plan").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlweave.sim.batching import Request


class ExpectedRemaining:
    """Queue order by expected remaining tokens given attained service, from ``lengths`` (the
    learned distribution: finished requests' output tokens). Smallest first, ties by arrival.
    A request that has run past every sample is expected to run as long again."""

    def __init__(self, lengths: Sequence[float]) -> None:
        self._sorted = np.sort(np.asarray(lengths, dtype=float))
        if not len(self._sorted) or self._sorted[0] <= 0:
            raise ValueError("ExpectedRemaining needs at least one positive length to learn from")
        self._suffix = np.concatenate([np.cumsum(self._sorted[::-1])[::-1], [0.0]])  # sum of sorted[i:]

    def expected(self, attained: float) -> float:
        """``E[L - attained | L > attained]`` over the learned lengths."""
        i = int(np.searchsorted(self._sorted, attained, side="right"))
        n = len(self._sorted)
        if i == n:
            return max(attained, 1.0)
        return float(self._suffix[i] / (n - i) - attained)

    def key(self, request: Request, left: float) -> tuple:
        return (self.expected(request.output_tokens - left), request.id)
