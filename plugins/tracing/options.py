"""The options of ``rlweave.tracing``, and what the host needs to know of the plugin: its section, its
options' type and the module of hooks it registers when the section is enabled."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from rlweave.plugin_api import PluginInfo, PluginSection


@dataclass
class TracingConfig(PluginSection):
    """Span/event recording of every hook, exported as Chrome/Perfetto JSON and a timeline PNG."""

    available: ClassVar[bool] = True
    paper: ClassVar[str] = "(rlweave's own timeline)"
    dir: str = "bench-results/traces"

    def finalize(self) -> None:
        self.dir = os.path.abspath(self.dir)


PLUGIN = PluginInfo("tracing", TracingConfig, hooks="rlweave.plugins.tracing.plugin")
