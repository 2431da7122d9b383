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
from rlweave.types import LinearInfo, Need, PluginNeed, TPLinearPlan

_settings = OverlapConfig()

# LOCAL_TP_LINEARS: where the engine's spec has no local TP linears to replace (verl 0.9's), the
# job is refused before it starts rather than run as if enabled.
NEEDS = (
    PluginNeed(Need.TP_LINEARS, "overlap", "overlap replaces Megatron's tensor-parallel linears"),
    PluginNeed(Need.LOCAL_TP_LINEARS, "overlap", "its overlapped linears replace Megatron's local ones"),
)


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _settings
    _settings = config.overlap


@hookimpl
def rlweave_tp_linear_impl(linear: LinearInfo) -> TPLinearPlan | None:
    profile = load(_settings.profile, linear.device.name)
    return choose(linear, profile, _settings.backend, _settings.max_chunks_per_rank,
                  _settings.chunks_per_rank)
