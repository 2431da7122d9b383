"""The agentic rollout workload of ``rlweave bench agentic``: seeded, or read from a trace file.

A rollout batch is ``prompts`` prompts x ``group`` samples (a GRPO group per prompt). Each prompt
belongs to a task family that sets its typical number of turns; the prompt's own difficulty
scales it for all its samples (siblings have similar lengths), and every sample draws its own
turns, per-turn output lengths and tool latencies from heavy-tailed (log-normal) distributions.

Trace format (``--trace FILE``), one trajectory per JSON line::

    {"id": "p3-s1", "group": "p3", "task": "code", "prompt_len": 48,
     "turn_tokens": [40, 12, 96], "tool_s": [0.31, 1.2]}

``turn_tokens[i]`` is the exact output length of turn ``i`` (served with ``ignore_eos``);
``tool_s[i]`` the latency of the tool call after turn ``i`` (one fewer than turns).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

TASK_MEDIAN_TURNS = {"lookup": 2.0, "search": 4.0, "code": 9.0}
TOOL_OUTPUT_TOKENS = 8  # tokens a tool call appends to the context


@dataclass(frozen=True)
class Trajectory:
    id: str
    group: str
    task: str
    prompt_len: int
    turn_tokens: tuple[int, ...]
    tool_s: tuple[float, ...]

    @property
    def tokens(self) -> int:
        return sum(self.turn_tokens)

    def context_before(self, turn: int) -> int:
        """Tokens the engine must have seen before generating turn ``turn``."""
        return self.prompt_len + sum(self.turn_tokens[:turn]) + TOOL_OUTPUT_TOKENS * turn


def synthetic(seed: int, prompts: int = 16, group: int = 4, max_context: int = 3000,
              max_turns: int = 32, tool_median_s: float = 0.2) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    tasks = list(TASK_MEDIAN_TURNS)
    out = []
    for p in range(prompts):
        task = tasks[p % len(tasks)]
        difficulty = rng.lognormal(0.0, 0.4)
        prompt_len = int(rng.integers(16, 64))
        for s in range(group):
            turns = int(np.clip(round(rng.lognormal(np.log(TASK_MEDIAN_TURNS[task] * difficulty),
                                                    0.5)), 1, max_turns))
            tokens = np.clip(rng.lognormal(np.log(32), 0.7, turns), 4, 192).astype(int)
            tools = np.clip(rng.lognormal(np.log(tool_median_s), 0.8, turns - 1),
                            0.1 * tool_median_s, 10 * tool_median_s)
            # Keep every context inside the model's window by dropping trailing turns.
            while turns > 1 and prompt_len + tokens.sum() + TOOL_OUTPUT_TOKENS * (turns - 1) > max_context:
                turns -= 1
                tokens, tools = tokens[:turns], tools[:turns - 1]
            out.append(Trajectory(f"p{p}-s{s}", f"p{p}", task, prompt_len,
                                  tuple(int(x) for x in tokens),
                                  tuple(round(float(x), 4) for x in tools)))
    return out


def load_trace(path: str | Path) -> list[Trajectory]:
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            t = Trajectory(str(row["id"]), str(row.get("group", row["id"])),
                           str(row.get("task", "")), int(row.get("prompt_len", 32)),
                           tuple(int(x) for x in row["turn_tokens"]),
                           tuple(float(x) for x in row.get("tool_s", ())))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: not a trajectory line ({e}); see the format in "
                             "rlweave.benchmarks.agentic_workload") from None
        if not t.turn_tokens or len(t.tool_s) != len(t.turn_tokens) - 1 or min(t.turn_tokens) < 1:
            raise ValueError(f"{path}:{n}: needs >= 1 turn of >= 1 token and one tool latency "
                             f"between consecutive turns (got {len(t.turn_tokens)} turns, "
                             f"{len(t.tool_s)} tool latencies)")
        out.append(t)
    if not out:
        raise ValueError(f"{path}: no trajectories")
    return out


def dump_trace(trajectories: list[Trajectory], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(asdict(t)) + "\n" for t in trajectories))
