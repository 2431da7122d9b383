"""Response-length workloads for ``rlweave bench stream`` (and ``bench fusion-inter``): one
forced length per sample, ``[prompts][group]``, seeded, so every run of a comparison generates
exactly the same tokens.

Shapes (``--workload``), two epochs' worth of distinct prompts:

- ``default``: per prompt, lognormal with median 32 tokens and sigma 1, clipped to 4..256;
  siblings alike;
- ``short``: per prompt, median 12, sigma 0.5, 2..64;
- ``long``: per prompt, median 64, sigma 1, 8..256 (the longer outputs of issue 22);
- ``bimodal``: per sample, a body around 32 tokens (sigma 0.3) and a 5% tail at 4-9 times the
  median (a few samples that ramble, whichever sibling they are);
- ``spread``: per prompt a median (lognormal, 32, sigma 0.5), and each sibling that times a
  lognormal factor (sigma 0.7), 4..256: real GRPO siblings differ in length.

``--lengths FILE`` replays measured lengths instead: JSONL, one prompt per line,
``{"output_len": 61}`` (siblings alike) or ``{"output_lens": [61, 12, 40, 7]}`` (one per
sibling, cycled if fewer than the group), with an optional ``"prompt"`` text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

MAX_LEN = 256


def _per_prompt(median: float, sigma: float, low: int, high: int) -> Callable[[np.random.Generator, int, int], np.ndarray]:
    def draw(rng: np.random.Generator, prompts: int, group: int) -> np.ndarray:
        lengths = np.clip(np.round(median * rng.lognormal(0.0, sigma, prompts)), low, high)
        return np.repeat(lengths[:, None], group, axis=1)

    return draw


def _bimodal(rng: np.random.Generator, prompts: int, group: int) -> np.ndarray:
    body = np.clip(np.round(32 * rng.lognormal(0.0, 0.3, (prompts, group))), 4, MAX_LEN)
    tail = rng.random((prompts, group)) < 0.05
    tail.flat[rng.integers(tail.size)] |= not tail.any()  # at least one tail sample
    factor = rng.uniform(4.0, 9.0, (prompts, group))
    return np.where(tail, np.clip(np.round(np.median(body) * factor), 1, MAX_LEN), body)


def _spread(rng: np.random.Generator, prompts: int, group: int) -> np.ndarray:
    medians = 32 * rng.lognormal(0.0, 0.5, (prompts, 1))
    return np.clip(np.round(medians * rng.lognormal(0.0, 0.7, (prompts, group))), 4, MAX_LEN)


SHAPES: dict[str, tuple[str, Callable[[np.random.Generator, int, int], np.ndarray]]] = {
    "default": ("per prompt lognormal median 32, sigma 1, 4..256", _per_prompt(32, 1.0, 4, MAX_LEN)),
    "short": ("per prompt lognormal median 12, sigma 0.5, 2..64", _per_prompt(12, 0.5, 2, 64)),
    "long": ("per prompt lognormal median 64, sigma 1, 8..256", _per_prompt(64, 1.0, 8, MAX_LEN)),
    "bimodal": ("per sample: body median 32 (sigma 0.3), 5% tail at 4-9x the median", _bimodal),
    "spread": ("per prompt median 32 (sigma 0.5), each sibling x lognormal(sigma 0.7), 4..256", _spread),
}


def shape_lengths(shape: str, seed: int, prompts: int, group: int) -> list[list[int]]:
    """``prompts`` prompts' forced lengths, ``group`` per prompt, of workload ``shape``."""
    if shape not in SHAPES:
        raise SystemExit(f"unknown --workload '{shape}'; one of: {', '.join(SHAPES)}")
    return SHAPES[shape][1](np.random.default_rng(seed), prompts, group).astype(int).tolist()


def read_lengths_file(path: str, group: int) -> tuple[list[list[int]], list[str] | None]:
    """Per-sample lengths (and prompt texts, if every line has one) from a JSONL file."""
    rows, texts = [], []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            lengths = row["output_lens"] if "output_lens" in row else [row["output_len"]]
            lengths = [int(n) for n in lengths]
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"{path}:{number}: expected {{\"output_len\": N}} or {{\"output_lens\": [N, ...]}} "
                             f"with positive integers, and optionally \"prompt\"") from None
        if not lengths or min(lengths) < 1:
            raise SystemExit(f"{path}:{number}: output lengths must be positive integers")
        rows.append([lengths[i % len(lengths)] for i in range(group)])
        texts.append(row.get("prompt"))
    if not rows:
        raise SystemExit(f"{path}: no prompts")
    return rows, [str(t) for t in texts] if all(t is not None for t in texts) else None


def as_forced(lengths: list[list[int]]) -> list[int] | list[list[int]]:
    """What the dataset row carries: one length per prompt where siblings are alike, else a
    list per prompt."""
    return [row[0] for row in lengths] if all(len(set(row)) == 1 for row in lengths) else lengths
