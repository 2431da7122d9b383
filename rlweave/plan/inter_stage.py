"""RLHFuse's inter-stage fusion on a known setup: verl's sequential generate-then-inference
stage against the stage_fusion plugin's fused one, both SIMULATED on the shared simulator.

- **verl**: every instance generates the whole batch with nothing beside it
  (:class:`rlweave.sim.Simulator`); verl's replay buffer sees the batch complete at its first
  poll after the last sample (it sleeps ``poll_s`` between looks), and the inference stage runs
  on the whole batch after that (:meth:`InterStageFusion.sequential_s`: its seconds are given).
- **the plugin**: each sample is inferred as it finishes, a dynamic batch at a time, and the
  tail migrates off the instances on the trainer's devices. The plugin's own decision code
  chooses each step's migration: :func:`~rlweave.plugins.stage_fusion.migration.plan_migration`
  on the lengths of the step before, as the plugin plans at run time, and
  :func:`~rlweave.plugins.stage_fusion.migration.simulate_stage` plays that plan on the step's
  own lengths (on :class:`rlweave.sim.stepped.SteppedSimulator`), averaged over dispatch
  orders (the balancer's placement is not known ahead). Without migration: the same stage
  with no plan (``streamed_s``).

What neither side has: the trainer's own time between polls (rlweave polls every 50 ms), and
the host side's CPU that shares the cores with the engines.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlweave.plugins.stage_fusion.migration import ORDERS, InferenceCost, plan_migration, simulate_stage
from rlweave.sim import EngineModel, Request, Simulator
from rlweave.types import FusionStep, RolloutInstance


@dataclass(frozen=True)
class InterStageSetup:
    """The rollout instances (which share the trainer's devices, their slots), one engine's
    cost, the trainer's inference (per sample on free devices, its slowdown beside an engine,
    its dynamic batch) and the mean prompt tokens a migrated sample re-prefills."""

    engine: EngineModel
    instances: tuple[RolloutInstance, ...]
    inference: InferenceCost
    prompt_len: int = 0


@dataclass(frozen=True)
class InterStageFusion:
    """Per predicted step (SIMULATED, each the mean over dispatch orders): verl's generation of
    the whole batch, the plugin's fused stage with its plan, the stage streamed per sample with
    no migration, and the threshold the plugin chose (0: it did not migrate)."""

    generation_s: tuple[float, ...]
    fused_s: tuple[float, ...]
    streamed_s: tuple[float, ...]
    thresholds: tuple[int, ...]

    def sequential_s(self, inference_s: float, poll_s: float) -> float:
        """verl's stage, mean over the steps: the generation, up to the replay buffer's next
        poll (one that lands as the last sample ends sees it), then ``inference_s`` for the whole
        batch."""
        return statistics.mean(poll_s * math.ceil(g / poll_s - 1e-9) for g in self.generation_s) + inference_s

    @property
    def fused_mean_s(self) -> float:
        return statistics.mean(self.fused_s)

    @property
    def streamed_mean_s(self) -> float:
        return statistics.mean(self.streamed_s)


def generation_s(lengths: Sequence[int], instances: Sequence[RolloutInstance], engine: EngineModel) -> float:
    """The whole batch generated on ``instances`` in turn, nothing beside them: when its last
    sample ends (prompts prefilled, as :func:`simulate_stage` has them)."""
    sim = Simulator([engine] * len(instances), slots=[max(1, i.slots) for i in instances])
    sim.submit([Request(s, 0.0, int(n)) for s, n in enumerate(lengths)])
    return float(sim.run().finish_array().max())


def inter_stage_fusion(steps: Sequence[Sequence[int]], setup: InterStageSetup, seed: int = 0) -> InterStageFusion:
    """Steps ``1..`` of ``steps`` (each a step's output lengths), each planned by the plugin on
    the lengths of the step before it (``steps[0]`` plans only), see the module docstring."""
    rng = np.random.default_rng(seed)
    gen, fused, streamed, thresholds = [], [], [], []
    for k, (before, lengths) in enumerate(zip(steps, steps[1:]), start=1):
        step = FusionStep(k, len(lengths), setup.instances, setup.prompt_len, setup.inference.per_sample_s,
                          inference_batch=setup.inference.batch)
        plan = plan_migration(step, before, setup.engine, setup.inference, seed=k)
        orders = [rng.permutation(np.asarray(lengths)) for _ in range(ORDERS)]

        def stage(o: np.ndarray, threshold: int = 0, destinations: Sequence[str] = (), waits: bool = False) -> float:
            return simulate_stage(o, setup.instances, setup.engine, setup.inference, setup.prompt_len, threshold,
                                  destinations, waits)

        gen.append(statistics.mean(generation_s(o, setup.instances, setup.engine) for o in orders))
        streamed.append(statistics.mean(stage(o) for o in orders))
        fused.append(streamed[-1] if plan is None else statistics.mean(
            stage(o, plan.threshold, plan.destinations, plan.inference_waits) for o in orders))
        thresholds.append(plan.threshold if plan else 0)
    return InterStageFusion(tuple(gen), tuple(fused), tuple(streamed), tuple(thresholds))
