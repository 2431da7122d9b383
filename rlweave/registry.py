"""Which plugins exist: the suite's own, found in ``rlweave.plugins``, and third parties', found
through the ``rlweave.plugins`` entry-point group (``name = "package.options:PLUGIN"``).

Discovery instead of a list in the core: adding a plugin is adding a package, and a third-party
plugin gets options, a ``doctor`` row and the same validation as the suite's.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from importlib.metadata import entry_points

from rlweave.plugin_api import ConfigError, PluginInfo

ENTRY_POINT_GROUP = "rlweave.plugins"
_SUITE_PACKAGE = "rlweave.plugins"


def _suite_plugins() -> list[PluginInfo]:
    package = importlib.import_module(_SUITE_PACKAGE)
    out = []
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg):
        out.append(importlib.import_module(f"{_SUITE_PACKAGE}.{module}.options").PLUGIN)
    return out


def _third_party_plugins() -> list[tuple[PluginInfo, str]]:
    out = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        info = ep.load()
        if not isinstance(info, PluginInfo) or info.name != ep.name:
            raise ConfigError(
                f"entry point '{ep.name} = {ep.value}' in group '{ENTRY_POINT_GROUP}' (distribution "
                f"{ep.dist.name if ep.dist else '?'}) must name a PluginInfo whose name is '{ep.name}'; "
                f"fix that package's entry point or uninstall it."
            )
        out.append((info, ep.value))
    return out


@functools.cache
def plugins() -> dict[str, PluginInfo]:
    """Every installed plugin by section name: the suite's first, in name order, then third
    parties'. Two plugins claiming one section are refused, naming both."""
    found = {info.name: info for info in _suite_plugins()}
    for info, origin in _third_party_plugins():
        if info.name in found:
            raise ConfigError(
                f"two plugins claim the section 'rlweave.{info.name}': {found[info.name].hooks} and "
                f"{origin}; uninstall one of them."
            )
        found[info.name] = info
    return found
