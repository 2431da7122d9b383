"""verl keeps what rlweave's rollout plugins learned with its own checkpoint.

verl's v1 trainer saves the actor, critic, dataloader and (async modes) TransferQueue into
``global_step_N/`` and offers ``trainer.checkpoint_callback_class`` for side effects on save
only, set on the command line; nothing runs after it loads a checkpoint. A plugin that learns
across steps (Heddle's remaining-time predictor, in the request balancer actor) would forget on
every restart. The wrapper writes the rollout side's state beside verl's checkpoint after
``_save_checkpoint`` and gives it back after ``_load_checkpoint``
(:mod:`rlweave.adapters.verl.router`).
"""

from __future__ import annotations

from typing import Any

from rlweave.patches import Revert


def apply() -> Revert:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    save, load = PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint

    def _save_checkpoint(self: Any) -> Any:
        from rlweave.adapters.verl.router import save_rollout_state

        result = save(self)
        save_rollout_state(self)
        return result

    def _load_checkpoint(self: Any) -> Any:
        from rlweave.adapters.verl.router import restore_rollout_state

        result = load(self)
        restore_rollout_state(self)
        return result

    PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint = _save_checkpoint, _load_checkpoint

    def revert() -> None:
        PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint = save, load

    return revert
