from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rlweave import patches
from rlweave.frameworks import FRAMEWORKS, UnsupportedFrameworkError, require_supported


def test_every_patch_has_an_upstream_note_and_a_version_range():
    for patch in patches.PATCHES:
        note = patch.upstream_note.read_text()
        assert note.startswith("# "), f"{patch.name}: upstream.md should read as a PR"
        assert "## " in note
        supported = FRAMEWORKS[patch.framework].supported
        fitting = [v for v in lower_bounds(patch.versions, supported)
                   if v in patch.versions and v in supported]
        assert fitting, (f"{patch.name}: range {patch.versions} holds no version of "
                         f"{patch.framework} rlweave supports ({supported})")


def lower_bounds(*ranges: SpecifierSet) -> list[Version]:
    """The versions the ranges start at (``>=`` bounds): two ranges overlap exactly when the
    larger of their lower bounds lies in both (an empty range holds none)."""
    return [Version(s.version) for r in ranges for s in r if s.operator == ">="]


def test_patch_is_never_applied_to_a_version_it_was_not_written_for():
    with pytest.raises(patches.PatchVersionError, match="written for vllm"):
        patches.apply_patches("vllm", "0.40.0")


@pytest.mark.parametrize(("name", "version", "ok"), [
    ("vllm", "0.32.0", True), ("vllm", "0.32.0+cpu", True), ("vllm", "0.24.0", True), ("vllm", "0.23.9", False), ("vllm", "0.35.0", False),
    ("verl", "0.9.1", True), ("verl", "0.10.0", False), ("megatron-core", "0.19.2", True),
])
def test_supported_ranges(name, version, ok):
    assert FRAMEWORKS[name].is_supported(version) is ok


def test_unsupported_version_error_names_the_fix(monkeypatch):
    monkeypatch.setattr(type(FRAMEWORKS["vllm"]), "find_version", lambda self, paths=None: "0.20.0")
    with pytest.raises(UnsupportedFrameworkError, match=r"vllm 0.20.0 is not supported.*pip install"):
        require_supported("vllm")
