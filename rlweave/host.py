"""The plugin host: one pluggy manager per process, built from the validated config.

Safe to call in every process and any number of times (vLLM and verl load adapters in each of
their processes). Only enabled plugins are registered: disabled means absent.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from rlweave.config import RlweaveConfig, Setting, build_config, settings_from_env, to_env
from rlweave.hookspecs import PROJECT, SPEC_MODULES
from rlweave.registry import plugin

# Always registered: the trylast implementations that give every wrapper hook its base behaviour.
CORE_PLUGIN = "rlweave.defaults"
# Comma-separated entry-point names of third-party hook-only plugins (pluggy's ``rlweave`` group:
# no options, always registered) to load; empty string loads none. Plugins with options are found
# by rlweave.registry and registered, like the suite's own, only when their section is enabled.
LOAD_PLUGINS_ENV = "RLWEAVE_LOAD_PLUGINS"
# Comma-separated importable modules to register as plugins (development, tests), inherited by
# child processes like any environment variable.
PLUGIN_MODULES_ENV = "RLWEAVE_PLUGIN_MODULES"


@dataclass
class Host:
    config: RlweaveConfig
    pm: pluggy.PluginManager

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook

    @property
    def active(self) -> bool:
        """True when anything besides rlweave's core is registered: adapters stay idle otherwise."""
        return any(name != CORE_PLUGIN for name, _ in self.pm.list_name_plugin())

    def implements(self, hook_name: str) -> bool:
        """Whether a plugin (not the core defaults) implements ``hook_name``: adapters skip
        building a hook's arguments on hot paths when nobody listens."""
        caller = getattr(self.pm.hook, hook_name)
        return any(impl.plugin_name != CORE_PLUGIN for impl in caller.get_hookimpls())


def hot_caller(caller: pluggy.HookCaller) -> Callable[..., Any]:
    """A caller of one of a host's hooks (``hot_caller(host.hook.<name>)``) for a path
    run every engine iteration, taking the hookspec's arguments positionally, in its order.

    pluggy's call (its argument checks, and the loop that serves wrappers) costs about a
    microsecond over the implementations' own work, a third of what tracing adds to an
    engine iteration. Where every implementation is a plain one, this calls them directly in
    pluggy's order (last registered first, ``tryfirst``/``trylast`` as pluggy sorted them),
    each with the arguments it names, and returns what pluggy would for a ``firstresult``
    hook (the first result that is not ``None``); for any other hook it returns ``None``,
    so use it only where the results are not read. A wrapper keeps pluggy's own call, and so
    does pluggy's hook-call monitoring, which does not see these calls. Like
    :meth:`Host.implements`, it is made once and serves the plugins registered then.
    """
    names = caller.spec.argnames if caller.spec else ()
    impls = list(reversed(caller.get_hookimpls()))
    if any(impl.hookwrapper or impl.wrapper for impl in impls):
        return lambda *args: caller(**dict(zip(names, args)))
    calls = [_positional(impl.function, [names.index(n) for n in impl.argnames], len(names))
             for impl in impls]
    firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
    if len(calls) == 1 and firstresult:
        return calls[0]

    def call(*args: Any) -> Any:
        for function in calls:
            result = function(*args)
            if firstresult and result is not None:
                return result
        return None

    return call


def _positional(function: Callable[..., Any], picks: list[int], arity: int) -> Callable[..., Any]:
    """``function`` called with the hook's arguments it names (``picks``, indices into the
    hookspec's ``arity`` arguments): itself where it names them all, in order."""
    if picks == list(range(arity)):
        return function
    return lambda *args: function(*[args[i] for i in picks])


_lock = threading.Lock()
_host: Host | None = None


def build_plugin_manager(config: RlweaveConfig) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    for module in SPEC_MODULES:
        pm.add_hookspecs(importlib.import_module(module))
    pm.register(importlib.import_module(CORE_PLUGIN), name=CORE_PLUGIN)
    for section in config.enabled():
        module = plugin(section).hooks
        pm.register(importlib.import_module(module), name=module)
    allow = os.environ.get(LOAD_PLUGINS_ENV)
    if allow is None:
        pm.load_setuptools_entrypoints(PROJECT)
    else:
        for name in filter(None, (n.strip() for n in allow.split(","))):
            pm.load_setuptools_entrypoints(PROJECT, name=name)
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGIN_MODULES_ENV, "").split(","))):
        pm.register(importlib.import_module(module), name=module)
    pm.check_pending()  # a misspelt hookimpl name fails here, loudly
    pm.hook.rlweave_configure.call_historic(kwargs={"config": config})
    return pm


def activate(settings: Iterable[Setting] = (), *, export_env: bool = True) -> Host:
    """(Re)build this process's host from the environment plus ``settings``.

    Returns the existing host when the resulting config is unchanged. With ``export_env`` the
    config is written to ``RLWEAVE__*`` variables so child processes (Ray workers, vLLM engine
    cores) start with the same one.
    """
    global _host
    config = build_config([*settings_from_env(), *settings])
    with _lock:
        if _host is None or _host.config != config:
            _host = Host(config, build_plugin_manager(config))
        if export_env:
            os.environ.update(to_env(config))
        return _host


def get_host() -> Host:
    """This process's host, built from ``RLWEAVE__*`` environment variables on first use."""
    return _host if _host is not None else activate(export_env=False)


def reset() -> None:
    """Forget the host (tests; a process that changes its environment)."""
    global _host
    with _lock:
        _host = None
