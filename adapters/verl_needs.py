"""verl's settings for each neutral need a plugin declares (``rlweave_needs``).

The one place that knows which verl keys meet which need, so that plugins name none and two
plugins needing one key in different values are refused together, naming both
(:mod:`rlweave.requirements`). It lives beside the ``verl`` adapter package rather than in it:
importing that package loads the adapter (verl's entry point is the package), and ``rlweave
doctor`` reads this table without loading anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlweave.types import Need, PluginNeed, SettingRequirement


@dataclass(frozen=True)
class VerlSetting:
    """One verl key that meets (part of) a need. ``key`` may hold ``{plugin}`` (the needing
    plugin's section). ``how`` says what verl does with it, appended to the plugin's why."""

    key: str
    allowed: tuple[str, ...]
    default: str | None
    how: str = ""


TRAINER_MODE = "trainer.v1.trainer_mode"

VERL_SETTINGS: dict[Need, tuple[VerlSetting, ...]] = {
    Need.ENGINE_PRIORITIES: (
        VerlSetting("actor_rollout_ref.rollout.name", ("vllm", "sglang"), None,
                    "verl passes request priorities only to vLLM and, with rlweave's patch, SGLang"),
        VerlSetting("actor_rollout_ref.rollout.scheduling_policy", ("priority",), "fcfs",
                    "the engines ignore request priorities under FCFS; for SGLang rlweave then turns on its "
                    "priority scheduling, lower values first"),
    ),
    Need.TURN_REPORTS: (
        VerlSetting("actor_rollout_ref.rollout.agent.default_agent_loop",
                    ("rlweave_tool_agent", "rlweave_single_turn"), "single_turn_agent",
                    "rlweave's agent loops are verl's tool and single-turn loops with a report around each turn"),
    ),
    Need.STREAMING_TRAINER: (
        VerlSetting(TRAINER_MODE, ("rlweave_stream",), "sync", "rlweave's stream trainer mode"),
    ),
    Need.STEP_REDO: (
        VerlSetting("trainer.use_v1", ("True", "true"), "True", "the recovery is a subclass of verl's v1 trainer"),
        VerlSetting(TRAINER_MODE, ("sync",), "sync",
                    "verl's synchronous loop; its async modes keep later prompts in flight"),
    ),
    Need.HOST_SNAPSHOT: (
        VerlSetting("actor_rollout_ref.actor.strategy", ("fsdp", "fsdp2"), "fsdp",
                    "the host-memory snapshot is verl's FSDP checkpoint"),
    ),
    Need.MOE_LAYERS: (VerlSetting("actor_rollout_ref.actor.strategy", ("megatron",), None),),
    Need.TP_LINEARS: (VerlSetting("actor_rollout_ref.actor.strategy", ("megatron",), None),),
    Need.ROUTING_REPLAY: (
        VerlSetting("actor_rollout_ref.actor.megatron.router_replay.mode", ("R2", "R3"), "disabled"),
    ),
    Need.RLWEAVE_LAYERS: (
        VerlSetting("actor_rollout_ref.actor.megatron.vanilla_mbridge", ("True", "true"), "False",
                    "rlweave's patch builds its layers on verl's mbridge path, whose weight sync and checkpoint "
                    "load it names by logical expert; Megatron-Bridge, verl's default bridge, names experts by "
                    "position, so after a move the rollout engine would get other experts' weights"),
    ),
    Need.SEQUENTIAL_EXPERTS: (
        VerlSetting("actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm", ("False", "false"),
                    "True", "mbridge's MoE models default to grouped GEMM, whose experts share one weight"),
    ),
    Need.LOCAL_TP_LINEARS: (
        VerlSetting("rlweave.{plugin}.enable", ("false",), "false",
                    "verl 0.9's Megatron engine cannot run it yet: its TransformerEngine spec fuses the "
                    "tensor-parallel linears into TE modules, leaving no ColumnParallelLinear or RowParallelLinear "
                    "to replace, and the local spec it gets where TE is absent has no sequence-parallel norm for "
                    "tensor parallelism; it runs in Megatron models built with rlweave.adapters.megatron.layer_spec "
                    "(docs/overlap.md)"),
    ),
}


def _requirement(setting: VerlSetting, need: PluginNeed) -> SettingRequirement:
    why = f"{need.why}: {setting.how}" if setting.how else need.why
    return SettingRequirement(setting.key.format(plugin=need.plugin), setting.allowed, setting.default,
                              why, need.plugin)


def verl_requirements(needs: Iterable[PluginNeed]) -> list[SettingRequirement]:
    """The verl settings that meet ``needs``, one requirement per key and need."""
    return [_requirement(setting, need) for need in needs for setting in VERL_SETTINGS[need.need]]
