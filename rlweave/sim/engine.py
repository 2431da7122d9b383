"""What one engine iteration costs: one fitted model for every planner and simulator.

An iteration that decodes ``b`` sequences and prefills ``p`` prompt tokens takes

    ``base_s + per_seq_s * b + prefill_s_per_token * p``

or, where the decode cost was measured as throughput at a few batch sizes (StreamRL's profile),
``b / tokens_per_s(b)`` (linearly interpolated) in place of ``base_s + per_seq_s * b``. The
rlweave models it replaced are each a special case: FastServe's profile is ``base_s`` +
``prefill_s_per_token`` (decode folded into the per-token line), Heddle's and RLHFuse's cost are
``base_s`` + ``per_seq_s`` (+ re-prefill per token), the serving ceiling uses all three, StreamRL
the throughput table. ``request_s`` is each request's time outside the iterations (a serving
front end's way in and out), which an open-loop serving model adds to its latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class EngineModel:
    """Seconds per iteration of one engine instance (see the module docstring). ``slots``: the
    most sequences one iteration decodes (vLLM's ``max_num_seqs``; ``None`` where each instance
    gives its own). ``throughput``: measured ``(batch, tokens/s)`` points, batches increasing
    from 1; when given, it is the decode cost and ``base_s`` and ``per_seq_s`` stay 0.
    ``request_s``: seconds of each request's latency spent outside the engine's iterations (vLLM's
    front end: input processing, the hops to and from the engine core, output delivery), which
    no iteration waits for; only an open-loop serving model reads it (0: none)."""

    base_s: float = 0.0
    per_seq_s: float = 0.0
    slots: int | None = None
    prefill_s_per_token: float = 0.0
    throughput: tuple[tuple[int, float], ...] = ()
    request_s: float = 0.0

    def __post_init__(self) -> None:
        # base_s alone may be negative (a line fitted through two batch sizes can cross zero);
        # no iteration may cost less than nothing
        if (min(self.per_seq_s, self.prefill_s_per_token, self.base_s + self.per_seq_s, self.request_s) < 0
                or (self.slots is not None and self.slots < 1)):
            raise ValueError(f"bad EngineModel {self}: per_seq_s, prefill_s_per_token and one sequence's "
                             f"iteration (base_s + per_seq_s) and request_s must be >= 0, and slots >= 1: refit it")
        if self.throughput:
            batch = np.array([b for b, _ in self.throughput])
            if (batch[0] != 1 or np.any(np.diff(batch) <= 0) or any(t <= 0 for _, t in self.throughput)
                    or self.base_s or self.per_seq_s):
                raise ValueError(f"bad EngineModel throughput {self.throughput}: batches must start at 1 "
                                 f"and increase, tokens/s be positive, and base_s and per_seq_s stay 0")

    def decode_s(self, decoding: int) -> float:
        """An iteration's decode part with ``decoding`` sequences."""
        if not self.throughput:
            return self.base_s + self.per_seq_s * decoding
        batch, rate = zip(*self.throughput)
        return decoding / float(np.interp(decoding, batch, rate)) if decoding else 0.0

    def iteration_s(self, decoding: int, prefill_tokens: int = 0) -> float:
        """Seconds of one iteration that decodes ``decoding`` sequences and prefills
        ``prefill_tokens`` prompt tokens."""
        return self.decode_s(decoding) + self.prefill_s_per_token * prefill_tokens

    def scaled(self, factor: float) -> EngineModel:
        """The same engine ``factor`` times slower (a speed calibration)."""
        return replace(self, base_s=self.base_s * factor, per_seq_s=self.per_seq_s * factor,
                       prefill_s_per_token=self.prefill_s_per_token * factor, request_s=self.request_s * factor,
                       throughput=tuple((b, t / factor) for b, t in self.throughput))

    @classmethod
    def from_throughput(cls, batch_sizes: Sequence[int], tokens_per_s: Sequence[float]) -> EngineModel:
        """A measured throughput table; its last batch size is the slot count."""
        return cls(slots=int(batch_sizes[-1]),
                   throughput=tuple((int(b), float(t)) for b, t in zip(batch_sizes, tokens_per_s, strict=True)))

    @classmethod
    def fit(cls, decoding: Sequence[int], seconds: Sequence[float], slots: int | None = None,
            prefill_s_per_token: float = 0.0, prefill_tokens: Sequence[int] | None = None) -> EngineModel:
        """Least squares of measured iteration ``seconds`` on the terms whose inputs vary: the
        ``decoding`` batch sizes and, where given, the ``prefill_tokens`` (else the prefill
        cost is ``prefill_s_per_token``, measured apart). A term whose input never varies folds
        into ``base_s``; each term is then clamped at 0 (noise must not make a cost negative)."""
        t = np.asarray(seconds, dtype=float)
        names, columns = [], []
        for name, values in (("per_seq_s", decoding), ("prefill_s_per_token", prefill_tokens)):
            if values is not None and len(values) == len(t) and len(set(values)) > 1:
                names.append(name)
                columns.append(np.asarray(values, dtype=float))
        if not len(t) or len(decoding) != len(t) or (prefill_tokens is not None and len(prefill_tokens) != len(t)):
            raise ValueError("EngineModel.fit needs one decoding (and prefill) count per measured iteration, and "
                             "at least one iteration")
        coef = np.linalg.lstsq(np.column_stack([np.ones(len(t)), *columns]), t, rcond=None)[0]
        terms = {"prefill_s_per_token": prefill_s_per_token} | {n: max(float(c), 0.0) for n, c in zip(names, coef[1:])}
        return cls(base_s=max(float(coef[0]), 0.0), slots=slots, **terms)
