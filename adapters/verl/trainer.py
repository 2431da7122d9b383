"""verl's v1 trainers with rlweave's stage hooks around every stage of a step.

Each trainer in verl's ``TRAINER_REGISTRY`` (``sync``, ``colocate_async``, ``separate_async``)
is replaced by a subclass whose stage methods run through ``rlweave_run_stage`` and whose
per-step metrics reach ``rlweave_step_end``. The subclass only wraps: verl's own methods do
the work, so a run's results are verl's. Installed only while a plugin implements those hooks.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
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


def _batch_size(args: tuple[Any, ...]) -> int:
    keys = getattr(args[0], "keys", None) if args else None
    return len(keys) if isinstance(keys, list) else 0


class _StageHooks:
    """Mixed in front of a verl trainer class."""

    def _rlweave_stage(self, stage: Stage, worker: str, run: Callable[[], Any], batch_size: int = 0) -> Any:
        context = StageContext(stage, int(getattr(self, "global_steps", 0)), worker, batch_size)
        return get_host().hook.rlweave_run_stage(context=context, run=run)

    def _wrap_call(self, owner: Any, attr: str, stage: Stage, worker: str) -> None:
        original = getattr(owner, attr)
        setattr(owner, attr, lambda *a, **k: self._rlweave_stage(stage, worker, lambda: original(*a, **k)))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Generation is the replay buffer's sample call: it returns when the rollout is done.
        self._wrap_call(self.replay_buffer, "sample", Stage.GENERATE, "rollout")

    def _setup(self) -> None:
        super()._setup()
        self._wrap_call(self.checkpoint_manager, "update_weights", Stage.WEIGHT_SYNC, "rollout")

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> Any:
        result = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}
        get_host().hook.rlweave_step_end(step=int(global_steps), metrics=numeric)
        return result


def _traced_stage(cls: type, name: str, stage: Stage, worker: str) -> Callable[..., Any]:
    original = getattr(cls, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._rlweave_stage(stage, worker, lambda: original(self, *args, **kwargs), _batch_size(args))

    method.__name__ = name
    return method


def traced(cls: type) -> type:
    """``cls`` with every stage method of :data:`STAGE_METHODS` run through the stage hook."""
    namespace: dict[str, Any] = {name: _traced_stage(cls, name, stage, worker)
                                 for name, (stage, worker) in STAGE_METHODS.items()}
    namespace["__module__"] = __name__
    return type(f"Rlweave{cls.__name__}", (_StageHooks, cls), namespace)


def install() -> None:
    """Replace every registered verl trainer by its traced subclass (idempotent)."""
    from verl.trainer.ppo.v1 import trainer_base

    for name, cls in list(trainer_base.TRAINER_REGISTRY.items()):
        if not issubclass(cls, _StageHooks):
            trainer_base.TRAINER_REGISTRY[name] = traced(cls)
