"""StreamRL's resource planner: how many generation and training instances on each pool.

Disaggregation only pays if the two stages are balanced: too few engines and the trainer
waits, too many and they idle behind the trainer. The planner takes profiles measured on the
real engines and trainer and searches every split of every hardware pool:

1. For each pool, ``g`` generation instances (``0 .. devices // generation.devices``); the
   rest of the pool's devices hold training instances (more trainers never lower throughput).
2. Predict the step of each split (below) and keep the one with the most samples/s.

Prediction of one step, for ``workload.lengths`` [groups, group_size] output tokens in dispatch
order (sort them by the ranker's scores for skewness-aware dispatch):

- **Generation** is simulated event by event on rlweave's one continuous-batching simulator
  (:mod:`rlweave.sim`). Engines pull whole groups from one queue while they have a free batch
  slot, and run continuous batching: with ``b`` sequences running, an iteration makes one
  token of each in ``b / tokens_per_s(b)`` seconds (the profile, linearly interpolated). This is
  what exposes the skewness bubble: in the tail ``b`` drops and so does throughput.
- **Training** runs data-parallel over the training instances at ``sum(1 / seconds_per_sample)``
  samples/s.
- ``colocated`` (verl's synchronous loop): every device generates, then every device trains:
  ``dispatch_s + T_gen + delivery_s + T_train + weight_sync_s``. Where the trainer learns of
  the batch by polling every ``poll_s`` from the step's start (verl's replay buffer: 2 s), it
  takes the batch at the first poll after ``dispatch_s + T_gen + delivery_s``.
- ``on_policy`` (stream): whenever the trainer is free it takes every complete group, in whole
  mini-batches of ``minibatch_groups`` (a dynamic batch; at least one mini-batch, waiting for
  it; groups are ready ``dispatch_s + delivery_s`` after their simulated completion), and
  prepares it; the optimizer steps, ``deferred_share`` of the training time, wait for
  the step's last group when the trainer recomputes the old log-probs (after a step it no
  longer holds the generating weights); with the rollout's log-probs they stream with the rest
  and ``deferred_share`` is 0:
  ``end of the last preparation + deferred training + weight_sync_s``.
- ``async`` (staleness 1) is simulated over several steps (:func:`simulate_async`), since
  its step is not a formula of one batch: the engines run the older batch's tail beside the
  next batch's prompts, the trainer takes dynamic batches of whatever is ready (the due groups
  first, keeping room for those still generating, as :func:`~.dynamic_batch.groups_to_take` decides),
  and at each step's end the trainer pushes weights (``weight_sync_s``) and the engines pause
  until the push has loaded (``dispatch_s`` after it), when the next batch joins the queue.
  The engines serve the queue in the order of submission, oldest batch first (vLLM's FCFS).
  Step time and both stages' idle are those of the simulated steady steps.
- ``fully_async`` is verl's ``fully_async_policy`` (:func:`simulate_fully_async`): the rollouter
  runs up to ``staleness`` of a sync window ahead (a fraction; 0 is streaming alone), the
  trainer takes whatever groups finished first, and with partial rollout a sync pauses the
  engines mid-generation instead of waiting for their active groups (:class:`FullyAsync`).
- **Shared cores**: where a pool's devices are CPU cores that the framework's host side (its
  driver, agent loops, data plane) shares with the engines and trainers, as on a CPU-only
  machine, the pool gives ``cpu_s_per_sample``, the measured CPU seconds per sample of every
  process but the engines (the trainers and the host side). A step that runs on that pool alone
  is at least ``(engine busy + samples * cpu_s_per_sample) / devices``, the engines' busy
  device-seconds as simulated (they batch differently per mode): the simulation gives each
  instance its device to itself, and when the trainer's core is saturated (async) the host
  side's share of it is what the simulation misses. On accelerators the host has cores of its
  own and the field stays 0.

Prefill is not modelled separately (measure the generation profile with realistic prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from itertools import product

import numpy as np

from rlweave.plugins.stream_generation.dynamic_batch import groups_to_take
from rlweave.sim import EngineModel, PullGroups, Request, Simulator
from rlweave.types import DynamicBatchRequest

ASYNC_STALENESS = 1  # weight versions an async sample may lag (verl's threshold is one more)
ASYNC_DEFAULT_STEPS = 6  # batches simulated when the workload gives only one (it repeats)


class PlanError(ValueError):
    """The resources cannot hold a plan; the message names the cause and the fix."""


class PlanMode(str, Enum):
    COLOCATED = "colocated"
    ON_POLICY = "on_policy"
    ASYNC = "async"
    FULLY_ASYNC = "fully_async"  # verl's fully_async_policy: fractional staleness, partial rollout


@dataclass(frozen=True)
class FullyAsync:
    """verl's ``fully_async_policy`` settings the ``fully_async`` mode simulates
    (:func:`simulate_fully_async`). ``staleness``: ``async_training.staleness_threshold``, the
    share of a sync window's samples the rollouter may generate ahead of the trainer (0: streaming
    alone); ``partial_rollout``: at a parameter sync the engines pause and keep what they have
    generated, and resume after (``False``: the sync waits for every active sample to finish
    and nothing new starts meanwhile). One sync window is the workload's batch; the trainer's
    local update is ``Workload.minibatch_groups`` groups (``require_batches`` mini-batches)."""

    staleness: float = 0.5
    partial_rollout: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.staleness:
            raise ValueError(f"FullyAsync.staleness must be >= 0, got {self.staleness}")


@dataclass(frozen=True)
class GenerationProfile:
    """One engine instance on ``devices`` devices: total tokens/s at each batch size.
    ``batch_sizes`` start at 1 and increase; the last is the instance's batch cap."""

    batch_sizes: tuple[int, ...]
    tokens_per_s: tuple[float, ...]
    devices: int = 1

    def __post_init__(self) -> None:
        b, t = np.asarray(self.batch_sizes), np.asarray(self.tokens_per_s)
        if (len(b) == 0 or len(b) != len(t) or b[0] != 1 or np.any(np.diff(b) <= 0)
                or np.any(t <= 0) or self.devices < 1):
            raise ValueError(f"bad GenerationProfile {self}: batch_sizes must start at 1 and increase, "
                             f"with one positive tokens_per_s each, and devices >= 1")

    @property
    def model(self) -> EngineModel:
        """The instance's iteration cost as the shared engine model (its last batch size is its
        slot count)."""
        return EngineModel.from_throughput(self.batch_sizes, self.tokens_per_s)

    def slowed(self, factor: float) -> GenerationProfile:
        """The same engine, every batch size ``factor`` times slower (``factor`` < 1: faster)."""
        if factor <= 0:
            raise ValueError(f"GenerationProfile.slowed: factor must be > 0, got {factor}")
        return replace(self, tokens_per_s=tuple(t / factor for t in self.tokens_per_s))


@dataclass(frozen=True)
class TrainingProfile:
    """One data-parallel training instance on ``devices`` devices. ``deferred_share``: the part
    of ``seconds_per_sample`` that on-policy streaming cannot start before the step's last
    sample (the optimizer steps); the rest (reward, log-probs, advantages) streams."""

    seconds_per_sample: float
    devices: int = 1
    deferred_share: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds_per_sample <= 0 or self.devices < 1 or not 0 <= self.deferred_share <= 1:
            raise ValueError(f"bad TrainingProfile {self}: seconds_per_sample > 0, devices >= 1 and "
                             f"deferred_share in [0, 1]")


@dataclass(frozen=True)
class HardwarePool:
    """Devices of one kind; a profile is ``None`` where that stage cannot run on the pool.
    ``cpu_s_per_sample``: where the devices are cores shared with the host side, the CPU
    seconds per sample of the trainers and the host side (see the module docstring); 0
    elsewhere."""

    name: str
    devices: int
    generation: GenerationProfile | None = None
    training: TrainingProfile | None = None
    cpu_s_per_sample: float = 0.0

    def __post_init__(self) -> None:
        if self.cpu_s_per_sample < 0:
            raise ValueError(f"HardwarePool {self.name!r}: cpu_s_per_sample must be >= 0, got {self.cpu_s_per_sample}")


@dataclass(frozen=True)
class Workload:
    """One training step: ``lengths`` [groups, group_size] output tokens in dispatch order;
    the trainer takes ``minibatch_groups`` groups per mini-batch; ``weight_sync_s`` publishes
    new weights to the engines. ``dispatch_s``: from the step's start until the engines run
    its prompts (the framework submitting them); ``delivery_s``: from a group's last token until
    the trainer holds it (the framework storing and announcing it). Both are measured, not
    modelled. ``poll_s``: colocated only, the trainer looks for the finished batch every
    ``poll_s`` from the step's start (verl's synchronous replay buffer sleeps 2 s between looks);
    0: it is told at once. ``following``: the batches of the steps after this one, the same
    shape (async mode generates them while this one trains); empty: this batch again."""

    lengths: np.ndarray
    minibatch_groups: int
    weight_sync_s: float = 0.0
    dispatch_s: float = 0.0
    delivery_s: float = 0.0
    poll_s: float = 0.0
    following: tuple[np.ndarray, ...] = ()

    def __post_init__(self) -> None:
        lengths = np.asarray(self.lengths)
        if lengths.ndim != 2 or lengths.size == 0 or np.any(lengths < 1):
            raise ValueError(f"Workload.lengths must be [groups, group_size] of positive token counts, "
                             f"got shape {lengths.shape}")
        if any(np.shape(b) != lengths.shape or np.any(np.asarray(b) < 1) for b in self.following):
            raise ValueError(f"every Workload.following batch must have the shape of lengths {lengths.shape} "
                             f"and positive token counts")
        if self.minibatch_groups < 1 or min(self.weight_sync_s, self.dispatch_s, self.delivery_s, self.poll_s) < 0:
            raise ValueError(f"minibatch_groups ({self.minibatch_groups}) must be >= 1, and weight_sync_s "
                             f"({self.weight_sync_s}), dispatch_s ({self.dispatch_s}), delivery_s "
                             f"({self.delivery_s}) and poll_s ({self.poll_s}) >= 0")

    @property
    def samples(self) -> int:
        return int(np.asarray(self.lengths).size)

    def batches(self, count: int) -> list[np.ndarray]:
        """This batch and the following ones, ``count`` in all (cycling through them)."""
        given = [np.asarray(self.lengths), *map(np.asarray, self.following)]
        return [given[i % len(given)] for i in range(count)]


@dataclass(frozen=True)
class Plan:
    """Instances per pool for each stage, and the predicted step. Idle fractions are of the
    step time, averaged over instances."""

    mode: PlanMode
    generation: dict[str, int]
    training: dict[str, int]
    devices: dict[str, tuple[int, int]]  # pool -> (devices used for generation, for training)
    generation_s: float
    training_s: float
    step_s: float
    samples_per_s: float
    generation_idle: float
    training_idle: float

    def describe(self) -> str:
        """The plan as a few printable lines."""
        lines = [f"StreamRL plan ({self.mode.value}): {self.samples_per_s:.3g} samples/s predicted",
                 f"{'pool':<12}{'generation instances':>22}{'training instances':>20}"]
        for pool, (gen_devices, train_devices) in self.devices.items():
            lines.append(f"{pool:<12}{self.generation.get(pool, 0):>12} ({gen_devices} dev)"
                         f"{self.training.get(pool, 0):>12} ({train_devices} dev)")
        lines.append(f"step {self.step_s:.3g} s: generation {self.generation_s:.3g} s "
                     f"(idle {self.generation_idle:.0%}), training {self.training_s:.3g} s "
                     f"(idle {self.training_idle:.0%})")
        return "\n".join(lines)


class ContinuousBatching:
    """Generation on ``engines`` of the groups of ``lengths`` [groups, group_size] that are
    submitted, on the shared simulator (:class:`rlweave.sim.Simulator`), fluid: a group claimed
    mid-iteration starts at once, and a pause keeps the fraction of a token made.

    An engine claims the next whole group (lowest id first: ids are the order of priority)
    while it has fewer than its batch cap of sequences running or waiting (on a submission
    engines claim in turn, one group per round), and starts waiting sequences as slots free up.
    A pause stops every engine and keeps what it has made (verl's partial rollout).
    """

    def __init__(self, lengths: np.ndarray, engines: list[GenerationProfile]) -> None:
        self.lengths = np.asarray(lengths, dtype=float)
        self.group_size = self.lengths.shape[1]
        self.sim = Simulator([e.model for e in engines], placement=PullGroups(), fluid=True)

    def submit(self, groups: range | list[int], now: float) -> None:
        self.sim.submit([Request(g * self.group_size + j, now, float(self.lengths[g, j]), group=g)
                         for g in groups for j in range(self.group_size)])

    @property
    def done(self) -> np.ndarray:
        """Completion time of each group (``inf``: not complete, or not submitted)."""
        finish = np.full(self.lengths.size, np.inf)
        for i, t in self.sim.finish_s.items():
            finish[i] = t
        return finish.reshape(self.lengths.shape).max(axis=1)

    def busy(self, now: float = np.inf) -> np.ndarray:
        """Seconds each engine has decoded up to ``now``."""
        return self.sim.busy_s(now)

    def pause(self, now: float, until: float) -> None:
        """No engine makes progress from ``now`` to ``until``."""
        self.sim.pause(now, until)

    def next_event_s(self) -> float:
        """When the simulation next changes (``inf``: nothing left to run)."""
        return self.sim.next_event_s()

    def run_until(self, until: float) -> None:
        self.sim.run_until(until)


def simulate_generation(lengths: np.ndarray, engines: list[GenerationProfile]) -> tuple[np.ndarray, np.ndarray]:
    """One batch of ``lengths`` [groups, group_size] on ``engines``, submitted at time 0
    (:class:`ContinuousBatching`). Returns (completion time of each group, busy seconds of each
    engine)."""
    batching = ContinuousBatching(lengths, engines)
    batching.submit(range(len(batching.lengths)), 0.0)
    batching.run_until(np.inf)
    return batching.done, batching.busy()


@dataclass(frozen=True)
class AsyncSteps:
    """Simulated async steps: mean seconds per steady step (after the first, as measured) and
    the idle fraction of the engines (averaged) and of the trainer over them."""

    step_s: float
    generation_idle: float
    training_idle: float


def simulate_async(batches: list[np.ndarray], engines: list[GenerationProfile], seconds_per_group: float,
                   workload: Workload, staleness: int = ASYNC_STALENESS) -> AsyncSteps:
    """Async stream training of ``batches`` (one [groups, group_size] array per step, in
    dispatch order): ``len(batches) - staleness`` steps, see the module docstring.

    The first ``staleness + 1`` batches are submitted at the start; the end of step ``s``
    submits batch ``s + staleness``. A group is due at the last step its staleness bound allows
    (the step after its batch's, with staleness 1); the trainer takes the ready groups oldest
    first, as many as :func:`~.dynamic_batch.groups_to_take` allows, ``seconds_per_group`` each.
    """
    steps, per_step = len(batches) - staleness, len(batches[0])
    if steps < 2:
        raise ValueError(f"simulate_async needs at least {staleness + 2} batches for a steady step, got {len(batches)}")
    first = np.cumsum([0] + [len(b) for b in batches])  # first group id of each batch
    batching = ContinuousBatching(np.concatenate(batches), engines)
    # verl's tag: the step whose end submitted the batch, plus one (the first batches: 1).
    tag = np.concatenate([np.full(len(b), max(1, i - staleness + 1)) for i, b in enumerate(batches)])
    taken = np.zeros(len(tag), dtype=bool)
    submitted = first[staleness + 1]
    batching.submit(range(submitted), 0.0)
    now, step, got, ends, trainer_busy, engine_busy = 0.0, 1, 0, [], 0.0, None
    while step <= steps:
        batching.run_until(now)
        ready = ~taken[:submitted] & (batching.done[:submitted] + workload.delivery_s <= now)
        due = ~taken[:submitted] & (tag[:submitted] <= step - staleness)
        count = groups_to_take(DynamicBatchRequest(int((ready & due).sum()), int((ready & ~due).sum()),
                                                   int((due & ~ready).sum()), workload.minibatch_groups,
                                                   per_step - got))
        if not count:
            arrivals = batching.done[:submitted][~ready] + workload.delivery_s
            now = min(batching.next_event_s(), float(arrivals[arrivals > now].min(initial=np.inf)))
            if not np.isfinite(now):
                raise RuntimeError("simulate_async: the trainer waits for groups that never come")
            continue
        taken[np.flatnonzero(ready)[:count]] = True  # ids are oldest first
        got += count
        now += count * seconds_per_group
        trainer_busy += count * seconds_per_group if ends else 0.0
        if got < per_step:
            continue
        batching.run_until(now)  # the push: the trainer stages the weights and pauses the engines
        batching.pause(now, now + workload.weight_sync_s + workload.dispatch_s)
        now += workload.weight_sync_s
        trainer_busy += workload.weight_sync_s if ends else 0.0
        if step + staleness < len(batches):  # parked until the engines have loaded the weights
            batching.submit(range(submitted, first[step + staleness + 1]), now)
            submitted = first[step + staleness + 1]
        ends.append(now)
        if engine_busy is None:
            batching.run_until(now)
            engine_busy = batching.busy(now)
        step, got = step + 1, 0
    batching.run_until(now)
    window = ends[-1] - ends[0]
    return AsyncSteps(window / (len(ends) - 1), 1 - float((batching.busy(now) - engine_busy).mean()) / window,
                      1 - trainer_busy / window)


def simulate_fully_async(batches: list[np.ndarray], engines: list[GenerationProfile], seconds_per_group: float,
                         workload: Workload, policy: FullyAsync) -> AsyncSteps:
    """verl's fully async training of ``batches`` (one [groups, group_size] array per sync
    window, in dispatch order): the steady sync windows, as :class:`AsyncSteps`.

    1. **Rollouter.** Before the ``n``-th parameter sync it may have started at most
       ``(n + 1 + staleness)`` windows' groups in all (verl's ``rollout_num``), and it hands
       them to the engines at once, which claim them in order as slots free up (verl caps the
       prompts in flight per replica; where that cap holds more sequences than the engine has
       slots, as with its defaults, the engines run the same either way).
    2. **Trainer.** It takes the ready groups in the order they finished (verl's message
       queue), ``minibatch_groups`` at a time (a local update), ``seconds_per_group`` each, and
       after a window's groups pushes the weights (``weight_sync_s``).
    3. **The sync.** With ``partial_rollout`` the engines pause from the push until the weights
       have loaded (``dispatch_s`` after it) and keep what they made; without it the push
       waits for every group handed out to finish. Then the quota grows by one window.
    """
    per_step, group_size = len(batches[0]), np.asarray(batches[0]).shape[1]
    steps = len(batches) - math.ceil(policy.staleness)
    if steps < 2:
        raise ValueError(f"simulate_fully_async needs at least {math.ceil(policy.staleness) + 2} batches for a "
                         f"steady step, got {len(batches)}")
    batching = ContinuousBatching(np.concatenate(batches), engines)
    total = len(batching.lengths)
    done = np.full(total, np.inf)  # each group's completion, as far as the engines have run
    finished = np.zeros(total, dtype=int)
    seen, submitted = 0, 0

    def refresh() -> None:
        """Fold the requests finished since the last call into ``done`` (they come in time order)."""
        nonlocal seen
        finish = batching.sim.finish_s
        for request in list(finish)[seen:]:
            group = request // group_size
            finished[group] += 1
            if finished[group] == group_size:
                done[group] = finish[request]
        seen = len(finish)

    def hand_out(syncs: int, now: float) -> None:
        nonlocal submitted
        quota = min(total, math.floor((syncs + 1 + policy.staleness) * per_step + 1e-9))
        if quota > submitted:
            batching.submit(range(submitted, quota), now)
            submitted = quota

    taken = np.zeros(total, dtype=bool)
    now, got, ends, trainer_busy, engine_busy = 0.0, 0, [], 0.0, None
    hand_out(0, 0.0)
    while len(ends) < steps:
        batching.run_until(now)
        refresh()
        arrived = done + workload.delivery_s
        ready = np.flatnonzero(~taken & (arrived <= now))
        need = min(workload.minibatch_groups, per_step - got)
        if len(ready) < need:  # wait for the next group to reach the trainer
            later = float(arrived[~taken & (arrived > now)].min(initial=np.inf))
            now = min(batching.next_event_s(), later)
            if not np.isfinite(now):
                raise RuntimeError("simulate_fully_async: the trainer waits for groups that never come")
            continue
        taken[ready[np.argsort(done[ready], kind="stable")[:need]]] = True
        got += need
        now += need * seconds_per_group
        trainer_busy += need * seconds_per_group if ends else 0.0
        if got < per_step:
            continue
        batching.run_until(now)
        if not policy.partial_rollout:  # every group handed out finishes first
            batching.run_until(np.inf)
            refresh()
            now = max(now, float(done[:submitted].max()))
        batching.pause(now, now + workload.weight_sync_s + workload.dispatch_s)
        now += workload.weight_sync_s
        trainer_busy += workload.weight_sync_s if ends else 0.0
        hand_out(len(ends) + 1, now)
        ends.append(now)
        if engine_busy is None:
            engine_busy = batching.busy(now)
        got = 0
    batching.run_until(now)
    window = ends[-1] - ends[0]
    return AsyncSteps(window / (len(ends) - 1), 1 - float((batching.busy(now) - engine_busy).mean()) / window,
                      1 - trainer_busy / window)


def predict(pools: list[HardwarePool], workload: Workload, mode: PlanMode,
            generation: dict[str, int], training: dict[str, int], policy: FullyAsync | None = None) -> Plan:
    """The predicted step of one assignment of instances to pools (see the module docstring);
    ``policy``: the ``fully_async`` mode's settings (default :class:`FullyAsync`)."""
    by_name = {p.name: p for p in pools}
    engines = [by_name[name].generation for name, n in generation.items() for _ in range(n)]
    rate = sum(n / by_name[name].training.seconds_per_sample for name, n in training.items() if n)
    if not engines or not rate:
        raise PlanError(f"an assignment needs at least one generation and one training instance, "
                        f"got generation {generation} and training {training}")
    lengths = np.asarray(workload.lengths)
    done, busy = simulate_generation(lengths, engines)
    group_size = lengths.shape[1]
    t_gen, t_train = float(done.max()), workload.samples / rate
    latency = workload.dispatch_s + workload.delivery_s
    if mode in (PlanMode.ASYNC, PlanMode.FULLY_ASYNC):
        steps = 1 + len(workload.following) if workload.following else ASYNC_DEFAULT_STEPS
        steady = (simulate_async(workload.batches(steps), engines, group_size / rate, workload)
                  if mode is PlanMode.ASYNC else
                  simulate_fully_async(workload.batches(steps), engines, group_size / rate, workload,
                                       policy or FullyAsync()))
        step, idle = steady.step_s, (steady.generation_idle, steady.training_idle)
        engine_s = (1 - steady.generation_idle) * step * sum(e.devices for e in engines)
    else:
        if mode is PlanMode.COLOCATED:
            step = first_poll(latency + t_gen, workload.poll_s) + t_train + workload.weight_sync_s
        else:
            deferred = _deferred_share(by_name, training)
            step = (_stream_preparation(np.sort(done) + latency, workload.minibatch_groups,
                                        (1 - deferred) * group_size / rate)
                    + deferred * t_train + workload.weight_sync_s)
        idle = (1 - float(busy.sum()) / (len(engines) * step), 1 - t_train / step)
        engine_s = float(np.dot(busy, [e.devices for e in engines]))
    devices = {}
    for p in pools:
        g, t = generation.get(p.name, 0), training.get(p.name, 0)
        devices[p.name] = (g * p.generation.devices if g else 0, t * p.training.devices if t else 0)
    floor = _shared_core_floor([by_name[name] for name, used in devices.items() if any(used)], workload.samples,
                               engine_s)
    if floor > step:  # the instances' busy time stays; their idle grows with the step
        idle = tuple(1 - (1 - i) * step / floor for i in idle)
        step = floor
    return Plan(mode, dict(generation), dict(training), devices, t_gen, t_train, step,
                workload.samples / step, *idle)


def _shared_core_floor(used: list[HardwarePool], samples: int, engine_s: float) -> float:
    """The shortest step the CPU work allows where a plan runs on one pool of shared cores:
    the engines' busy device-seconds ``engine_s`` and the rest's CPU per sample, over the
    pool's devices (0 elsewhere: across pools the host side's placement is unknown)."""
    if len(used) != 1 or not used[0].cpu_s_per_sample:
        return 0.0
    return (engine_s + samples * used[0].cpu_s_per_sample) / used[0].devices


def first_poll(ready_s: float, poll_s: float) -> float:
    """When a trainer that looks every ``poll_s`` from the step's start (0: at once) first sees
    a batch ready at ``ready_s`` (a look that lands as it becomes ready sees it)."""
    return poll_s * math.ceil(ready_s / poll_s - 1e-9) if poll_s else ready_s


def _deferred_share(pools: dict[str, HardwarePool], training: dict[str, int]) -> float:
    """The deferred share of the training instances, weighted by their throughput."""
    rates = {name: n / pools[name].training.seconds_per_sample for name, n in training.items() if n}
    return sum(r * pools[name].training.deferred_share for name, r in rates.items()) / sum(rates.values())


def _stream_preparation(ready: np.ndarray, minibatch: int, seconds_per_group: float) -> float:
    """When the trainer finishes preparing groups that complete at ``ready`` (sorted), taking
    every complete group in whole mini-batches whenever it is free (a dynamic batch)."""
    taken, free = 0, 0.0
    while taken < len(ready):
        need = min(taken + minibatch, len(ready))
        start = max(free, float(ready[need - 1]))
        available = int(np.searchsorted(ready, start, side="right"))
        take = max((available - taken) // minibatch * minibatch, need - taken)
        free = start + take * seconds_per_group
        taken += take
    return free


def plan(pools: list[HardwarePool], workload: Workload, mode: PlanMode = PlanMode.ON_POLICY,
         max_candidates: int = 20000, policy: FullyAsync | None = None) -> Plan:
    """The assignment with the most predicted samples/s. ``colocated`` has one assignment
    (every device does both stages); the other modes search every split of every pool.
    Raises :class:`PlanError` when no assignment fits the pools."""
    if len({p.name for p in pools}) != len(pools):
        raise PlanError(f"pool names must be unique, got {[p.name for p in pools]}")
    for stage in ("generation", "training"):
        if not any(getattr(p, stage) and p.devices >= getattr(p, stage).devices for p in pools):
            sizes = ", ".join(f"{p.name}: {p.devices} devices, "
                              f"{getattr(p, stage).devices if getattr(p, stage) else 'no'} per instance"
                              for p in pools)
            raise PlanError(f"no pool can hold a {stage} instance ({sizes or 'no pools'}). Give a pool "
                            f"with a {stage} profile and enough devices for one instance, or profile a "
                            f"smaller {stage} instance")
    if mode is PlanMode.COLOCATED:
        return predict(pools, workload, mode,
                       {p.name: p.devices // p.generation.devices for p in pools if p.generation},
                       {p.name: p.devices // p.training.devices for p in pools if p.training})
    splits = [_splits(p) for p in pools]
    count = int(np.prod([len(s) for s in splits]))
    if count > max_candidates:
        raise PlanError(f"{count} splits to search (over {len(pools)} pools), more than max_candidates="
                        f"{max_candidates}: profile larger instances (more devices each) or raise "
                        f"max_candidates")
    best = None
    for choice in product(*splits):
        if sum(g for g, _ in choice) and sum(t for _, t in choice):
            candidate = predict(pools, workload, mode,
                                {p.name: g for p, (g, _) in zip(pools, choice) if g},
                                {p.name: t for p, (_, t) in zip(pools, choice) if t}, policy)
            if best is None or candidate.samples_per_s > best.samples_per_s:
                best = candidate
    if best is None:
        total = ", ".join(f"{p.name}: {p.devices}" for p in pools)
        raise PlanError(f"the pools ({total} devices) cannot hold a generation instance and a training "
                        f"instance at the same time in {mode.value} mode. Add devices, profile smaller "
                        f"instances, or plan mode colocated, which time-shares the devices")
    return best


def _splits(pool: HardwarePool) -> list[tuple[int, int]]:
    """(generation, training) instance counts the pool can hold: each count of generation
    instances, with the rest of the devices given to training."""
    gen_size = pool.generation.devices if pool.generation else pool.devices + 1
    train_size = pool.training.devices if pool.training else pool.devices + 1
    return [(g, (pool.devices - g * gen_size) // train_size) for g in range(pool.devices // gen_size + 1)]
