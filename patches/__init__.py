"""rlweave's monkey-patches: few, small, version-guarded and reversible.

Each patch lives in its own package with an ``upstream.md`` beside it: the text of the upstream
pull request that would make the patch unnecessary. :func:`apply_patches` applies a framework's
patches only to versions they were written for; a patch an enabled plugin needs that does not
fit the installed version is an error, never a silent skip.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

Revert = Callable[[], None]


@dataclass(frozen=True)
class Patch:
    name: str  # the package under rlweave.patches
    framework: str  # a key of rlweave.frameworks.FRAMEWORKS
    versions: SpecifierSet  # versions the patch was written and tested for
    target: str  # the dotted name it replaces
    why: str  # one line for `rlweave doctor`

    def applies_to(self, version: str) -> bool:
        return Version(Version(version).base_version) in self.versions

    @property
    def upstream_note(self) -> Path:
        return Path(__file__).parent / self.name / "upstream.md"

    def apply(self) -> Revert:
        return importlib.import_module(f"{__name__}.{self.name}").apply()


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="vllm_scheduler_cls",
        framework="vllm",
        versions=SpecifierSet(">=0.32.0,<0.33"),
        target="vllm.config.scheduler.SchedulerConfig.get_scheduler_cls",
        why="EngineCore builds rlweave's scheduler subclass when a plugin uses engine hooks and no scheduler_cls is set",
    ),
)


class PatchVersionError(RuntimeError):
    pass


_applied: dict[str, Revert] = {}


def patches_for(framework: str) -> list[Patch]:
    return [p for p in PATCHES if p.framework == framework]


def apply_patches(framework: str, version: str) -> list[str]:
    """Apply ``framework``'s patches once per process; returns the names applied now."""
    applied = []
    for patch in patches_for(framework):
        if patch.name in _applied:
            continue
        if not patch.applies_to(version):
            raise PatchVersionError(
                f"rlweave patch '{patch.name}' (on {patch.target}) was written for {framework} "
                f"{patch.versions}, not {version}; see {patch.upstream_note} and install a "
                f"supported {framework}."
            )
        _applied[patch.name] = patch.apply()
        applied.append(patch.name)
    return applied


def revert_all() -> None:
    """Undo every applied patch, newest first."""
    for name in reversed(list(_applied)):
        _applied.pop(name)()
