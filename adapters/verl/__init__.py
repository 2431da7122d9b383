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

import sys

from rlweave.config import ConfigError, RlweaveConfig, settings_from_overrides
from rlweave.frameworks import (
    UnsupportedFrameworkError,
    require_supported,
    verl_cpu_platform_selected,
)
from rlweave.host import activate
from rlweave.patches import EXPERT_PLACEMENT, PLUGINS, REQUEST_PRIORITY, PatchVersionError, apply_patches
from rlweave.types import FrameworkInfo


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
    _check_command_line(host.config, sys.argv[1:])
    version = require_supported("verl")
    apply_patches("verl", version, PLUGINS)
    if host.implements("rlweave_expert_placement"):  # ReLibra: plan where verl replays routing
        apply_patches("verl", version, EXPERT_PLACEMENT)
    if host.implements("rlweave_request_priority"):  # Heddle: SGLang gets the turn's priority too
        apply_patches("verl", version, REQUEST_PRIORITY)
    from rlweave.adapters.verl import agent_loop  # noqa: F401  (registers with verl)

    if host.config.stream_generation.enable:  # before install(), so that the mode is traced too
        from rlweave.adapters.verl import stream_trainer  # noqa: F401  (registers the trainer mode)

    if host.implements("rlweave_run_stage") or host.implements("rlweave_step_end"):
        from rlweave.adapters.verl.trainer import install

        install()

    host.hook.rlweave_framework_loaded(framework=FrameworkInfo("verl", version, _process_role()))


PRIORITY_POLICY = "actor_rollout_ref.rollout.scheduling_policy=priority"
# Rollout engines that schedule by request priority once verl passes it on (vLLM natively,
# SGLang through the verl_sglang_priority patch).
PRIORITY_ENGINES = ("vllm", "sglang")
STREAM_MODE = "trainer.v1.trainer_mode=rlweave_stream"
# Advantage estimators whose statistics stay within a GRPO group, so a streamed mini-batch of
# complete groups gets the advantages the whole batch would give it. GAE, REINFORCE++ and ReMax
# whiten over the whole batch.
STREAMABLE_ESTIMATORS = ("grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg")


def _check_command_line(config: RlweaveConfig, argv: list[str]) -> None:
    """rlweave flags that only work with a verl setting on the same command line."""
    overrides = [a.lstrip("+") for a in argv]
    if not any(a.startswith("rlweave.") for a in overrides):
        return  # not the command line that configured rlweave (a Ray worker, a child process)
    if config.agentic_rollout.enable:
        engine = next((a.split("=", 1)[1] for a in overrides if a.startswith("actor_rollout_ref.rollout.name=")),
                      None)
        if engine is not None and engine not in PRIORITY_ENGINES:
            raise ConfigError(
                f"rlweave.agentic_rollout gives each turn an engine priority, which verl passes only to "
                f"vLLM and (with rlweave's patch) SGLang, not to rollout.name={engine}; use "
                f"actor_rollout_ref.rollout.name=vllm or sglang")
        if PRIORITY_POLICY not in overrides:
            raise ConfigError(
                "rlweave.agentic_rollout gives each turn an engine priority, which vLLM and SGLang ignore "
                f"under verl's default FCFS scheduling policy; add {PRIORITY_POLICY} (for SGLang rlweave "
                "then turns on SGLang's priority scheduling, lower values first)")
    if config.stream_generation.enable:
        if STREAM_MODE not in overrides:
            raise ConfigError(f"rlweave.stream_generation runs as verl's trainer mode 'rlweave_stream'; add {STREAM_MODE}")
        estimator = next((a.split("=", 1)[1] for a in overrides if a.startswith("algorithm.adv_estimator=")), "gae")
        if estimator not in STREAMABLE_ESTIMATORS:
            raise ConfigError(
                f"rlweave.stream_generation trains on mini-batches of complete GRPO groups as they finish, "
                f"but algorithm.adv_estimator={estimator} normalises over the whole batch; use one of "
                f"{', '.join(STREAMABLE_ESTIMATORS)}")


def _process_role() -> str:
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            return f"ray-{ctx.get_actor_name() or ctx.get_worker_id()[:8]}"
    except Exception:  # ray absent or not in a Ray process: the driver
        pass
    return "driver"


try:
    _load()
except (ConfigError, UnsupportedFrameworkError, PatchVersionError) as error:
    raise SystemExit(f"rlweave: {error}") from None
