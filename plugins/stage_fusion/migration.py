"""RLHFuse's inter-stage fusion: when to migrate the generation tail, and onto how many instances.

In a synchronous RL step the inference stage (old log-probs, reference log-probs, critic values,
reward) waits for the batch's slowest sample. Run per sample, inference starts as soon as each
sample finishes, but while the long tail generates, the devices it generates on are busy, and
inference there runs beside it at a fraction of its speed. RLHFuse moves the last few samples
onto a few instances (abort, resubmit prompt plus generated tokens, re-prefill: greedy decoding
gives the same tokens), so that the devices of the others run inference alone. Decoding a
small batch costs about what decoding a smaller one does, so the tail barely slows.

The decision (RLHFuse's threshold ``R_t`` and the number of destination instances) is chosen
here by simulating one step on a cost model fitted to measured profiles, not set as a constant:

- :class:`EngineCost`: seconds per decode iteration ``base_s + per_seq_s * b`` with ``b``
  sequences running, re-prefill seconds per token, batch slots;
- :class:`InferenceCost`: inference seconds per sample on a device no engine decodes on, the
  slowdown of both the inference and the engine while they share a device, and how many
  samples the trainer infers at a time (its dynamic batch: a batch waits for its last sample,
  so the step's last batch starts only when generation ends);
- the step's output lengths: the previous step's, as the plugin saw them finish (RL steps draw
  from one dataset; the first step, with none seen, does not migrate).

:func:`simulate_stage` plays one step event by event: each instance runs continuous batching
over the samples verl's balancer gives it (least in flight first, so in turn), the trainer
infers finished samples first come first served, a dynamic batch at a time, and an instance that shares the trainer's
devices and the trainer slow each other down while both run. At the threshold, the unfinished
samples of the source instances join the destinations after their re-prefill. The stage ends
when the last sample's inference does. The trainer may also hold the inference of the samples
that finish before the migration until it has freed the trainer's devices, as RLHFuse runs
inference on the devices migration frees: inference beside a decoding instance slows both, and
where that costs more than the wait, holding pays. :func:`plan_migration` tries every
threshold, destination count and whether inference waits, and keeps the fastest, or none where
migrating does not pay.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rlweave.types import FusionStep, MigrationPlan, RolloutInstance

ORDERS = 8  # dispatch orders the prediction averages over (the balancer's placement is not known ahead)
MIN_GAIN = 0.01  # a plan must predict a stage at least this much shorter than not migrating


@dataclass(frozen=True)
class EngineCost:
    """One engine instance: a decode iteration with ``b`` sequences running takes ``base_s +
    per_seq_s * b`` seconds; re-prefilling a migrated sample costs ``prefill_s_per_token`` per
    token of its context (prompt and generated tokens)."""

    base_s: float
    per_seq_s: float
    prefill_s_per_token: float

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.per_seq_s < 0 or self.prefill_s_per_token < 0:
            raise ValueError(f"bad EngineCost {self}: base_s > 0, per_seq_s >= 0, prefill_s_per_token >= 0")

    def iteration_s(self, running: int) -> float:
        return self.base_s + self.per_seq_s * running


@dataclass(frozen=True)
class InferenceCost:
    """The trainer's inference stage (reward, old and reference log-probs, values) per sample,
    on devices no engine decodes on; ``shared_slowdown``: how much slower both it and an engine
    run while they share a device (2: a core each gets half)."""

    per_sample_s: float
    shared_slowdown: float = 2.0
    batch: int = 1  # samples inferred together; a batch starts once all of them have finished

    def __post_init__(self) -> None:
        if self.per_sample_s <= 0 or self.shared_slowdown < 1 or self.batch < 1:
            raise ValueError(f"bad InferenceCost {self}: per_sample_s > 0, shared_slowdown >= 1 and batch >= 1")


@dataclass
class _Instance:
    slots: int
    shares: bool  # runs on the trainer's devices
    active: bool = True  # False once its samples migrated away
    running: dict[int, int] = field(default_factory=dict)  # sample -> tokens left
    waiting: deque[int] = field(default_factory=deque)


def simulate_stage(lengths: Sequence[int], instances: Sequence[RolloutInstance], engine: EngineCost,
                   inference: InferenceCost, prompt_len: int = 0, threshold: int = 0,
                   destinations: Sequence[str] = (), inference_waits: bool = False) -> float:
    """Seconds from the step's start until the last sample's inference is done (see the
    module docstring). ``lengths``: output tokens per sample, in dispatch order; samples go to
    ``instances`` in turn. ``threshold`` 0: no migration. ``inference_waits``: finished samples
    are not inferred before the migration (the step's last ones aside)."""
    if not len(instances) or not len(lengths):
        raise ValueError("simulate_stage needs at least one instance and one sample")
    ids = [i.instance_id for i in instances]
    engines = [_Instance(max(1, i.slots), i.shares_inference_devices) for i in instances]
    left = np.asarray(lengths, dtype=int).copy()
    for s in range(len(left)):
        engines[s % len(engines)].waiting.append(s)
    for e in engines:
        _start_waiting(e, left)
    dest = {ids.index(d) for d in destinations}
    events = [(engine.iteration_s(len(e.running)), k) for k, e in enumerate(engines) if e.running]
    heapq.heapify(events)
    unfinished, migrated = len(left), threshold <= 0
    inferer = _Inference(inference, holding=inference_waits and not migrated)
    while events:
        now, k = heapq.heappop(events)
        inferer.advance(now, engines)
        e = engines[k]
        for s in list(e.running):
            e.running[s] -= 1
            if e.running[s] == 0:
                del e.running[s]
                unfinished -= 1
                inferer.arrive(last=unfinished == 0)
        _start_waiting(e, left)
        delay = 0.0
        if not migrated and unfinished <= threshold:
            migrated = True
            events, delay = _migrate(engines, dest, left, lengths, prompt_len, engine, now, k, events)
            inferer.release()
        if e.active and e.running:
            wall = _wall_s(e, engine.iteration_s(len(e.running)), inferer, inference)
            heapq.heappush(events, (now + delay + wall, k))
    return inferer.finish()


def _start_waiting(e: _Instance, left: np.ndarray) -> None:
    while e.waiting and len(e.running) < e.slots:
        s = e.waiting.popleft()
        e.running[s] = int(left[s])


def _wall_s(e: _Instance, iteration_s: float, inferer: _Inference, cost: InferenceCost) -> float:
    """Wall seconds of an iteration that needs ``iteration_s`` alone: on the trainer's devices,
    it and the queued inference each run ``shared_slowdown`` times slower while both have work."""
    if not e.shares:
        return iteration_s
    return iteration_s + (cost.shared_slowdown - 1) * min(inferer.queued, iteration_s)


def _migrate(engines: list[_Instance], dest: set[int], left: np.ndarray, lengths: Sequence[int], prompt_len: int,
             engine: EngineCost, now: float, current: int,
             events: list[tuple[float, int]]) -> tuple[list[tuple[float, int]], float]:
    """Move every unfinished sample of the non-destination instances to the destinations (in
    turn); each destination pays the re-prefill of what it receives before its next iteration.
    Returns the events, and that delay for instance ``current`` (whose next iteration the
    caller schedules)."""
    moved: list[int] = []
    for k, e in enumerate(engines):
        if k in dest or not e.active:
            continue
        for s, tokens in e.running.items():
            left[s] = tokens
            moved.append(s)
        moved += list(e.waiting)
        e.running.clear()
        e.waiting.clear()
        e.active = False
    targets = sorted(dest)
    prefill = {k: 0.0 for k in targets}
    for i, s in enumerate(moved):
        k = targets[i % len(targets)]
        engines[k].waiting.append(s)
        prefill[k] += engine.prefill_s_per_token * (prompt_len + int(lengths[s]) - int(left[s]))
    events = [(t, k) for t, k in events if engines[k].active]
    scheduled = {k for _, k in events}
    for k in targets:
        _start_waiting(engines[k], left)
        if k in scheduled:  # the destination's next iteration waits for the re-prefill
            events = [(t + prefill[k], j) if j == k else (t, j) for t, j in events]
        elif k != current and engines[k].running:
            events.append((now + prefill[k] + engine.iteration_s(len(engines[k].running)), k))
    heapq.heapify(events)
    return events, prefill.get(current, 0.0)


class _Inference:
    """The trainer's inference queue: finished samples in arrival order, ``per_sample_s`` each,
    released to the trainer a dynamic batch (``cost.batch`` samples, or the step's last ones)
    at a time, ``shared_slowdown`` times slower while an instance on its devices decodes."""

    def __init__(self, cost: InferenceCost, holding: bool = False) -> None:
        self.cost = cost
        self.now = 0.0
        self.queued = 0.0  # work (seconds on free devices) released to the trainer, not yet done
        self.gathering = 0  # finished samples waiting for their batch to fill (or held)
        self.holding = holding  # until the migration: finished samples wait for the freed devices
        self.shared_busy = False

    def advance(self, now: float, engines: list[_Instance]) -> None:
        rate = 1.0 / self.cost.shared_slowdown if self.shared_busy else 1.0
        self.queued = max(0.0, self.queued - (now - self.now) * rate)
        self.now = now
        self.shared_busy = any(e.shares and e.active and e.running for e in engines)

    def arrive(self, last: bool = False) -> None:
        self.gathering += 1
        if last or (not self.holding and self.gathering >= self.cost.batch):
            self._take(self.gathering)

    def release(self) -> None:
        """The migration freed the devices: the held samples go, in whole dynamic batches."""
        self.holding = False
        self._take(self.gathering // self.cost.batch * self.cost.batch)

    def _take(self, samples: int) -> None:
        self.queued += samples * self.cost.per_sample_s
        self.gathering -= samples

    def finish(self) -> float:
        """When the queue empties once generation has ended (no engine shares the devices then)."""
        return self.now + self.queued


def roles(instances: Sequence[RolloutInstance]) -> tuple[tuple[str, ...], list[str]]:
    """The instances a migration frees (those on the trainer's devices) and those it can move
    their samples onto."""
    return (tuple(i.instance_id for i in instances if i.shares_inference_devices),
            [i.instance_id for i in instances if not i.shares_inference_devices])


def plan_migration(step: FusionStep, lengths: Sequence[int], engine: EngineCost, inference: InferenceCost,
                   threshold: int = 0, seed: int = 0, inference_waits: bool | None = None) -> MigrationPlan | None:
    """The fastest predicted migration for ``step`` (``lengths``: its expected output lengths),
    or ``None`` where none predicts a stage at least ``MIN_GAIN`` shorter than not migrating.
    Sources are the instances that share the trainer's devices (their devices are what
    migration frees); destinations are chosen among the others, the fewest that hold the tail;
    and inference waits for the freed devices where that predicts a shorter stage.
    ``threshold`` > 0 fixes the threshold instead of searching it (without ``lengths``, onto one
    destination, with no prediction); ``inference_waits`` fixes whether inference waits."""
    instances = step.instances
    sources, others = roles(instances)
    if not sources or not others:
        return None
    if not lengths:  # nothing to predict from: a fixed threshold onto one destination
        return (MigrationPlan(threshold, sources, tuple(others[:1]), float("nan"), float("nan"),
                              bool(inference_waits)) if threshold > 0 else None)
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(np.asarray(lengths)) for _ in range(ORDERS)]

    def predict(r: int, dest: Sequence[str], waits: bool) -> float:
        return float(np.mean([simulate_stage(o, instances, engine, inference, step.prompt_len, r, dest, waits)
                              for o in orders]))

    without = predict(0, (), False)
    candidates = range(1, len(lengths)) if threshold <= 0 else (min(threshold, len(lengths)),)
    best: tuple[float, int, tuple[str, ...], bool] | None = None
    for m in range(1, len(others) + 1):
        dest = tuple(others[:m])
        for r in candidates:
            for waits in (False, True) if inference_waits is None else (inference_waits,):
                predicted = predict(r, dest, waits)
                if best is None or predicted < best[0] - 1e-9:
                    best = (predicted, r, dest, waits)
    assert best is not None
    predicted, r, dest, waits = best
    if threshold <= 0 and predicted > (1 - MIN_GAIN) * without:
        return None
    return MigrationPlan(threshold=r, sources=sources, destinations=dest, predicted_stage_s=predicted,
                         predicted_stage_s_without=without, inference_waits=waits)
