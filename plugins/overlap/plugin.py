"""Hook implementation of FLUX's overlap: the backend and chunk schedule of each sequence-
parallel TP linear, decided from the timeline model and the device profile
(``rlweave.overlap.backend`` / ``.profile`` / ``.max_chunks_per_rank`` /
``.chunks_per_rank``)."""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.plugins.overlap.options import OverlapConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.overlap.choose import choose
from rlweave.plugins.overlap.profiles import load
from rlweave.types import LinearInfo, SettingRequirement, TPLinearPlan

_settings = OverlapConfig()

# In a verl job the linears would never be rlweave's: refuse before the job starts rather than
# run as if enabled. Lifted once a patch makes verl's Megatron engine build rlweave's spec.
VERL_REQUIREMENTS = (
    SettingRequirement("actor_rollout_ref.actor.strategy", ("megatron",), None,
                       "overlap replaces Megatron's tensor-parallel linears", "overlap"),
    SettingRequirement("rlweave.overlap.enable", ("false",), "false",
                       "verl 0.9's Megatron engine builds its layers from Megatron's TransformerEngine spec "
                       "(through Megatron-Bridge or mbridge), which has no ColumnParallelLinear or "
                       "RowParallelLinear for overlap's linears to replace, so it would change nothing; overlap "
                       "runs in Megatron models built with rlweave.adapters.megatron.layer_spec (docs/overlap.md)",
                       "overlap"),
)


@hookimpl
def rlweave_framework_requirements(framework: str) -> Sequence[SettingRequirement]:
    return VERL_REQUIREMENTS if framework == "verl" else ()


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _settings
    _settings = config.overlap


@hookimpl
def rlweave_tp_linear_impl(linear: LinearInfo) -> TPLinearPlan | None:
    profile = load(_settings.profile, linear.device.name)
    return choose(linear, profile, _settings.backend, _settings.max_chunks_per_rank,
                  _settings.chunks_per_rank)
