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

- :func:`engine_cost`: the shared :class:`rlweave.sim.EngineModel`, seconds per decode
  iteration ``base_s + per_seq_s * b`` with ``b`` sequences running and re-prefill seconds per
  token (each instance's slots are its own);
- :class:`InferenceCost`: inference seconds per sample on a device no engine decodes on, the
  slowdown of both the inference and the engine while they share a device, and how many
  samples the trainer infers at a time (its dynamic batch: a batch waits for its last sample,
  so the step's last batch starts only when generation ends);
- the step's output lengths: the previous step's, as the plugin saw them finish (RL steps draw
  from one dataset; the first step, with none seen, does not migrate).

:func:`simulate_stage` plays one step iteration by iteration on the shared simulator
(:class:`rlweave.sim.stepped.SteppedSimulator`, the step its listener): each instance runs continuous
batching over the samples verl's balancer gives it (least in flight first, so in turn), the trainer
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from rlweave.sim import EngineModel, Request
from rlweave.sim.stepped import SteppedSimulator
from rlweave.types import FusionStep, MigrationPlan, RolloutInstance

ORDERS = 8  # dispatch orders the prediction averages over (the balancer's placement is not known ahead)
ORDERS_IN_FULL_UP_TO = 64  # samples; past it, fewer orders in proportion (at least 2): see _orders
MIN_GAIN = 0.01  # a plan must predict a stage at least this much shorter than not migrating
GRID = 24  # thresholds tried per round: every one up to this many samples, then coarse to fine


def engine_cost(base_s: float, per_seq_s: float, prefill_s_per_token: float) -> EngineModel:
    """One engine instance on the shared model: a decode iteration with ``b`` sequences running
    takes ``base_s + per_seq_s * b`` seconds; re-prefilling a migrated sample costs
    ``prefill_s_per_token`` per token of its context (prompt and generated tokens). Its slots
    are each instance's own (:class:`RolloutInstance`)."""
    if base_s <= 0 or per_seq_s < 0 or prefill_s_per_token < 0:
        raise ValueError(f"bad engine cost (base_s {base_s}, per_seq_s {per_seq_s}, prefill_s_per_token "
                         f"{prefill_s_per_token}): base_s > 0, per_seq_s >= 0, prefill_s_per_token >= 0")
    return EngineModel(base_s=base_s, per_seq_s=per_seq_s, prefill_s_per_token=prefill_s_per_token)


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


def simulate_stage(lengths: Sequence[int], instances: Sequence[RolloutInstance], engine: EngineModel,
                   inference: InferenceCost, prompt_len: int = 0, threshold: int = 0,
                   destinations: Sequence[str] = (), inference_waits: bool = False) -> float:
    """Seconds from the step's start until the last sample's inference is done (see the
    module docstring). ``lengths``: output tokens per sample, in dispatch order; samples go to
    ``instances`` in turn. ``threshold`` 0: no migration. ``inference_waits``: finished samples
    are not inferred before the migration (the step's last ones aside)."""
    if not len(instances) or not len(lengths):
        raise ValueError("simulate_stage needs at least one instance and one sample")
    ids = [i.instance_id for i in instances]
    dest = sorted(ids.index(d) for d in destinations)
    step = _Step(inference, [i.shares_inference_devices for i in instances], len(lengths), threshold,
                 dest, [k for k in range(len(ids)) if k not in dest], inference_waits)
    sim = SteppedSimulator([engine] * len(instances), step, slots=[max(1, i.slots) for i in instances],
                           prompts_prefilled=True)
    sim.submit([Request(s, 0.0, int(n), prompt_len) for s, n in enumerate(lengths)])
    sim.run()
    return step.inferer.finish()


class _Step:
    """The step as the simulator's listener: finished samples feed the trainer's inference
    queue, which slows the engines on its devices; at the threshold, the samples of every
    engine but the destinations move onto them."""

    def __init__(self, inference: InferenceCost, shares: list[bool], samples: int, threshold: int,
                 destinations: list[int], sources: list[int], waits: bool) -> None:
        self.cost, self.shares = inference, shares
        self.sharing = [k for k, s in enumerate(shares) if s]
        self.unfinished, self.threshold = samples, threshold
        self.destinations, self.sources = destinations, sources
        self.migrated = threshold <= 0
        self.inferer = _Inference(inference, holding=waits and not self.migrated)

    def iteration_ended(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        self.inferer.advance(now, any(sim.running(k) for k in self.sharing))

    def finished(self, sim: SteppedSimulator, request: int, now: float) -> None:
        self.unfinished -= 1
        self.inferer.arrive(last=self.unfinished == 0)

    def boundary(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        if not self.migrated and self.unfinished <= self.threshold:
            self.migrated = True
            sim.move(self.sources, self.destinations, now)
            self.inferer.release()

    def wall_s(self, sim: SteppedSimulator, engine: int, iteration_s: float) -> float:
        """On the trainer's devices, the iteration and the queued inference each run
        ``shared_slowdown`` times slower while both have work."""
        if not self.shares[engine]:
            return iteration_s
        return iteration_s + (self.cost.shared_slowdown - 1) * min(self.inferer.queued, iteration_s)


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

    def advance(self, now: float, shared_busy: bool) -> None:
        """Work done since the last event, at the speed the devices' sharing then allowed;
        ``shared_busy``: whether an engine on the trainer's devices decodes from ``now``."""
        rate = 1.0 / self.cost.shared_slowdown if self.shared_busy else 1.0
        self.queued = max(0.0, self.queued - (now - self.now) * rate)
        self.now = now
        self.shared_busy = shared_busy

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


def plan_migration(step: FusionStep, lengths: Sequence[int], engine: EngineModel, inference: InferenceCost,
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
    orders = [rng.permutation(np.asarray(lengths)) for _ in range(_orders(len(lengths)))]

    def predict(r: int, dest: Sequence[str], waits: bool) -> float:
        return float(np.mean([simulate_stage(o, instances, engine, inference, step.prompt_len, r, dest, waits)
                              for o in orders]))

    without = predict(0, (), False)
    fixed = (min(threshold, len(lengths)),) if threshold > 0 else None
    options = []  # (predicted, destinations used, threshold, inference waits)
    for m in range(1, len(others) + 1):
        for waits in (False, True) if inference_waits is None else (inference_waits,):
            shortest, r = _best_threshold(partial(predict, dest=tuple(others[:m]), waits=waits), len(lengths) - 1,
                                          fixed)
            options.append((shortest, m, r, waits))
    predicted, m, r, waits = _first_shortest(options)
    dest = tuple(others[:m])
    if threshold <= 0 and predicted > (1 - MIN_GAIN) * without:
        return None
    return MigrationPlan(threshold=r, sources=sources, destinations=dest, predicted_stage_s=predicted,
                         predicted_stage_s_without=without, inference_waits=waits)


def _orders(samples: int) -> int:
    """How many dispatch orders to average over. A stage's spread over orders shrinks as the
    batch grows, and each order is a whole simulated step: on 128 samples (4 instances x 16
    slots, lognormal lengths) 4 orders chose 8's plans, on 256 2 orders chose one 0.14% slower
    when both were judged on 8 fresh orders, at a half and a quarter of the time."""
    return max(2, ORDERS * ORDERS_IN_FULL_UP_TO // max(samples, 1)) if samples > ORDERS_IN_FULL_UP_TO else ORDERS


def _best_threshold(predict: Callable[[int], float], most: int,
                    fixed: tuple[int, ...] | None = None) -> tuple[float, int]:
    """The threshold in 1..``most`` (or among ``fixed``) with the shortest predicted stage, and
    its prediction. Up to ``GRID`` thresholds every one is tried; beyond, a geometric grid (a
    tail is a few samples, so small thresholds matter most), then the grid between the best
    point's neighbours, until that bracket is exhausted: a few rounds of about ``GRID``
    predictions, where trying every threshold grows with the square of the batch."""
    seen: dict[int, float] = {}
    candidates = list(fixed) if fixed else _grid(1, most)
    while True:
        seen.update((r, predict(r)) for r in candidates)
        order = sorted(seen)
        _, best = _first_shortest([(seen[r], r) for r in order])
        if fixed:
            return seen[best], best
        i = order.index(best)
        candidates = [r for r in _grid(order[max(i - 1, 0)], order[min(i + 1, len(order) - 1)]) if r not in seen]
        if not candidates:
            return seen[best], best


def _first_shortest(options: list[tuple]) -> tuple:
    """The option with the shortest prediction (its first field); among those within float noise
    of it, the first in the order of the other fields (fewest destinations, lowest threshold,
    inference not waiting), as trying them in that order and keeping the first found did."""
    shortest = min(o[0] for o in options)
    return min((o for o in options if o[0] < shortest + 1e-9), key=lambda o: o[1:])


def _grid(low: int, high: int) -> list[int]:
    if high - low + 1 <= GRID:
        return list(range(low, high + 1))
    return sorted({int(round(x)) for x in np.geomspace(low, high, GRID)})
