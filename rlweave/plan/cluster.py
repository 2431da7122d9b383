"""The cluster file: what a trace cannot know, for the planner (issue 44, "Record").

A trace holds times, not hardware: it says how long each stage and each engine iteration took,
but not on which GPU, for which model, with which parallelism. The cluster file (TOML, read with
the standard library) states the target cluster and the setup the trace was recorded on; see
``docs/plan.md`` for the format. :func:`load_cluster` checks every field and raises one
:class:`ClusterError` listing each bad field with its fix.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlweave.plan.gpus import DEFAULTS, FIGURES, GpuProfile

MEASURED = "measured"  # a gpu kind whose figures are all given in the file


class ClusterError(ValueError):
    """A bad cluster file: ``problems`` holds one line per bad field, naming it and the fix."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"cluster file {source}:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class Model:
    """The model trained: ``params_b`` billions of parameters (all experts), ``experts`` 0 for
    a dense model, ``top_k`` experts per token (0 for dense)."""

    params_b: float
    layers: int
    hidden: int
    experts: int = 0
    top_k: int = 0


@dataclass(frozen=True)
class Parallelism:
    """Training's ``tp`` x ``pp`` x ``dp`` (= the GPU count: verl's default colocates training
    and generation on every GPU), expert parallelism ``ep``, and each generation instance's
    tensor parallelism ``rollout_tp``."""

    tp: int
    pp: int
    dp: int
    ep: int
    rollout_tp: int


@dataclass(frozen=True)
class Recorded:
    """The setup the trace was recorded on: its device, GPU count, model size and generation TP."""

    gpu: GpuProfile
    gpus: int
    params_b: float
    rollout_tp: int


@dataclass(frozen=True)
class Failures:
    """What failures cost, for resilience's prediction (every figure the user's own; none has a
    default): ``gpu_mtbf_hours`` mean hours between failures of one GPU (the cluster fails
    ``count`` times as often); ``checkpoint_s`` and ``restart_s`` verl's save to storage and
    its job restart with the reload; ``snapshot_s`` and ``recover_s`` resilience's host-memory
    snapshot and its rebuild of the failed group from it (absent: resilience is not predicted)."""

    gpu_mtbf_hours: float
    checkpoint_s: float
    restart_s: float
    snapshot_s: float | None = None
    recover_s: float | None = None


@dataclass(frozen=True)
class Cluster:
    """The target cluster, and what the recorded job was run on. ``requests_per_step``: the
    target's generation batch (``None``: the recorded requests per generation instance, kept);
    ``slots``: sequences per instance (``None``: the recorded engine's); ``failures``: the
    ``[failures]`` section (``None``: absent)."""

    gpu: GpuProfile
    gpus: int
    model: Model
    parallelism: Parallelism
    recorded: Recorded
    requests_per_step: int | None = None
    slots: int | None = None
    failures: Failures | None = None

    @property
    def instances(self) -> int:
        """Generation instances: one per ``rollout_tp`` GPUs."""
        return self.gpus // self.parallelism.rollout_tp


class _Reader:
    """Reads one section's fields, collecting a problem per bad field instead of stopping."""

    def __init__(self, data: Mapping[str, Any], problems: list[str]) -> None:
        self.data, self.problems = data, problems

    def section(self, name: str, known: tuple[str, ...], required: bool = True) -> dict[str, Any]:
        table = self.data.get(name)
        if table is None:
            if required:
                self.problems.append(f"[{name}] is missing: add the section (see docs/plan.md)")
            return {}
        if not isinstance(table, dict):
            self.problems.append(f"[{name}] must be a table: write it as a [{name}] section")
            return {}
        for key in sorted(set(table) - set(known)):
            self.problems.append(f"[{name}] {key}: unknown field; known: {', '.join(known)}")
        return table

    def number(self, table: dict, where: str, key: str, *, whole: bool, least: float,
               default: Any = ..., fix: str = "") -> Any:
        """``table[key]`` as an int (``whole``) or float >= ``least``; ``default`` when absent
        (``...``: required). Returns ``None`` after recording a problem."""
        if key not in table:
            if default is ...:
                self.problems.append(f"[{where}] {key} is missing: {fix or 'add it'}")
                return None
            return default
        value = table[key]
        kind = "a whole number" if whole else "a number"
        ok_type = isinstance(value, int) if whole else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type or value < least:
            self.problems.append(f"[{where}] {key} = {value!r}: must be {kind} >= {least:g}"
                                 + (f"; {fix}" if fix else ""))
            return None
        return float(value) if not whole else value

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)


def _gpu(r: _Reader, table: dict, where: str) -> GpuProfile | None:
    """A default profile (``kind``), with any figure the table gives overriding it; kind
    ``measured`` needs every figure."""
    kind = table.get("kind", table.get("gpu"))
    key = "kind" if "kind" in table else "gpu"
    names = ", ".join([*DEFAULTS, MEASURED])
    if kind is None or (kind not in DEFAULTS and kind != MEASURED):
        r.problems.append(f"[{where}] {key} = {kind!r}: name a default profile ({names}), or {MEASURED!r} "
                          f"with {', '.join(FIGURES)} given")
        return None
    figures = {}
    for name in FIGURES:
        fix = f"{key} = {MEASURED!r} needs all of {', '.join(FIGURES)}"
        value = r.number(table, where, name, whole=False, least=1e-9,
                         default=... if kind == MEASURED else None, fix=fix)
        if value is not None:
            figures[name] = value
    if kind == MEASURED:
        if len(figures) < len(FIGURES):
            return None
        return GpuProfile(MEASURED, memory_gb=0.0, source=f"measured, from the cluster file's [{where}]", **figures)
    base = DEFAULTS[kind]
    if not figures:
        return base
    given = ", ".join(f"{k} = {v:g}" for k, v in figures.items())
    return replace(base, source=f"measured ({given}, from the cluster file's [{where}]); else {base.source}",
                   **figures)


def _model(r: _Reader, table: dict) -> Model | None:
    fields = {"params_b": r.number(table, "model", "params_b", whole=False, least=1e-6,
                                   fix="the model's parameters in billions, all experts counted"),
              "layers": r.number(table, "model", "layers", whole=True, least=1),
              "hidden": r.number(table, "model", "hidden", whole=True, least=1),
              "experts": r.number(table, "model", "experts", whole=True, least=0, default=0,
                                  fix="0 for a dense model"),
              "top_k": r.number(table, "model", "top_k", whole=True, least=0, default=0)}
    if None in fields.values():
        return None
    experts, top_k = fields["experts"], fields["top_k"]
    r.check(experts == 0 and top_k == 0 or 1 <= top_k <= experts,
            f"[model] top_k = {top_k}: with experts = {experts} it must be "
            + ("0 (a dense model)" if experts == 0 else f"between 1 and {experts}"))
    return Model(**fields)


def _parallelism(r: _Reader, table: dict, gpus: int | None, model: Model | None) -> Parallelism | None:
    fields = {k: r.number(table, "parallelism", k, whole=True, least=1, default=1 if k == "ep" else ...)
              for k in ("tp", "pp", "dp", "ep", "rollout_tp")}
    if None in fields.values():
        return None
    p = Parallelism(**fields)
    if gpus is not None:
        r.check(p.tp * p.pp * p.dp == gpus,
                f"[parallelism] tp x pp x dp = {p.tp * p.pp * p.dp}, but [gpu] count = {gpus}: make them equal "
                f"(verl's default loop trains and generates on every GPU)")
        r.check(gpus % p.rollout_tp == 0,
                f"[parallelism] rollout_tp = {p.rollout_tp} does not divide [gpu] count = {gpus}: choose a divisor")
    if model is not None:
        r.check(model.layers % p.pp == 0,
                f"[parallelism] pp = {p.pp} does not divide [model] layers = {model.layers}: choose a divisor")
        if model.experts == 0:
            r.check(p.ep == 1, f"[parallelism] ep = {p.ep}: a dense model (experts = 0) has ep = 1")
        else:
            r.check(model.experts % p.ep == 0 and (p.tp * p.dp) % p.ep == 0,
                    f"[parallelism] ep = {p.ep}: must divide [model] experts = {model.experts} and tp x dp = "
                    f"{p.tp * p.dp}")
    return p


def _recorded(r: _Reader, table: dict) -> Recorded | None:
    gpu = _gpu(r, table, "recorded")
    gpus = r.number(table, "recorded", "gpus", whole=True, least=1, fix="the GPU count the trace ran on")
    params = r.number(table, "recorded", "params_b", whole=False, least=1e-6,
                      fix="the recorded model's parameters in billions")
    rollout_tp = r.number(table, "recorded", "rollout_tp", whole=True, least=1, default=1)
    if None in (gpu, gpus, params, rollout_tp):
        return None
    r.check(gpus % rollout_tp == 0,
            f"[recorded] rollout_tp = {rollout_tp} does not divide [recorded] gpus = {gpus}: choose a divisor")
    return Recorded(gpu, gpus, params, rollout_tp)


SECTIONS: dict[str, tuple[str, ...]] = {
    "gpu": ("kind", "count", *FIGURES[:2]),
    "links": FIGURES[2:],
    "model": ("params_b", "layers", "hidden", "experts", "top_k"),
    "parallelism": ("tp", "pp", "dp", "ep", "rollout_tp"),
    "recorded": ("gpu", "gpus", "params_b", "rollout_tp", *FIGURES),
    "job": ("requests_per_step", "slots"),
    "failures": ("gpu_mtbf_hours", "checkpoint_s", "restart_s", "snapshot_s", "recover_s"),
}


def _failures(r: _Reader, table: dict) -> Failures | None:
    fields = {k: r.number(table, "failures", k, whole=False, least=1e-9 if k == "gpu_mtbf_hours" else 0.0,
                          default=None if k in ("snapshot_s", "recover_s") else ...,
                          fix="see docs/plan.md, [failures]") for k in SECTIONS["failures"]}
    if any(fields[k] is None for k in ("gpu_mtbf_hours", "checkpoint_s", "restart_s")):
        return None
    r.check((fields["snapshot_s"] is None) == (fields["recover_s"] is None),
            "[failures] snapshot_s and recover_s: give both (resilience's snapshot and recovery) or neither")
    return Failures(**fields)


def parse_cluster(data: Mapping[str, Any], source: str = "<mapping>") -> Cluster:
    """A :class:`Cluster` from a parsed cluster file; raises :class:`ClusterError` listing every
    bad field."""
    problems: list[str] = []
    r = _Reader(data, problems)
    for name in sorted(set(data) - set(SECTIONS)):
        problems.append(f"[{name}]: unknown section; known: {', '.join(SECTIONS)}")
    tables = {name: r.section(name, known, required=name not in ("links", "job", "failures"))
              for name, known in SECTIONS.items()}
    gpus = r.number(tables["gpu"], "gpu", "count", whole=True, least=1, fix="the target cluster's GPU count")
    gpu = _gpu(r, tables["gpu"] | tables["links"], "gpu") if tables["gpu"] else None
    model = _model(r, tables["model"]) if tables["model"] else None
    parallelism = _parallelism(r, tables["parallelism"], gpus, model) if tables["parallelism"] else None
    recorded = _recorded(r, tables["recorded"]) if tables["recorded"] else None
    job = {k: r.number(tables["job"], "job", k, whole=True, least=1, default=None) for k in SECTIONS["job"]}
    failures = _failures(r, tables["failures"]) if tables["failures"] else None
    if problems:
        raise ClusterError(source, problems)
    return Cluster(gpu, gpus, model, parallelism, recorded, **job, failures=failures)


def load_cluster(path: str | Path) -> Cluster:
    """Read and check a TOML cluster file."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClusterError(str(path), ["no such file: give the path of a TOML cluster file (docs/plan.md)"]) from None
    except tomllib.TOMLDecodeError as error:
        raise ClusterError(str(path), [f"not valid TOML ({error}): fix the syntax"]) from None
    return parse_cluster(data, str(path))


__all__ = ["Cluster", "ClusterError", "Failures", "Model", "Parallelism", "Recorded", "load_cluster", "parse_cluster"]
