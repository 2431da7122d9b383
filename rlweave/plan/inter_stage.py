"""RLHFuse's inter-stage fusion on a known setup: verl's sequential generate-then-inference
stage against the stage_fusion plugin's fused one, both SIMULATED on the shared simulator.

- **verl** (:func:`sequential_generation`): every instance generates the whole batch with
  nothing beside it (:class:`rlweave.sim.Simulator`), on verl's own engine (its replicas
  generate with the trainer idle: their cost need not be the plugin's); verl's replay buffer
  sees the batch complete at its first poll after the last sample (it sleeps ``poll_s`` between
  looks), and the inference stage runs on the whole batch after that
  (:meth:`SequentialStage.stage_s`: its seconds are given).
- **the plugin**: each sample is inferred as it finishes, a dynamic batch at a time, and the
  tail migrates off the instances on the trainer's devices. The plugin's own decision code
  chooses each step's migration: :func:`~rlweave.plugins.stage_fusion.migration.plan_migration`
  on the lengths of the step before, as the plugin plans at run time, and
  :func:`~rlweave.plugins.stage_fusion.migration.simulate_stage` plays that plan on the step's
  own lengths (on :class:`rlweave.sim.stepped.SteppedSimulator`), averaged over dispatch
  orders (the balancer's placement is not known ahead; both sides see the same orders,
  :func:`dispatch_orders`). Without migration: the same stage with no plan (``streamed_s``).

What neither side has: the trainer's own time between polls (rlweave polls every 50 ms), and
the host side's CPU that shares the cores with the engines.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlweave.plugins.stage_fusion.migration import ORDERS, InferenceCost, plan_migration, simulate_stage
from rlweave.plugins.stream_generation.planner import first_poll
from rlweave.sim import EngineModel, Request, Simulator
from rlweave.types import FusionStep, RolloutInstance


@dataclass(frozen=True)
class InterStageSetup:
    """The rollout instances (which share the trainer's devices, their slots), the plugin's
    engine cost, the trainer's inference (per sample on free devices, its slowdown beside an engine,
    its dynamic batch) and the mean prompt tokens a migrated sample re-prefills."""

    engine: EngineModel
    instances: tuple[RolloutInstance, ...]
    inference: InferenceCost
    prompt_len: int = 0


@dataclass(frozen=True)
class InterStageFusion:
    """Per predicted step (SIMULATED, each the mean over dispatch orders): the plugin's fused
    stage with its plan, the stage streamed per sample with no migration, and the threshold the
    plugin chose (0: it did not migrate)."""

    fused_s: tuple[float, ...]
    streamed_s: tuple[float, ...]
    thresholds: tuple[int, ...]

    @property
    def fused_mean_s(self) -> float:
        return statistics.mean(self.fused_s)

    @property
    def streamed_mean_s(self) -> float:
        return statistics.mean(self.streamed_s)


@dataclass(frozen=True)
class SequentialStage:
    """verl's side, per predicted step (SIMULATED, the mean over dispatch orders): the whole
    batch's generation on verl's engine."""

    generation_s: tuple[float, ...]

    def stage_s(self, inference_s: float, poll_s: float) -> float:
        """verl's stage, mean over the steps: the generation, up to the replay buffer's next
        poll (one that lands as the last sample ends sees it), then ``inference_s`` for the whole
        batch."""
        return statistics.mean(first_poll(g, poll_s) for g in self.generation_s) + inference_s


def dispatch_orders(steps: Sequence[Sequence[int]], seed: int = 0) -> list[list[np.ndarray]]:
    """For steps ``1..`` of ``steps``, :data:`ORDERS` orders of its lengths to dispatch in: the
    same ``seed`` gives both sides the same ones."""
    rng = np.random.default_rng(seed)
    return [[rng.permutation(np.asarray(lengths)) for _ in range(ORDERS)] for lengths in steps[1:]]


def generation_s(lengths: Sequence[int], instances: Sequence[RolloutInstance], engine: EngineModel) -> float:
    """The whole batch generated on ``instances`` in turn, nothing beside them: when its last
    sample ends (prompts prefilled, as :func:`simulate_stage` has them)."""
    sim = Simulator([engine] * len(instances), slots=[max(1, i.slots) for i in instances])
    sim.submit([Request(s, 0.0, int(n)) for s, n in enumerate(lengths)])
    return float(sim.run().finish_array().max())


def sequential_generation(steps: Sequence[Sequence[int]], instances: Sequence[RolloutInstance],
                          engine: EngineModel, seed: int = 0) -> SequentialStage:
    """verl's generation of steps ``1..`` of ``steps`` on ``instances`` of ``engine``, in the
    orders :func:`inter_stage_fusion` plays with the same ``seed``."""
    return SequentialStage(tuple(statistics.mean(generation_s(o, instances, engine) for o in orders)
                                 for orders in dispatch_orders(steps, seed)))


def inter_stage_fusion(steps: Sequence[Sequence[int]], setup: InterStageSetup, seed: int = 0) -> InterStageFusion:
    """Steps ``1..`` of ``steps`` (each a step's output lengths), each planned by the plugin on
    the lengths of the step before it (``steps[0]`` plans only), see the module docstring."""
    fused, streamed, thresholds = [], [], []
    for k, (before, lengths, orders) in enumerate(zip(steps, steps[1:], dispatch_orders(steps, seed)), start=1):
        step = FusionStep(k, len(lengths), setup.instances, setup.prompt_len, setup.inference.per_sample_s,
                          inference_batch=setup.inference.batch)
        plan = plan_migration(step, before, setup.engine, setup.inference, seed=k)

        def stage(o: np.ndarray, threshold: int = 0, destinations: Sequence[str] = (), waits: bool = False) -> float:
            return simulate_stage(o, setup.instances, setup.engine, setup.inference, setup.prompt_len, threshold,
                                  destinations, waits)

        streamed.append(statistics.mean(stage(o) for o in orders))
        fused.append(streamed[-1] if plan is None else statistics.mean(
            stage(o, plan.threshold, plan.destinations, plan.inference_waits) for o in orders))
        thresholds.append(plan.threshold if plan else 0)
    return InterStageFusion(tuple(fused), tuple(streamed), tuple(thresholds))
