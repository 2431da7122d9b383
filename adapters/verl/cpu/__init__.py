"""Run verl's own trainer on a CPU-only machine: platform, engines, patches.

Everything goes through verl's extension points (``PlatformRegistry``, ``EngineRegistry``)
except three small patches in :mod:`rlweave.patches` (group ``verl-cpu``), each with the
upstream PR that would remove it. Selected by ``VERL_PLATFORM=cpu``; the config a CPU run
needs besides is in :data:`CPU_OVERRIDES`.
"""

from __future__ import annotations

from rlweave.patches import VERL_CPU, apply_patches

# Hydra overrides every verl run on CPU needs, and why:
CPU_OVERRIDES = (
    "trainer.device=cpu",
    # FSDP1 hands FSDP an integer device id, which means an accelerator; FSDP2 takes the mesh.
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "critic.strategy=fsdp2",
    # verl defaults to flash_attention_2, which needs CUDA.
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+critic.model.override_config.attn_implementation=sdpa",
    # vLLM's CPU platform has no sleep mode.
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    # Ray's logical GPUs stand in for device slots; bundles ask for CPUs logically.
    "+ray_kwargs.ray_init.include_dashboard=False",
)

_enabled = False


def enable_cpu_support(verl_version: str) -> None:
    """Register the CPU platform and the FSDP engines for device ``cpu``; apply the patches."""
    global _enabled
    if _enabled:
        return
    # The platform first: importing verl's engines already asks for the current platform.
    from rlweave.adapters.verl.cpu import platform  # noqa: F401  (registers "cpu")
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead),
                               ("value_model", FSDPEngineWithValueHead)):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)
    apply_patches("verl", verl_version, VERL_CPU)
    _enabled = True
