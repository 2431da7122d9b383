"""The options of ``rlweave.agentic_rollout``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class AgenticRolloutConfig(PluginSection):
    """Heddle's trajectory-level priority, placement and migration (rlweave.plugins.agentic_rollout).

    The engine cost model (``iteration_base_ms + iteration_per_seq_ms * batch`` per decode
    iteration, ``slots`` sequences per instance, ``prefill_us_per_token``) turns predicted tokens
    into seconds and is what placement balances; ``rlweave bench agentic`` measures it on the
    real engine and prints the values to set. ``prior_tool_ms``: the tool time per call assumed
    before any is observed. ``history_decay``: the weight of the previous rollout batch's
    observations relative to this one's (the predictor keeps ``history`` per task and group).
    ``replan_s``: how often the placement plan is refreshed. ``migrate_fraction``: a trajectory
    moves at a tool call only if re-prefilling its context costs less than this fraction of its
    predicted remaining time. ``skill_z``: the skill guard's threshold: the predictions decide only
    while their measured skill stands at least this many standard errors above none (one-sided);
    below it every turn is first come, first served and the framework places it.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "Heddle (arXiv 2603.28101)"
    iteration_base_ms: float = 2.0
    iteration_per_seq_ms: float = 0.1
    slots: int = 256
    prefill_us_per_token: float = 20.0
    prior_tool_ms: float = 500.0
    history_decay: float = 0.5
    history: int = 2048
    replan_s: float = 0.25
    migrate_fraction: float = 0.1
    skill_z: float = 2.0

    def finalize(self) -> None:
        for option, ok, allowed in (
            ("iteration_base_ms", self.iteration_base_ms > 0, "> 0"),
            ("iteration_per_seq_ms", self.iteration_per_seq_ms >= 0, ">= 0"),
            ("slots", self.slots >= 1, ">= 1 (the engine's max_num_seqs)"),
            ("prefill_us_per_token", self.prefill_us_per_token >= 0, ">= 0"),
            ("prior_tool_ms", self.prior_tool_ms >= 0, ">= 0"),
            ("history_decay", 0 < self.history_decay <= 1, "in (0, 1] (1 = never forget)"),
            ("history", self.history >= 1, ">= 1"),
            ("replan_s", self.replan_s >= 0, ">= 0"),
            ("migrate_fraction", 0 <= self.migrate_fraction <= 1, "between 0 and 1 (0 = never migrate)"),
            ("skill_z", math.isfinite(self.skill_z) and self.skill_z >= 0,
             "a finite number >= 0 (standard errors of skill above none; 0 = follow unless worse than chance)"),
        ):
            if not ok:
                raise ConfigError(f"bad value {getattr(self, option)!r} for "
                                  f"'rlweave.agentic_rollout.{option}'; allowed: {allowed}.")


PLUGIN = PluginInfo("agentic_rollout", AgenticRolloutConfig, hooks="rlweave.plugins.agentic_rollout.plugin")
