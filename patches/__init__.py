"""rlweave's monkey-patches: few, small, version-guarded and reversible.

Each patch lives in its own package with an ``upstream.md`` beside it: the text of the upstream
pull request that would make the patch unnecessary. :func:`apply_patches` applies a framework's
patches only to versions they were written for; a patch an enabled plugin needs that does not
fit the installed version is an error, never a silent skip.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

Revert = Callable[[], None]


# When a patch group is applied:
PLUGINS = "plugins"  # some rlweave plugin is enabled in this process
VERL_CPU = "verl-cpu"  # verl's CPU platform is selected (VERL_PLATFORM=cpu)
EXPERT_PLACEMENT = "expert-placement"  # a plugin decides MoE expert placement (replay_balance)
REQUEST_PRIORITY = "request-priority"  # a plugin decides engine request priorities (agentic_rollout)
ROLLOUT_STATE = "rollout-state"  # a rollout plugin keeps learned state with checkpoints (agentic_rollout)
RLWEAVE_LAYERS = "rlweave-layers"  # a plugin replaces Megatron's layers (replay_balance, overlap)


@dataclass(frozen=True)
class Patch:
    name: str  # the package under rlweave.patches
    framework: str  # a key of rlweave.frameworks.FRAMEWORKS
    versions: SpecifierSet  # versions the patch was written and tested for
    target: str  # the dotted name it replaces
    why: str  # one line for `rlweave doctor`
    groups: tuple[str, ...] = (PLUGINS,)

    def applies_to(self, version: str) -> bool:
        return Version(Version(version).base_version) in self.versions

    @property
    def upstream_note(self) -> Path:
        return Path(__file__).parent / self.name / "upstream.md"

    def apply(self) -> Revert:
        return importlib.import_module(f"{__name__}.{self.name}").apply()


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="vllm_scheduler_cls",
        framework="vllm",
        versions=SpecifierSet(">=0.24.0,<0.35"),
        target="vllm.config.scheduler.SchedulerConfig.get_scheduler_cls",
        why="EngineCore builds rlweave's scheduler subclass when a plugin uses engine hooks and no scheduler_cls is set",
    ),
    Patch(
        name="verl_gloo_backend",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.utils.distributed.initialize_global_process_group_ray",
        why="on CPU verl asks torch for backend 'cpu:gloo,cpu:gloo', which torch rejects",
        groups=(VERL_CPU,),
    ),
    Patch(
        name="verl_cpu_unpinned_offload",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy",
        why="verl pins the reference model's offloaded memory, which needs an accelerator",
        groups=(VERL_CPU,),
    ),
    Patch(
        name="verl_cpu_sharded_snapshot",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu",
        why="on CPU verl's saved copy of the actor's weights aliases the live ones (.cpu() does not copy)",
        groups=(VERL_CPU,),
    ),
    Patch(
        name="verl_value_model_attention",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.utils.model.load_valuehead_model",
        why="verl loads the critic with FlashAttention-2 hard-coded, which needs CUDA",
        groups=(VERL_CPU,),
    ),
    Patch(
        name="verl_mixtral_weight_names",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.workers.engine.fsdp.transformer_impl.unfuse_moe_params",
        why="verl syncs Mixtral experts under names vLLM's Mixtral does not load, then hangs",
        groups=(VERL_CPU, PLUGINS),
    ),
    Patch(
        name="verl_config_check",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.utils.config.validate_config",
        why="verl has no hook for a plugin to validate the composed config (plugins enabled through "
            "RLWEAVE__* variables or a scripted config are checked there)",
    ),
    Patch(
        name="verl_router_default",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.workers.rollout.router.get_router_handle",
        why="verl has no flag-free way for a plugin to supply the request load balancer (Heddle placement)",
    ),
    Patch(
        name="verl_rollout_state",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.trainer.ppo.v1.trainer_base.PPOTrainer._save_checkpoint",
        why="verl's trainer has no hook after loading a checkpoint, and its save callback must be set "
            "on the command line (Heddle's predictor history is kept with the checkpoint)",
        groups=(ROLLOUT_STATE,),
    ),
    Patch(
        name="verl_sglang_priority",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.workers.rollout.sglang_rollout.async_sglang_server.SGLangHttpServer.generate",
        why="verl forwards request priority to vLLM only, and never turns on SGLang's priority scheduling",
        groups=(REQUEST_PRIORITY,),
    ),
    Patch(
        name="verl_router_replay_hooks",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.workers.engine.megatron.transformer_impl.set_router_replay_data",
        why="verl has no callback where it hands a step's and a micro-batch's replayed routing to Megatron "
            "(ReLibra plans there)",
        groups=(EXPERT_PLACEMENT,),
    ),
    Patch(
        name="verl_megatron_layer_spec",
        framework="verl",
        versions=SpecifierSet(">=0.9.0,<0.10"),
        target="verl.utils.megatron_utils.make_megatron_module",
        why="verl's Megatron engine builds its model from the bridge's layer spec and takes no other "
            "(rlweave's ReLibra MoE layer and overlapped linears go in there), and lets no plugin keep "
            "parameters out of its DDP and optimizer (ReLibra's replica slots)",
        groups=(RLWEAVE_LAYERS,),
    ),
    Patch(
        name="vllm_cpu_keep_weights",
        framework="vllm",
        versions=SpecifierSet(">=0.24.0,<0.35"),  # same target shape 0.24-0.34; engine-run on 0.32
        target="vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm",
        why="vllm-cpu drops linear weights after packing them, so RL weight updates fail",
        groups=(VERL_CPU,),
    ),
    Patch(
        name="vllm_pause_generation_compat",
        framework="vllm",
        versions=SpecifierSet(">=0.24.0,<0.35"),
        target="vllm.v1.engine.async_llm.AsyncLLM.pause_generation",
        why="verl 0.9 passes wait_for_inflight_requests, which later vLLMs (0.32-0.34) removed; "
            "wraps only a pause_generation without it, on any platform",
        groups=(VERL_CPU, PLUGINS),
    ),
    Patch(
        name="vllm_cpu_idle_spin",
        framework="vllm",
        versions=SpecifierSet(">=0.24.0,<0.35"),  # same target shape 0.24-0.34; engine-run on 0.32
        target="vllm.distributed.device_communicators.shm_broadcast.SpinCondition.__init__",
        why="vLLM's workers spin for 1 s after each engine step, which on CPU takes the cores the trainer needs",
        groups=(VERL_CPU,),
    ),
)


class PatchVersionError(RuntimeError):
    pass


_applied: dict[str, Revert] = {}


def patches_for(framework: str, group: str) -> list[Patch]:
    return [p for p in PATCHES if p.framework == framework and group in p.groups]


def apply_patches(framework: str, version: str, group: str = PLUGINS) -> list[str]:
    """Apply ``framework``'s patches of ``group`` once per process; returns those applied now."""
    applied = []
    for patch in patches_for(framework, group):
        if patch.name in _applied:
            continue
        if not patch.applies_to(version):
            raise PatchVersionError(
                f"rlweave patch '{patch.name}' (on {patch.target}) was written for {framework} "
                f"{patch.versions}, not {version}; see {patch.upstream_note} and install a "
                f"supported {framework}."
            )
        _applied[patch.name] = patch.apply()
        applied.append(patch.name)
    return applied


def revert_all() -> None:
    """Undo every applied patch, newest first."""
    for name in reversed(list(_applied)):
        _applied.pop(name)()
