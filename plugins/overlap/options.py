"""The options of ``rlweave.overlap``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class OverlapConfig(PluginSection):
    """FLUX's overlapped AllGather+GEMM and GEMM+ReduceScatter in Megatron's sequence-parallel
    TP linears built through ``rlweave.adapters.megatron.layer_spec`` (rlweave.plugins.overlap).

    ``backend``: ``auto`` (the fastest the timeline model predicts among those the device runs,
    and Megatron's own where none beats the collective followed by the GEMM), or one of ``ring``,
    ``symm_mem``, ``tile`` (an error where the device cannot run it). ``profile``: the GEMM and
    link speeds the model uses: ``auto`` (a built-in profile for the device), a built-in name, or
    a JSON file (``rlweave bench overlap`` and ``scripts/gpu_check_overlap.sh`` write them).
    ``max_chunks_per_rank``: the most pieces one rank's shard is cut into; ``chunks_per_rank``:
    a fixed number of pieces instead of the model's choice (0 = the model chooses).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "FLUX (arXiv 2406.06858)"
    BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "ring", "symm_mem", "tile")
    backend: str = "auto"
    profile: str = "auto"
    max_chunks_per_rank: int = 8
    chunks_per_rank: int = 0

    def finalize(self) -> None:
        key = "rlweave.overlap"
        if self.chunks_per_rank < 0:
            raise ConfigError(f"bad value {self.chunks_per_rank!r} for '{key}.chunks_per_rank'; "
                              f"allowed: >= 0 (0 = chosen by the timeline model).")
        if self.backend not in self.BACKENDS:
            raise ConfigError(f"unknown {key}.backend '{self.backend}'; allowed: {', '.join(self.BACKENDS)}.")
        if self.max_chunks_per_rank < 1:
            raise ConfigError(f"bad value {self.max_chunks_per_rank!r} for '{key}.max_chunks_per_rank'; "
                              f"allowed: >= 1 (1 = one piece per rank's shard).")
        if self.profile.endswith(".json"):
            self.profile = os.path.abspath(self.profile)
            if not os.path.isfile(self.profile):
                raise ConfigError(f"{key}.profile={self.profile} does not exist; give a profile JSON "
                                  f"(rlweave bench overlap writes bench-results/overlap-profile-cpu.json) "
                                  f"or a built-in profile name, or auto.")


PLUGIN = PluginInfo("overlap", OverlapConfig, hooks="rlweave.plugins.overlap.plugin")
