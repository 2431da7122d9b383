"""Hook implementation of FLUX's overlap: the backend and chunk schedule of each sequence-
parallel TP linear, decided from the timeline model and the device profile
(``rlweave.overlap.backend`` / ``.profile`` / ``.max_chunks_per_rank`` /
``.chunks_per_rank``)."""

from __future__ import annotations

from rlweave.config import OverlapConfig, RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.overlap.choose import choose
from rlweave.plugins.overlap.profiles import load
from rlweave.types import LinearInfo, TPLinearPlan

_settings = OverlapConfig()


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global _settings
    _settings = config.overlap


@hookimpl
def rlweave_tp_linear_impl(linear: LinearInfo) -> TPLinearPlan | None:
    profile = load(_settings.profile, linear.device.name)
    return choose(linear, profile, _settings.backend, _settings.max_chunks_per_rank,
                  _settings.chunks_per_rank)
