"""Checking the framework settings that enabled plugins need (their ``rlweave_needs``, mapped by
each framework's adapter onto its settings, e.g. :mod:`rlweave.adapters.verl_needs`).

Plugins compose when every setting that two of them need has a value both accept. This module
decides that, for any framework, from the plugins' answers and the settings a run was given:
one :class:`~rlweave.config.ConfigError` names every unmet or conflicting requirement, the
plugin that has it, why, and the setting that fixes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from rlweave.config import ConfigError
from rlweave.types import SettingRequirement


def _accepted(group: list[SettingRequirement]) -> tuple[str, ...]:
    """The values of one key that every requirement of it accepts, in the first one's order."""
    first, *rest = group
    return tuple(v for v in first.allowed if all(v in r.allowed for r in rest))


def _explain(r: SettingRequirement) -> str:
    return f"rlweave.{r.plugin} needs {r.key} in {{{', '.join(r.allowed)}}} ({r.why})"


def problems(requirements: Iterable[SettingRequirement], values: Mapping[str, str],
             source: str) -> list[str]:
    """One sentence per key whose requirements conflict or whose value (``values``, or the
    framework's default) is not accepted; ``[]`` when the run can start."""
    by_key: dict[str, list[SettingRequirement]] = defaultdict(list)
    for r in requirements:
        by_key[r.key].append(r)
    out = []
    for key, group in by_key.items():
        accepted = _accepted(group)
        if not accepted:
            out.append(f"these plugins cannot run together: {'; '.join(map(_explain, group))}.")
            continue
        value = values.get(key, group[0].default)
        if value is None or value in accepted:
            continue
        origin = f"from {source}" if key in values else "the default"
        needs = "; ".join(map(_explain, group))
        out.append(f"{key}={value} ({origin}), but {needs}; set {key}={accepted[0]}.")
    return out


def check_requirements(requirements: Iterable[SettingRequirement], values: Mapping[str, str],
                       source: str) -> None:
    """Raise one :class:`ConfigError` listing every problem :func:`problems` finds."""
    found = problems(requirements, values, source)
    if found:
        raise ConfigError(" ".join(found))


def gathered(answers: Iterable[Iterable[SettingRequirement]]) -> list[SettingRequirement]:
    """Flatten a non-firstresult hook's answers (one list per plugin)."""
    return [r for answer in answers for r in answer]
