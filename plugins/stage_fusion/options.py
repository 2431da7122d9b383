"""The options of ``rlweave.stage_fusion``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class StageFusionConfig(PluginSection):
    """RLHFuse's stage fusion (rlweave.plugins.stage_fusion). In verl (trainer mode
    ``rlweave_stream``): each sample's inference as it finishes, and the generation tail
    migrated onto the instances off the trainer's devices so that theirs run the inference.

    ``migration``: migrate at all. ``migrate_threshold``: migrate once at most this many of the
    step's samples remain (0: the threshold and destinations the cost model predicts fastest, from
    the previous step's lengths). The cost model: a decode iteration with ``b`` sequences takes
    ``decode_base_ms + decode_per_seq_ms * b``, re-prefill ``prefill_us_per_token`` per token;
    inference ``inference_ms_per_sample`` (0: measured on the previous step), ``shared_slowdown``
    times slower (and the engine too) while an engine decodes on the trainer's devices.
    ``rlweave bench fusion-inter`` measures them on the real engine and trainer.
    ``inference_waits``: whether the samples that finish before the migration wait for the
    devices it frees, instead of being inferred beside the generation (``auto``: where the cost
    model predicts it pays; ``always``; ``never``).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "RLHFuse (NSDI'25)"
    WAITS: ClassVar[tuple[str, ...]] = ("auto", "always", "never")
    migration: bool = True
    migrate_threshold: int = 0
    decode_base_ms: float = 2.0
    decode_per_seq_ms: float = 0.1
    prefill_us_per_token: float = 20.0
    inference_ms_per_sample: float = 0.0
    shared_slowdown: float = 2.0
    inference_waits: str = "auto"

    def finalize(self) -> None:
        if self.inference_waits not in self.WAITS:
            raise ConfigError(f"unknown rlweave.stage_fusion.inference_waits '{self.inference_waits}'; allowed: "
                              f"{', '.join(self.WAITS)}.")
        for option, value, ok, allowed in (
            ("migrate_threshold", self.migrate_threshold, self.migrate_threshold >= 0,
             ">= 0 (0 = chosen by the cost model)"),
            ("decode_base_ms", self.decode_base_ms, self.decode_base_ms > 0, "> 0"),
            ("decode_per_seq_ms", self.decode_per_seq_ms, self.decode_per_seq_ms >= 0, ">= 0"),
            ("prefill_us_per_token", self.prefill_us_per_token, self.prefill_us_per_token >= 0, ">= 0"),
            ("inference_ms_per_sample", self.inference_ms_per_sample, self.inference_ms_per_sample >= 0,
             ">= 0 (0 = measured on the previous step)"),
            ("shared_slowdown", self.shared_slowdown, self.shared_slowdown >= 1, ">= 1"),
        ):
            if not ok:
                raise ConfigError(f"bad value {value!r} for 'rlweave.stage_fusion.{option}'; allowed: {allowed}.")


PLUGIN = PluginInfo("stage_fusion", StageFusionConfig, hooks="rlweave.plugins.stage_fusion.inter_stage")
