"""What a plugin package gives the host: its options' type and where its hooks live.

A plugin, the suite's own or a third party's, is one package holding an ``options`` module with
a :class:`PluginSection` subclass and a ``PLUGIN = PluginInfo(...)``. The host finds it (see
:mod:`rlweave.registry`), gives it the section ``rlweave.<name>`` on every door (verl's command
line, ``RLWEAVE__*`` variables, a mapping) and registers its hooks module only when the section
is enabled: nothing in ``rlweave/`` names a plugin or one of its options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class ConfigError(ValueError):
    """A bad ``rlweave`` setting. The message names the key, the fix and the source."""


@dataclass
class PluginSection:
    """Options every plugin has. ``available`` is False for a plugin that ships its options
    before its hooks, so that enabling it fails loudly instead of silently doing nothing.
    ``finalize`` checks values against each other once all are applied: validation lives with
    the fields it checks."""

    enable: bool = False
    available: ClassVar[bool] = False
    paper: ClassVar[str] = ""

    def finalize(self) -> None:
        """Normalise values once all settings are applied (e.g. make paths absolute, so that
        child processes with another working directory agree)."""


@dataclass(frozen=True)
class PluginInfo:
    """A plugin as the host sees it. ``hooks`` is imported only when the section is enabled, so
    a disabled plugin costs an engine process nothing beyond its options' dataclass."""

    name: str
    options: type[PluginSection]
    hooks: str
