"""The options of ``rlweave.preemptive_serving``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import ConfigError, PluginInfo, PluginSection


@dataclass
class PreemptiveServingConfig(PluginSection):
    """FastServe's skip-join MLFQ in the engine scheduler (rlweave.plugins.preemptive_serving).

    Level ``p`` has quantum ``base_quantum_ms * quantum_ratio**p``; ``base_quantum_ms = 0``
    takes the shortest iteration measured on the running engine (FastServe's choice). A request
    not served for ``starvation_s`` is promoted to the top level. ``policy``: ``adaptive``
    levels requests by their expected remaining work, learnt from the lengths the engine has
    served (preempts only where that pays); ``skip_join_mlfq`` is FastServe's (join by prefill
    time, demote by attained service); ``mlfq`` joins every request at the top level.
    """

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "FastServe (skip-join MLFQ)"
    POLICIES: ClassVar[tuple[str, ...]] = ("adaptive", "skip_join_mlfq", "mlfq")
    policy: str = "adaptive"
    base_quantum_ms: float = 0.0
    quantum_ratio: float = 2.0
    num_levels: int = 10
    starvation_s: float = 3.0

    def finalize(self) -> None:
        key = "rlweave.preemptive_serving"
        if self.policy not in self.POLICIES:
            raise ConfigError(f"unknown {key}.policy '{self.policy}'; allowed: "
                              f"{', '.join(self.POLICIES)} (adaptive = by expected remaining work, "
                              "skip_join_mlfq = FastServe's, mlfq = every request joins the top level).")
        for option, value, ok, allowed in (
            ("base_quantum_ms", self.base_quantum_ms, self.base_quantum_ms >= 0,
             ">= 0 (0 = the engine's shortest measured iteration)"),
            ("quantum_ratio", self.quantum_ratio, self.quantum_ratio > 1, "> 1"),
            ("num_levels", self.num_levels, self.num_levels >= 1, ">= 1"),
            ("starvation_s", self.starvation_s, self.starvation_s > 0, "> 0"),
        ):
            if not ok:
                raise ConfigError(f"bad value {value!r} for '{key}.{option}'; allowed: {allowed}.")


PLUGIN = PluginInfo("preemptive_serving", PreemptiveServingConfig, hooks="rlweave.plugins.preemptive_serving.plugin")
