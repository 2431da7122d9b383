"""The agentic rollout workloads of ``rlweave bench agentic``: seeded shapes, or a trace file.

A rollout batch is ``prompts`` prompts x ``group`` samples (a GRPO group per prompt). Each
prompt belongs to a task (prompts cycle through the shape's tasks), and its own difficulty
scales the turns of all its samples (siblings have similar lengths). Every sample then draws
its turns, per-turn output lengths and tool latencies from heavy-tailed (log-normal)
distributions; a task may give each trajectory its own tool speed (its sandbox), and a share of
its prompts a deep tail of many turns. The shapes (``WORKLOADS``):

- ``default``: 64 trajectories, three tasks of 2, 4 and 9 median turns, 32-token turns, 0.2 s
  tools.
- ``tool-dominated``: 96 trajectories of 5-7 median turns, short generations, tool calls of
  0.3-0.5 s with a speed of their own per trajectory (its sandbox): the critical path is mostly
  tool time.
- ``token-dominated``: 64 trajectories of long generations (64-96 tokens a turn, each prompt and
  trajectory with its own verbosity), tools of 20 ms: the critical path is decode time.
- ``deep-tail``: 128 trajectories, most ending in 1-3 turns, a few prompts whose samples all run
  10-20, heavy-tailed tool latencies.
- ``mixed``: 96 trajectories of four tasks that differ in turns, tokens and tools at once.
- ``depth-mix``: 96 independent trajectories, a share of them deep (10-20 turns), the rest of a
  memoryless number of turns: neither prompt nor sibling says which is which (nothing to learn).
- ``depth-mix-grouped``: 24 prompts x 4 samples; each prompt has its own chance of a deep sample
  (most near none, a few near all), else at most 3 turns, and its own heavy-tailed tool speed,
  shared by its samples: siblings carry the depth and the pace.
- ``tool-speed-mix``: 24 prompts x 4 samples of a memoryless number of turns (at most 8), each
  prompt with a heavy-tailed tool speed (log-normal, sigma 1.2: the slowest of 24 prompts about
  ten times the median) shared by its samples: the pace, not the depth, decides.

Trace format (``--trace FILE``), one trajectory per JSON line::

    {"id": "p3-s1", "group": "p3", "task": "code", "prompt_len": 48,
     "turn_tokens": [40, 12, 96], "tool_s": [0.31, 1.2]}

``turn_tokens[i]`` is the exact output length of turn ``i`` (served with ``ignore_eos``);
``tool_s[i]`` the latency of the tool call after turn ``i`` (one fewer than turns).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

TOOL_OUTPUT_TOKENS = 8  # tokens a tool call appends to the context (about; the chat template adds some)
TRACE_FIELDS = ('{"id": str, "group": str, "task": str, "prompt_len": int, '
                '"turn_tokens": [int, ...], "tool_s": [float, ...] (one fewer than turn_tokens)}')


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


@dataclass(frozen=True)
class TaskShape:
    median_turns: float
    median_tokens: float = 32.0
    tool_median_s: float = 0.2
    turns_sigma: float = 0.5
    tokens_sigma: float = 0.7  # per turn
    trajectory_tokens_sigma: float = 0.0  # a verbosity factor per trajectory
    tool_sigma: float = 0.8  # per call
    trajectory_tool_sigma: float = 0.0  # a speed factor per trajectory (its sandbox)
    deep_share: float = 0.0  # prompts whose samples all run deep_turns
    deep_turns: tuple[int, int] = (10, 20)
    stop_chance: float = 0.0  # > 0: memoryless turns, each the last with this chance
    max_shallow_turns: int = 32  # a cap on the turns of a sample that is not deep
    deep_chance: float = 0.0  # each sample's own chance of running deep_turns (a draw per sample)
    deep_concentration: float = 0.0  # > 0: each prompt's chance ~ Beta with this concentration
    prompt_tool_sigma: float = 0.0  # a speed factor per prompt on its samples' tool calls
    max_tokens: int = 192
    max_tool_s: float = 10.0


@dataclass(frozen=True)
class WorkloadShape:
    prompts: int
    group: int
    tasks: dict[str, TaskShape] = field(default_factory=dict)
    difficulty_sigma: float = 0.4  # a factor per prompt on its samples' turns
    verbosity_sigma: float = 0.0  # a factor per prompt on its samples' tokens per turn


WORKLOADS: dict[str, WorkloadShape] = {
    "default": WorkloadShape(16, 4, {"lookup": TaskShape(2.0), "search": TaskShape(4.0),
                                     "code": TaskShape(9.0)}),
    "tool-dominated": WorkloadShape(24, 4, {
        "search": TaskShape(5.0, 32.0, 0.5, tool_sigma=0.5, trajectory_tool_sigma=0.6,
                            max_tool_s=6.0),
        "browse": TaskShape(7.0, 24.0, 0.3, tool_sigma=0.5, trajectory_tool_sigma=0.6,
                            max_tool_s=6.0)}, verbosity_sigma=0.3),
    "token-dominated": WorkloadShape(16, 4, {
        "math": TaskShape(2.0, 96.0, 0.02, tokens_sigma=0.4, trajectory_tokens_sigma=0.3,
                          max_tokens=384),
        "code": TaskShape(4.0, 64.0, 0.02, tokens_sigma=0.4, trajectory_tokens_sigma=0.3,
                          max_tokens=384)}, verbosity_sigma=0.5),
    "deep-tail": WorkloadShape(32, 4, {
        "qa": TaskShape(1.5, 40.0, 0.4, turns_sigma=0.4, tool_sigma=1.0, deep_share=0.12,
                        max_tool_s=6.0)}, verbosity_sigma=0.3),
    "mixed": WorkloadShape(24, 4, {
        "lookup": TaskShape(2.0, 16.0, 0.1),
        "search": TaskShape(5.0, 16.0, 1.0, tool_sigma=0.8, trajectory_tool_sigma=0.5),
        "code": TaskShape(5.0, 80.0, 0.3, max_tokens=256),
        "agent": TaskShape(2.0, 24.0, 0.5, deep_share=0.25)}),
    "depth-mix": WorkloadShape(96, 1, {
        "agent": TaskShape(2.5, 40.0, 0.3, stop_chance=0.4, deep_chance=0.08,
                           max_tool_s=6.0)}, difficulty_sigma=0.0),
    "depth-mix-grouped": WorkloadShape(24, 4, {
        "agent": TaskShape(2.0, 40.0, 0.3, tool_sigma=0.5, stop_chance=0.5, max_shallow_turns=3,
                           deep_chance=0.2, deep_concentration=1.0, prompt_tool_sigma=0.8,
                           max_tool_s=6.0)}, difficulty_sigma=0.0),
    "tool-speed-mix": WorkloadShape(24, 4, {
        "agent": TaskShape(2.5, 32.0, 0.3, tool_sigma=0.4, stop_chance=0.35, max_shallow_turns=8,
                           prompt_tool_sigma=1.2, max_tool_s=10.0)}, difficulty_sigma=0.0),
}


@dataclass(frozen=True)
class TrajectoryParameters:
    """What the generator fixed for a trajectory before drawing its turns, tokens and tools: what
    a perfect model of the workload could know, short of the draws themselves (its sandbox's
    speed is a draw: ``shape`` gives its distribution)."""

    shape: TaskShape  # its task's, tool latencies scaled (by ``tool_scale`` and its prompt's speed)
    difficulty: float  # the prompt's factor on the median turns
    verbosity: float  # the prompt's and the trajectory's factors on the median tokens
    deep: bool  # the draw
    deep_chance: float  # what was known of it before the draw (0 or 1 for a deep prompt's share)


def _trajectory(rng: np.random.Generator, tid: str, group: str, task: str, shape: TaskShape,
                prompt_len: int, difficulty: float, verbosity: float, deep_chance: float,
                max_context: int) -> tuple[Trajectory, TrajectoryParameters]:
    deep = deep_chance >= 1.0 or (0.0 < deep_chance and rng.random() < deep_chance)
    if deep:
        turns = int(rng.integers(shape.deep_turns[0], shape.deep_turns[1] + 1))
    elif shape.stop_chance:
        turns = min(int(rng.geometric(min(shape.stop_chance / difficulty, 1.0))), 32,
                    shape.max_shallow_turns)
    else:
        turns = int(np.clip(round(rng.lognormal(np.log(shape.median_turns * difficulty),
                                                shape.turns_sigma)), 1, shape.max_shallow_turns))
    verbosity *= rng.lognormal(0.0, shape.trajectory_tokens_sigma) if shape.trajectory_tokens_sigma else 1.0
    tokens = np.clip(rng.lognormal(np.log(shape.median_tokens * verbosity), shape.tokens_sigma,
                                   turns), 4, shape.max_tokens).astype(int)
    speed = rng.lognormal(0.0, shape.trajectory_tool_sigma) if shape.trajectory_tool_sigma else 1.0
    tools = np.clip(rng.lognormal(np.log(shape.tool_median_s * speed), shape.tool_sigma, turns - 1),
                    0.005, shape.max_tool_s)
    # Keep every context inside the model's window by dropping trailing turns.
    while turns > 1 and prompt_len + tokens.sum() + TOOL_OUTPUT_TOKENS * (turns - 1) > max_context:
        turns -= 1
        tokens, tools = tokens[:turns], tools[:turns - 1]
    return (Trajectory(tid, group, task, prompt_len, tuple(int(x) for x in tokens),
                       tuple(round(float(x), 4) for x in tools)),
            TrajectoryParameters(shape, difficulty, verbosity, deep, deep_chance))


def synthetic(seed: int, prompts: int | None = None, group: int | None = None,
              max_context: int = 3000, workload: str = "default", tool_scale: float = 1.0,
              epoch: int = 0) -> list[Trajectory]:
    """One seeded rollout batch of the ``workload`` shape (its own batch size unless given);
    ``tool_scale`` multiplies every tool latency. The prompts (task, difficulty, length) depend
    on ``seed`` only; another ``epoch`` draws new samples of the same prompts, as RL revisits
    its prompts every epoch."""
    return [t for t, _ in synthetic_with_parameters(seed, prompts, group, max_context, workload,
                                                    tool_scale, epoch)]


def synthetic_with_parameters(seed: int, prompts: int | None = None, group: int | None = None,
                              max_context: int = 3000, workload: str = "default",
                              tool_scale: float = 1.0, epoch: int = 0
                              ) -> list[tuple[Trajectory, TrajectoryParameters]]:
    """:func:`synthetic`'s batch, each trajectory with the parameters it was drawn from."""
    shape = WORKLOADS[workload]
    prompts = shape.prompts if prompts is None else prompts
    group = shape.group if group is None else group
    names = list(shape.tasks)
    out = []
    for p in range(prompts):
        task = names[p % len(names)]
        ts = shape.tasks[task]
        if tool_scale != 1.0:
            ts = TaskShape(**{**asdict(ts), "tool_median_s": ts.tool_median_s * tool_scale,
                              "max_tool_s": ts.max_tool_s * tool_scale})
        rng = np.random.default_rng((seed, p))
        difficulty = rng.lognormal(0.0, shape.difficulty_sigma)
        verbosity = rng.lognormal(0.0, shape.verbosity_sigma) if shape.verbosity_sigma else 1.0
        deep = bool(rng.random() < ts.deep_share)
        prompt_len = int(rng.integers(16, 64))
        chance, ts = _prompt_draws(rng, ts, deep)
        out += [_trajectory(np.random.default_rng((seed, p, epoch + 1000, s)), f"p{p}-s{s}",
                            f"p{p}", task, ts, prompt_len, difficulty, verbosity, chance, max_context)
                for s in range(group)]
    return out


def _prompt_draws(rng: np.random.Generator, ts: TaskShape, deep: bool) -> tuple[float, TaskShape]:
    """A prompt's chance that a sample runs deep, and its task shape with the prompt's tool
    speed. Drawn after the older shapes' draws, and only for shapes that use them, so those
    shapes' batches stay what they were."""
    chance = 1.0 if deep else ts.deep_chance
    if ts.deep_chance and ts.deep_concentration:
        c = ts.deep_concentration
        chance = float(rng.beta(c * ts.deep_chance, c * (1.0 - ts.deep_chance)))
    if ts.prompt_tool_sigma:
        speed = rng.lognormal(0.0, ts.prompt_tool_sigma)
        ts = TaskShape(**{**asdict(ts), "tool_median_s": ts.tool_median_s * speed})
    return chance, ts


def load_trace(path: str | Path) -> list[Trajectory]:
    """A trace file's trajectories; a bad line stops with one message naming the file, the line
    and the fields expected."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read the trace ({e.strerror})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            t = Trajectory(str(row["id"]), str(row.get("group", row["id"])),
                           str(row.get("task", "")), int(row.get("prompt_len", 32)),
                           tuple(int(x) for x in row["turn_tokens"]),
                           tuple(float(x) for x in row.get("tool_s", ())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SystemExit(f"{path}:{n}: expected {TRACE_FIELDS} ({type(e).__name__}: {e})") from None
        if not t.turn_tokens or len(t.tool_s) != len(t.turn_tokens) - 1 or min(t.turn_tokens) < 1 \
                or min(t.tool_s, default=0.0) < 0:
            raise SystemExit(f"{path}:{n}: needs >= 1 turn of >= 1 token and one tool latency "
                             f">= 0 between consecutive turns (got {len(t.turn_tokens)} turns, "
                             f"{len(t.tool_s)} tool latencies); expected {TRACE_FIELDS}")
        out.append(t)
    if not out:
        raise SystemExit(f"{path}: no trajectories; expected one per line: {TRACE_FIELDS}")
    ids = [t.id for t in out]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: trajectory ids must be unique")
    return out


def dump_trace(trajectories: list[Trajectory], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(asdict(t)) + "\n" for t in trajectories))


HISTORIES = ("epoch", "new-prompts")


def previous_step(seed: int, workload: str = "default", prompts: int | None = None,
                  group: int | None = None, history: str = "epoch", tool_scale: float = 1.0,
                  back: int = 1) -> list[Trajectory]:
    """The batch the predictor learned from ``back`` batches before the measured one: the same
    prompts ``back`` epochs earlier (``"epoch"``: most steps of an RL run revisit their
    prompts), or other prompts of the same shape (``"new-prompts"``: the first epoch, where
    only the task mix is known)."""
    if history not in HISTORIES:
        raise ValueError(f"history {history!r}: one of {', '.join(HISTORIES)}")
    if back < 1:
        raise ValueError(f"back {back}: a previous batch is at least 1 back")
    tag = "prev-" if back == 1 else f"prev{back}-"
    if history == "epoch":
        past = synthetic(seed, prompts, group, workload=workload, tool_scale=tool_scale, epoch=-back)
        return [Trajectory(f"{tag}{t.id}", t.group, t.task, t.prompt_len, t.turn_tokens, t.tool_s)
                for t in past]
    past = synthetic(seed + 10_000 * back, prompts, group, workload=workload, tool_scale=tool_scale)
    return [Trajectory(f"{tag}{t.id}", f"{tag}{t.group}", t.task, t.prompt_len, t.turn_tokens,
                       t.tool_s) for t in past]


def history_batches(seed: int, workload: str = "default", prompts: int | None = None,
                    group: int | None = None, history: str = "epoch", tool_scale: float = 1.0,
                    epochs: int = 2) -> list[list[Trajectory]]:
    """The ``epochs`` batches before the measured one, oldest first: the first teaches the
    predictor, and each later one, predicted from what came before, is scored for skill (what
    rlweave's orchestrator checks before it follows the predictions), as every batch of a run
    after its first would. Two give one scored batch; a run some steps in has more evidence."""
    if epochs < 1:
        raise ValueError(f"history epochs {epochs}: at least 1 (the batch that teaches)")
    return [previous_step(seed, workload, prompts, group, history, tool_scale, back)
            for back in range(epochs, 0, -1)]
