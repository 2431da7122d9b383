"""A small local RL task for verl on CPU: "What is a + b?" prompts in verl's parquet layout,
and a rule-based reward whose value varies within a GRPO group even for a random model."""

from __future__ import annotations

import random
from pathlib import Path

DATA_SOURCE = "rlweave/arithmetic"


def rows(n: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{split}")
    out = []
    for index in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        question = f"What is {a} + {b}?"
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "question": question, "answer": str(a + b)},
        })
    return out


def write_dataset(directory: str | Path, n_train: int = 64, n_val: int = 8, seed: int = 0,
                  output_lens: list[int] | list[list[int]] | None = None,
                  prompts: list[str] | None = None) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet``; returns their paths. ``output_lens``: one
    forced response length per training prompt (``extra_info.rlweave_output_len``, honoured by
    rlweave's ``rlweave_single_turn`` agent loop), or a list per prompt, one per GRPO sibling
    (``rlweave_output_lens``); its length sets the number of prompts.
    ``prompts``: their texts, in place of the arithmetic questions."""
    import pandas as pd

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "train.parquet", directory / "val.parquet"
    train = rows(len(output_lens) if output_lens else n_train, "train", seed)
    for row, length in zip(train, output_lens or (), strict=False):
        if isinstance(length, (list, tuple)):  # one per GRPO sibling
            row["extra_info"]["rlweave_output_lens"] = [int(n) for n in length]
        else:
            row["extra_info"]["rlweave_output_len"] = int(length)
    for row, text in zip(train, prompts or (), strict=False):
        row["prompt"] = [{"role": "user", "content": text}]
    pd.DataFrame(train).to_parquet(paths[0])
    pd.DataFrame(rows(n_val, "test", seed)).to_parquet(paths[1])
    return paths


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs: object) -> float:
    """1 if the answer appears, plus the fraction of digit characters (a shaping term that gives
    different samples of the same prompt different rewards, so GRPO advantages are non-zero)."""
    digits = sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
    return float(ground_truth in solution_str) + digits
