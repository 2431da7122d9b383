"""verl adapter, loaded by verl's ``verl.plugins`` entry point on ``import verl`` in every verl
process (driver, TaskRunner, workers, agent-loop workers).

In the driver it reads ``+rlweave.*`` Hydra overrides from the command line, validates them
before anything starts, and exports them as ``RLWEAVE__*`` variables so every Ray worker
started after it sees the same configuration. With no plugin enabled it does nothing.

With ``VERL_PLATFORM=cpu`` (verl's own platform switch) it also registers rlweave's CPU
platform and FSDP engines for the ``cpu`` device, and applies the CPU-support patches, so that
verl's unmodified trainer runs on a CPU-only machine (see ``rlweave.adapters.verl.cpu``).

verl swallows exceptions raised while loading plugins (logged at DEBUG), so errors leave as
``SystemExit`` with rlweave's message: a bad flag stops the run instead of silently turning
rlweave off.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from omegaconf import OmegaConf

from rlweave.adapters import refusals_exit
from rlweave.config import settings_from_overrides
from rlweave.frameworks import (
    require_supported,
    verl_cpu_platform_selected,
)
from rlweave.host import Host, activate, get_host
from rlweave.patches import (
    EXPERT_PLACEMENT,
    PLUGINS,
    REQUEST_PRIORITY,
    RLWEAVE_LAYERS,
    ROLLOUT_STATE,
    apply_patches,
)
from rlweave.adapters.verl_needs import verl_requirements
from rlweave.requirements import check_requirements, gathered
from rlweave.types import FrameworkInfo, SettingRequirement


def _load() -> None:
    if verl_cpu_platform_selected():
        from rlweave.adapters.verl.cpu import enable_cpu_support

        version = require_supported("verl")
        try:
            enable_cpu_support(version)
        except Exception as error:  # verl would swallow it and fail later, far from the cause
            raise SystemExit(f"rlweave: could not enable verl's CPU platform (VERL_PLATFORM=cpu): "
                             f"{type(error).__name__}: {error}") from error
        from rlweave.adapters.verl.cpu.cores import pin_ray_worker

        pin_ray_worker()  # RLWEAVE_CPU_PIN_DEVICES=1: a logical GPU is a core
    host = activate(settings_from_overrides(sys.argv[1:], source="verl command line"))
    if not host.active:
        return
    requirements = _verl_requirements(host)
    _check_command_line(requirements, sys.argv[1:])
    version = require_supported("verl")
    apply_patches("verl", version, PLUGINS)
    places_experts = host.implements("rlweave_expert_step_placement") or host.implements(
        "rlweave_expert_microbatch_placement")
    if places_experts:
        apply_patches("verl", version, EXPERT_PLACEMENT)
    if places_experts or host.implements("rlweave_tp_linear_impl"):  # ReLibra's/FLUX's layers in verl's Megatron
        apply_patches("verl", version, RLWEAVE_LAYERS)
    if host.implements("rlweave_request_priority"):  # Heddle: SGLang gets the turn's priority too
        apply_patches("verl", version, REQUEST_PRIORITY)
    if host.implements("rlweave_rollout_state"):  # Heddle: its predictor outlives a restart
        apply_patches("verl", version, ROLLOUT_STATE)
    from rlweave.adapters.verl import agent_loop  # noqa: F401  (registers with verl)

    modes = _register_trainer_modes(requirements)  # before the seam, so that the modes have it too
    resilient = host.implements("rlweave_resilience_settings")  # MegaScale: heartbeats, recovery, checkpoints
    if modes or resilient or host.implements("rlweave_run_stage") or host.implements("rlweave_step_end"):
        from rlweave.adapters.verl import trainer

        trainer.install()  # the one stage seam, which tracing and resilience attach to
    if resilient:
        from rlweave.adapters.verl import resilience

        resilience.start_heartbeat()
        resilience.install()

    host.hook.rlweave_framework_loaded(framework=FrameworkInfo("verl", version, _process_role()))


TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
# rlweave's verl trainer modes, by the name verl selects them with, and the module that registers
# each one with verl's ``register_trainer``.
TRAINER_MODES = {"rlweave_stream": "rlweave.adapters.verl.stream_trainer"}


def _register_trainer_modes(requirements: list[SettingRequirement]) -> list[str]:
    """Import the modules of the rlweave trainer modes that an enabled plugin needs; their names."""
    modes = [mode for r in requirements if r.key == TRAINER_MODE_KEY for mode in r.allowed if mode in TRAINER_MODES]
    for mode in modes:
        importlib.import_module(TRAINER_MODES[mode])
    return modes


def _verl_requirements(host: Host) -> list[SettingRequirement]:
    """The verl settings the enabled plugins need, from their ``rlweave_needs`` answers."""
    return verl_requirements(gathered(host.hook.rlweave_needs()))


def _check_command_line(requirements: list[SettingRequirement], argv: list[str]) -> None:
    """The plugins' verl requirements, against the command line that configured rlweave (in
    other processes, such as Ray workers, the driver has checked them already)."""
    overrides = [a.lstrip("+") for a in argv]
    if not any(a.startswith("rlweave.") for a in overrides):
        return
    values = dict(a.split("=", 1) for a in overrides if "=" in a)
    check_requirements(requirements, values, "verl command line")


def check_assembled_config(config: Any) -> None:
    """The enabled plugins' verl requirements against verl's assembled config, called by the
    ``verl_config_check`` patch where verl validates it (``main_ppo``'s driver, before Ray
    starts). :func:`_check_command_line` checks earlier but only a command line that carries
    ``+rlweave.*``: a plugin enabled through ``RLWEAVE__*`` variables, or a config a script
    composed, is checked here, or it would run as a silent no-op. rlweave's own flags are read
    from the host (command line or environment), verl's from the config; a setting the config
    leaves unset counts as verl's default, as on the command line."""
    host = get_host()
    if not host.active:
        return
    requirements = _verl_requirements(host)
    enabled = set(host.config.enabled())
    values = {}
    for key in {r.key for r in requirements}:
        parts = key.split(".")
        if parts[0] == "rlweave":
            values[key] = "true" if parts[1] in enabled else "false"
        elif (value := OmegaConf.select(config, key, default=None)) is not None:
            values[key] = str(value).lower() if isinstance(value, bool) else str(value)
    with refusals_exit():
        check_requirements(requirements, values, "the job's config")


def _process_role() -> str:
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            return f"ray-{ctx.get_actor_name() or ctx.get_worker_id()[:8]}"
    except Exception:  # ray absent or not in a Ray process: the driver
        pass
    return "driver"


with refusals_exit():
    _load()
