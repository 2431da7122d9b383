"""Record: a trace directory written by rlweave's tracing plugin, read into a job summary.

What the trace holds (``plugins/tracing/plugin.py`` writes it, :func:`rlweave.tracing.load_events`
reads it): one span per trainer stage (named after :class:`rlweave.types.Stage`, with its step),
one ``iteration`` span per engine iteration (running and waiting requests after it, scheduled
tokens), one ``request`` span per finished request (its generated length), ``engine_started``
instants (the engine's ``max_num_seqs``) and ``trajectory_*`` instants (turns of an agent loop).

What it cannot know, and the cluster file (:mod:`rlweave.plan.cluster`) supplies: the GPU kind
and count it ran on, the model (size, layers, experts, top-k), the parallelism, the link speeds.
Prompt lengths are not in a request span: the summary estimates their mean from the prefill
tokens the engine iterations scheduled.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.sim import EngineModel
from rlweave.tracing import load_events
from rlweave.types import Stage

STAGES = tuple(s.value for s in Stage)

NOT_IN_TRACE = ("the GPU kind and count the job ran on", "the model's size, layers, experts and top-k",
                "the parallelism (TP/PP/DP/EP, generation instances' TP)", "link speeds (NVLink, network)",
                "each request's prompt length (its mean is estimated from the engines' prefill tokens)")


class RecordError(ValueError):
    """A trace directory the planner cannot use; the message says what to record."""


@dataclass(frozen=True)
class Iterations:
    """Every engine iteration of the trace: ``decoding`` sequences decoded, ``prefill`` prompt
    tokens prefilled, ``seconds`` it took; arrays of one length."""

    decoding: np.ndarray
    prefill: np.ndarray
    seconds: np.ndarray


@dataclass(frozen=True)
class Trajectory:
    """One agent-loop trajectory: its turns, and the seconds between a turn's end and the next
    turn's start (tool calls and the loop's own work): ``tool_s`` in all, ``gaps`` each apart in
    order (empty where not known)."""

    trajectory_id: str
    turns: int
    tool_s: float
    gaps: tuple[float, ...] = ()


@dataclass(frozen=True)
class JobRecord:
    """The recorded job. ``stages``: step -> stage -> seconds (the wall span of that stage's
    spans in that step, all workers together); ``output_lengths``: each finished request's
    generated tokens; ``engine``: the :class:`EngineModel` fitted to ``iterations`` (``None``
    without iterations); ``slots``: the engines' ``max_num_seqs`` (else the most running seen)."""

    directory: str
    stages: dict[int, dict[str, float]]
    output_lengths: np.ndarray
    iterations: Iterations
    engines: tuple[str, ...]
    slots: int | None
    engine: EngineModel | None
    mean_prompt_tokens: float
    trajectories: tuple[Trajectory, ...]

    @property
    def steps(self) -> int:
        return len(self.stages)

    def stage_s(self) -> dict[str, float]:
        """Each stage's median seconds over the steps that ran it (the median: a first step's
        warm-up does not move it), in verl's stage order."""
        per: dict[str, list[float]] = defaultdict(list)
        for stages in self.stages.values():
            for name, seconds in stages.items():
                per[name].append(seconds)
        return {name: statistics.median(per[name]) for name in STAGES if name in per}

    @property
    def requests_per_step(self) -> float:
        """Finished requests per recorded step (all of them where no step was recorded)."""
        return len(self.output_lengths) / max(self.steps, 1)


def _stages(spans: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    bounds: dict[tuple[int, str], list[float]] = {}
    for e in spans:
        args = e.get("args", {})
        if e["name"] not in STAGES or args.get("section") or "step" not in args:
            continue  # heartbeat sections repeat a stage per rank; a stage span always has its step
        span = bounds.setdefault((int(args["step"]), e["name"]), [e["ts"], e["ts"] + e["dur"]])
        span[:] = min(span[0], e["ts"]), max(span[1], e["ts"] + e["dur"])
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for (step, name), (lo, hi) in sorted(bounds.items()):
        out[step][name] = (hi - lo) / 1e6
    return dict(out)


def _iterations(spans: list[dict[str, Any]]) -> tuple[Iterations, tuple[str, ...]]:
    """An iteration's decoded sequences are its running ones (reported after it: those that
    finished in it are missed, a small undercount) but never more than its scheduled tokens;
    the scheduled tokens beyond one per decoded sequence are prefill."""
    its = [e for e in spans if e["name"] == "iteration"]
    running = np.array([int(e["args"].get("running", 0)) for e in its], dtype=int)
    tokens = np.array([int(e["args"].get("tokens", 0)) for e in its], dtype=int)
    decoding = np.minimum(running, tokens)
    seconds = np.array([e["dur"] / 1e6 for e in its], dtype=float)
    engines = tuple(sorted({e["worker"] for e in its}))
    return Iterations(decoding, tokens - decoding, seconds), engines


def _trajectories(instants: list[dict[str, Any]]) -> tuple[Trajectory, ...]:
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in instants:
        if e["name"].startswith("trajectory_"):
            by_id[e["worker"]].append(e)
    out = []
    for tid, events in sorted(by_id.items()):
        turns, gaps_us, ended = 0, [], None
        for e in sorted(events, key=lambda e: e["ts"]):
            kind = e["name"].removeprefix("trajectory_")
            if kind == "turn_start":
                turns += 1
                if ended is not None:
                    gaps_us.append(e["ts"] - ended)
            elif kind == "turn_end":
                ended = e["ts"]
        gaps = tuple(g / 1e6 for g in gaps_us)
        out.append(Trajectory(tid, turns, sum(gaps), gaps if len(gaps) == turns - 1 else ()))
    return tuple(out)


def _slots(instants: list[dict[str, Any]], its: Iterations) -> int | None:
    declared = [int(e["args"]["max_num_seqs"]) for e in instants
                if e["name"] == "engine_started" and e.get("args", {}).get("max_num_seqs")]
    if declared:
        return max(declared)
    return int(its.decoding.max()) if len(its.decoding) and its.decoding.max() > 0 else None


def record(directory: str | Path) -> JobRecord:
    """The job summary of the trace in ``directory``; raises :class:`RecordError` when it holds
    no event, or neither a stage nor an engine iteration."""
    events = load_events(directory)
    if not events:
        raise RecordError(f"no rlweave trace in {directory} (*.jsonl): record one with "
                          f"+rlweave.tracing.enable=true +rlweave.tracing.dir={directory}")
    spans = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] != "X"]
    stages = _stages(spans)
    its, engines = _iterations(spans)
    if not stages and not len(its.seconds):
        raise RecordError(f"the trace in {directory} has no trainer stage and no engine iteration: record the "
                          f"job with the tracing plugin enabled in the trainer and in the engines")
    lengths = np.array([int(e["args"]["output_len"]) for e in spans if e["name"] == "request"], dtype=int)
    slots = _slots(instants, its)
    engine = None
    if len(its.seconds) >= 3:  # a line through fewer points says nothing
        engine = EngineModel.fit(its.decoding, its.seconds, slots=slots, prefill_tokens=its.prefill)
    prompts = float(its.prefill.sum()) / len(lengths) if len(lengths) else 0.0
    return JobRecord(str(directory), stages, lengths, its, engines, slots, engine, prompts,
                     _trajectories(instants))
