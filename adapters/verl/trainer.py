"""verl's v1 trainers with rlweave's one stage seam.

Each trainer in verl's ``TRAINER_REGISTRY`` (``sync``, ``colocate_async``, ``separate_async``, and
rlweave's own modes, registered before) is replaced by a subclass in which every stage of a step
runs through one method, :meth:`StageSeam._rlweave_stage`: generation (the replay buffer's sample
call, which returns when the rollout is done), the stage methods of :data:`STAGE_METHODS` and the
weight sync. What runs around a stage is a chain of *arounds* that features attach to the trainer:
tracing's (the ``rlweave_run_stage`` hook) first and outermost, so that a trace shows all a stage
took, recoveries included; resilience's (:mod:`.resilient_trainer`: pending recoveries, the
controller's section, host snapshots) inside it. With none attached a stage is verl's own call;
the seam only wraps, so a run's results are verl's. Per-step metrics reach ``rlweave_step_end``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from functools import partial
from typing import Any

from rlweave.host import get_host
from rlweave.types import Stage, StageContext

# verl method -> (stage, the worker group that does the work)
STAGE_METHODS: dict[str, tuple[Stage, str]] = {
    "_compute_reward_colocate": (Stage.REWARD, "reward"),
    "_compute_old_log_prob": (Stage.OLD_LOG_PROB, "actor"),
    "_compute_ref_log_prob": (Stage.REF, "ref"),
    "_compute_values": (Stage.VALUES, "critic"),
    "_compute_advantage": (Stage.ADVANTAGE, "trainer"),
    "_update_critic": (Stage.UPDATE_CRITIC, "critic"),
    "_update_actor": (Stage.UPDATE_ACTOR, "actor"),
}

# What a feature runs around a stage: (where, the stage's batch or None, the stage) -> its result.
Around = Callable[[StageContext, Any, Callable[[], Any]], Any]


def _traced(context: StageContext, batch: Any, run: Callable[[], Any]) -> Any:
    return get_host().hook.rlweave_run_stage(context=context, run=run)


def _batch_size(batch: Any) -> int:
    keys = getattr(batch, "keys", None)
    return len(keys) if isinstance(keys, list) else 0


class StageSeam:
    """Mixed in front of a verl trainer class: the one place a step's stages pass through."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._rlweave_arounds: list[Around] = []
        super().__init__(*args, **kwargs)
        if get_host().implements("rlweave_run_stage"):
            self.rlweave_attach(_traced)
        self._rlweave_wrap(self.replay_buffer, "sample", Stage.GENERATE, "rollout")

    def _setup(self) -> None:
        super()._setup()
        self._rlweave_wrap(self.checkpoint_manager, "update_weights", Stage.WEIGHT_SYNC, "rollout")

    def rlweave_attach(self, around: Around) -> None:
        """Run ``around`` around every stage, inside the arounds attached before it."""
        self._rlweave_arounds.append(around)

    def _rlweave_stage(self, stage: Stage, worker: str, run: Callable[[], Any], batch: Any = None) -> Any:
        if not self._rlweave_arounds:
            return run()
        context = StageContext(stage, int(getattr(self, "global_steps", 0)), worker, _batch_size(batch))
        for around in reversed(self._rlweave_arounds):
            run = partial(around, context, batch, run)
        return run()

    def _rlweave_wrap(self, owner: Any, attr: str, stage: Stage, worker: str) -> None:
        """``owner.attr`` as a stage; verl's own call stays reachable as ``__wrapped__`` (a
        recovery pushes weights from inside a stage, and must not pass through the seam again)."""
        original = getattr(owner, attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._rlweave_stage(stage, worker, lambda: original(*args, **kwargs))

        call.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, attr, call)

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> Any:
        result = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}
        get_host().hook.rlweave_step_end(step=int(global_steps), metrics=numeric)
        return result


def _stage_method(cls: type, name: str, stage: Stage, worker: str) -> Callable[..., Any]:
    original = getattr(cls, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = args[0] if args else None
        return self._rlweave_stage(stage, worker, lambda: original(self, *args, **kwargs), batch)

    method.__name__ = name
    return method


def with_seam(cls: type) -> type:
    """``cls`` with every stage running through :class:`StageSeam` (``cls`` itself if it has it)."""
    if issubclass(cls, StageSeam):
        return cls
    namespace: dict[str, Any] = {name: _stage_method(cls, name, stage, worker)
                                 for name, (stage, worker) in STAGE_METHODS.items()}
    namespace["__module__"] = __name__
    return type(f"Rlweave{cls.__name__}", (StageSeam, cls), namespace)


def install() -> None:
    """Give every registered verl trainer the seam (idempotent)."""
    from verl.trainer.ppo.v1 import trainer_base

    for name, cls in list(trainer_base.TRAINER_REGISTRY.items()):
        trainer_base.TRAINER_REGISTRY[name] = with_seam(cls)
