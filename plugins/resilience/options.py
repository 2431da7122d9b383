"""The options of ``rlweave.resilience``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class ResilienceConfig(PluginSection):
    """MegaScale's fault tolerance for verl jobs (rlweave.plugins.resilience).

    Every worker beats every ``heartbeat_s``; the monitor checks every ``check_s`` (a worker
    process on the monitor's node that ends is seen at once, without waiting for a check). A worker
    silent for ``safety_factor`` times the longest gap seen (at least ``min_timeout_s``;
    ``initial_timeout_s`` until calibrated), or in one section for ``safety_factor`` times its
    longest (at least ``section_floor_s``), is hung. A section ``1/straggler_threshold`` times
    slower than the median rank's makes a straggler, reported; ``evict_stragglers`` replaces it.
    Trainer state is snapshot to host memory (``snapshot_dir``) every ``snapshot_every`` steps;
    verl's ``save_freq`` checkpoints are staged there and persisted in the background. At most
    ``max_recoveries`` recoveries per run, each within ``recovery_timeout_s``. Faults are
    injected by the chaos tool, a test's and a benchmark's plugin, not an option here
    (:mod:`rlweave.benchmarks.resilience_chaos`).
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "MegaScale (NSDI'24)"
    heartbeat_s: float = 0.5
    check_s: float = 0.5
    safety_factor: float = 5.0
    min_timeout_s: float = 3.0
    initial_timeout_s: float = 60.0
    section_floor_s: float = 10.0
    straggler_threshold: float = 0.75
    evict_stragglers: bool = False
    snapshot_every: int = 1
    snapshot_dir: str = "/dev/shm/rlweave-snapshots"
    max_recoveries: int = 5
    recovery_timeout_s: float = 300.0

    def finalize(self) -> None:
        key = "rlweave.resilience"
        for option, ok, allowed in (
            ("heartbeat_s", 0 < self.heartbeat_s <= 10, "in (0, 10] seconds"),
            ("check_s", 0 < self.check_s <= self.heartbeat_s, "in (0, heartbeat_s] seconds"),
            ("safety_factor", self.safety_factor >= 1, ">= 1"),
            ("min_timeout_s", self.min_timeout_s > self.heartbeat_s, "> heartbeat_s"),
            ("initial_timeout_s", self.initial_timeout_s >= self.min_timeout_s, ">= min_timeout_s"),
            ("section_floor_s", self.section_floor_s > 0, "> 0 seconds"),
            ("straggler_threshold", 0 < self.straggler_threshold < 1, "in (0, 1)"),
            ("snapshot_every", self.snapshot_every >= 1, ">= 1 (steps between host-memory snapshots)"),
            ("max_recoveries", self.max_recoveries >= 0, ">= 0"),
            ("recovery_timeout_s", self.recovery_timeout_s > 0, "> 0 seconds"),
        ):
            if not ok:
                raise ConfigError(f"bad value {getattr(self, option)!r} for '{key}.{option}'; allowed: {allowed}.")
        self.snapshot_dir = os.path.abspath(self.snapshot_dir)


PLUGIN = PluginInfo("resilience", ResilienceConfig, hooks="rlweave.plugins.resilience.plugin")
