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


def _suite_sources() -> dict[str, str]:
    package = importlib.import_module(_SUITE_PACKAGE)
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg)
    return {name: f"{_SUITE_PACKAGE}.{name}.options:PLUGIN" for name in names}


@functools.cache
def sources() -> dict[str, str]:
    """Every installed plugin's section name and where its :class:`PluginInfo` lives
    (``module:attribute``), found without importing any plugin: the suite's packages first, in
    name order, then third parties' entry points. Two claiming one section are refused, naming
    both."""
    found = _suite_sources()
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in found:
            raise ConfigError(
                f"two plugins claim the section 'rlweave.{ep.name}': {found[ep.name]} and {ep.value}; "
                f"uninstall one of them."
            )
        found[ep.name] = ep.value
    return found


@functools.cache
def plugin(name: str) -> PluginInfo:
    """The plugin of section ``name``; its options module is imported here, on first use only,
    so that a process with every plugin off imports none (disabled means absent)."""
    source = sources()[name]
    module, _, attribute = source.partition(":")
    info = getattr(importlib.import_module(module), attribute, None)
    if not isinstance(info, PluginInfo) or info.name != name:
        raise ConfigError(
            f"'{name} = {source}' (group '{ENTRY_POINT_GROUP}') must name a PluginInfo whose name is "
            f"'{name}'; fix that package's entry point or uninstall it."
        )
    return info


def plugins() -> dict[str, PluginInfo]:
    """Every installed plugin by section name, each imported (``rlweave doctor``, error messages)."""
    return {name: plugin(name) for name in sources()}
