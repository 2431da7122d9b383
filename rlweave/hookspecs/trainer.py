"""The RL trainer loop (verl's PPO/GRPO trainers): steps and the stages inside a step.

Called by ``rlweave.adapters.verl``. Stage names are those of :class:`rlweave.types.Stage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlweave.hookspecs import hookspec
from rlweave.types import DynamicBatchRequest, FusionStep, MigrationPlan, StageContext, StreamSettings


@hookspec(firstresult=True)
def rlweave_run_stage(context: StageContext, run: Callable[[], Any]) -> Any:
    """Run one trainer stage (generate, reward, old_log_prob, ref, values, adv, update_*).

    Called by the verl adapter where verl runs the stage; ``run()`` is verl's own stage. The
    host's trylast default calls ``run()``; plugins wrap it (``wrapper=True``) to trace it, or
    return a result of their own to replace it (stage fusion). Returns the stage's result.
    """


@hookspec
def rlweave_step_end(step: int, metrics: dict[str, float]) -> None:
    """A training step finished; ``metrics`` are the trainer's own (verl's metric dict)."""


@hookspec(firstresult=True)
def rlweave_stream_settings() -> StreamSettings | None:
    """How the ``rlweave_stream`` trainer streams: on-policy or async, the staleness bound and
    the poll interval.

    Called once by the verl adapter's stream trainer when verl builds it. ``None`` from every
    plugin: no enabled plugin streams, and the trainer refuses to start.
    """


@hookspec(firstresult=True)
def rlweave_dynamic_batch(request: DynamicBatchRequest) -> int | None:
    """How many finished groups a streaming trainer takes now: a whole number of
    ``request.minibatch`` groups, at most ``request.most`` (what its step still needs); 0
    waits for more. The due groups are taken first.

    Called by the ``rlweave_stream`` trainer at every poll while it waits for a dynamic batch.
    ``None``: every finished group, up to ``most``.
    """


@hookspec(firstresult=True)
def rlweave_migration_plan(step: FusionStep) -> MigrationPlan | None:
    """Whether, when and where the step's generation tail migrates so that the devices it
    leaves run the inference stage (RLHFuse's inter-stage fusion).

    Called by the ``rlweave_stream`` trainer when a step starts, with its rollout instances;
    the trainer then applies the plan through verl's partial rollout (the sources leave the
    request balancer, their requests are aborted and resubmitted with their tokens). ``None``:
    no migration this step.
    """
