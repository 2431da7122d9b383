"""verl's config validation also checks the enabled rlweave plugins' verl requirements.

verl validates the composed config in ``verl.utils.config.validate_config``, which ``main_ppo``
calls in its driver before Ray starts (and the v0 and one-step-off trainers call where they
build their workers). rlweave checks its plugins' requirements on verl's command line at
``import verl``, but only a command line that carries ``+rlweave.*`` is the job's for sure: a
plugin enabled through ``RLWEAVE__*`` variables, or a config that a script composed, would go
unchecked, and a plugin verl cannot run would be a silent no-op. The wrapper runs
:func:`rlweave.adapters.verl.check_assembled_config` on the config, then verl's own validation
(rlweave's refusal first: one message, whatever else the config lacks).

The wrapper is in place before ``main_ppo`` binds ``validate_config``: verl loads rlweave when
the ``verl`` package is imported, before the trainer module's body runs.
"""

from __future__ import annotations

from typing import Any

from rlweave.patches import Revert


def apply() -> Revert:
    import verl.utils.config as config_module

    original = config_module.validate_config

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        from rlweave.adapters.verl import check_assembled_config

        check_assembled_config(config)
        return original(config, *args, **kwargs)

    config_module.validate_config = validate_config

    def revert() -> None:
        config_module.validate_config = original

    return revert
