"""The ``rlweave`` config section: typed, validated, and traceable to where each value came from.

Each installed plugin owns a sub-section, declared in its own package (:mod:`rlweave.plugin_api`,
found by :mod:`rlweave.registry`); this module knows none of them. One section, three doors, later ones overriding earlier ones:
1. environment variables ``RLWEAVE__<PLUGIN>__<OPTION>=value`` (processes that never see verl's
   config: vLLM engine processes, Megatron launched alone; the host exports them to children);
2. Hydra overrides on a verl command line, ``+rlweave.<plugin>.<option>=value``;
3. a mapping passed programmatically (verl's ``config.rlweave``, tests).

A wrong key or value raises :class:`ConfigError` naming the key, what is allowed and the source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlweave.plugin_api import ConfigError, PluginSection
from rlweave.registry import plugin, sources

ENV_PREFIX = "RLWEAVE__"


@dataclass
class RlweaveConfig:
    """The whole ``rlweave`` section: one sub-section per installed plugin, read as an attribute
    (``config.tracing.dir``). Only the sections a setting touched are held; any other reads as its
    plugin's defaults, so that a process with every plugin off imports no plugin module."""

    by_name: dict[str, PluginSection] = field(default_factory=dict)

    def __getattr__(self, name: str) -> PluginSection:
        held = self.__dict__.get("by_name")
        if held is not None and name in held:
            return held[name]
        if held is not None and name in sources():
            return plugin(name).options()
        raise AttributeError(f"no rlweave plugin section '{name}'")

    def held(self, name: str) -> PluginSection:
        """Section ``name``, held from now on (created with its defaults): where settings go."""
        if name not in self.by_name:
            self.by_name[name] = plugin(name).options()
        return self.by_name[name]

    def sections(self) -> Iterator[tuple[str, PluginSection]]:
        """Every installed plugin's section (this imports every plugin's options)."""
        for name in sources():
            yield name, getattr(self, name)

    def enabled(self) -> list[str]:
        """Enabled sections, in the registry's order."""
        if not self.by_name:
            return []
        return [name for name in sources() if name in self.by_name and self.by_name[name].enable]


@dataclass(frozen=True)
class Setting:
    """One ``section.option = value`` with where it came from (for error messages)."""

    key: str  # "tracing.enable"
    value: Any
    source: str


def _parse_value(text: str) -> Any:
    """Parse a command-line or environment value as Hydra does ("true" -> True, "3" -> 3)."""
    return OmegaConf.from_dotlist([f"v={text}"]).v


def settings_from_env(environ: Mapping[str, str] | None = None) -> list[Setting]:
    environ = os.environ if environ is None else environ
    out = []
    for name, value in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            out.append(Setting(key, _parse_value(value), f"environment variable {name}"))
    return out


def settings_from_mapping(mapping: Mapping[str, Any] | Any, source: str) -> list[Setting]:
    """Flatten ``{"tracing": {"enable": True}}`` (a dict or an OmegaConf node) into settings."""
    if OmegaConf.is_config(mapping):
        mapping = OmegaConf.to_container(mapping, resolve=True)
    out = []
    for section, options in (mapping or {}).items():
        if not isinstance(options, Mapping):
            out.append(Setting(str(section), options, source))
            continue
        for option, value in options.items():
            out.append(Setting(f"{section}.{option}", value, source))
    return out


def settings_from_overrides(args: Iterable[str], source: str = "command line") -> list[Setting]:
    """Pick ``[+|++]rlweave.<section>.<option>=<value>`` out of Hydra-style overrides."""
    out = []
    for arg in args:
        stripped = arg.lstrip("+")
        if not stripped.startswith("rlweave.") or "=" not in stripped:
            continue
        key, value = stripped[len("rlweave.") :].split("=", 1)
        out.append(Setting(key, _parse_value(value), f"{source} '{arg}'"))
    return out


def _allowed_values(section: PluginSection, option: str) -> str:
    kind = {f.name: f.type for f in dataclasses.fields(section)}[option]
    return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}.get(
        str(kind), str(kind)
    )


def build_config(settings: Iterable[Setting]) -> RlweaveConfig:
    """Apply settings in order onto the defaults, validating each one."""
    config = RlweaveConfig()
    for s in settings:
        parts = s.key.split(".")
        if len(parts) != 2 or parts[0] not in sources():
            section_names = list(sources())
            raise ConfigError(
                f"unknown rlweave setting 'rlweave.{s.key}' (from {s.source}). "
                f"Settings are rlweave.<plugin>.<option>, plugin one of: {', '.join(section_names)}."
            )
        section_name, option = parts
        section = config.held(section_name)
        options = [f.name for f in dataclasses.fields(section)]
        if option not in options:
            raise ConfigError(
                f"unknown option 'rlweave.{s.key}' (from {s.source}). "
                f"Options of rlweave.{section_name}: {', '.join(options)}."
            )
        node = OmegaConf.structured(section)
        try:
            setattr(node, option, s.value)
        except OmegaConfBaseException:
            raise ConfigError(
                f"bad value {s.value!r} for 'rlweave.{s.key}' (from {s.source}); "
                f"allowed: {_allowed_values(section, option)}."
            ) from None
        setattr(section, option, getattr(node, option))
    for name, section in config.by_name.items():
        section.finalize()
        if section.enable and not section.available:
            available = [n for n, sec in config.sections() if sec.available]
            raise ConfigError(
                f"rlweave.{name} ({section.paper}) is not available in this version of rlweave, "
                f"so enabling it would do nothing. Remove 'rlweave.{name}.enable' or pick one of "
                f"the available plugins: {', '.join(available)}."
            )
    return config


def to_env(config: RlweaveConfig) -> dict[str, str]:
    """Environment variables that reproduce ``config`` in a child process (the non-default
    options of enabled plugins: a disabled plugin leaves no trace)."""
    env = {}
    for name, section in config.by_name.items():
        if not section.enable:
            continue
        default = type(section)()
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value != getattr(default, f.name):
                text = str(value).lower() if isinstance(value, bool) else str(value)
                env[f"{ENV_PREFIX}{name.upper()}__{f.name.upper()}"] = text
    return env
