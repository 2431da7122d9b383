"""SGLang cannot run on this CPU-only machine (its CPU kernels are not on PyPI), so this checks
only that SGLang's own plugin loader finds and runs rlweave's adapter: import level only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

# SGLang 0.5.12 imports torchvision (a CUDA build on PyPI) from `import sglang`: stand-ins
# for its GPU-only imports first (cuda_stand_ins.py; unused where a version does not import them).
# That import is shared; every case below then runs in a fresh process of its own for rlweave,
# forked from it (conftest's run_forked): SGLang's plugin loader has not run there yet.
SHARED = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cuda_stand_ins; "
          "from sglang.srt.plugins import load_plugins")
LOAD = (
    "from sglang.srt.plugins import load_plugins; load_plugins(); "
    "import rlweave.adapters.sglang as a; from rlweave.host import get_host; "
    "print(a._registered, get_host().active)"
)


@pytest.fixture(scope="module")
def runs(version_gate, forked_gate, tmp_path_factory) -> dict[str, subprocess.CompletedProcess | Path]:
    """Every case's process: 'on' (tracing into ``trace``), 'off', and one per version outside."""
    outside, _ = version_gate
    pretend, run_forked = forked_gate
    trace = tmp_path_factory.mktemp("trace")
    cases = {"on": (LOAD, dict(RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(trace))),
             "off": (LOAD, {})}
    cases |= {v: (pretend("sglang", v) + LOAD, dict(RLWEAVE__TRACING__ENABLE="true")) for v in outside("sglang")}
    procs = run_forked(SHARED, list(cases.values()), tmp_path_factory.mktemp("forked"))
    return dict(zip(cases, procs, strict=True)) | {"trace": trace}


def loaded(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_import_only_sglang_plugin_loader_runs_rlweave_adapter(runs):
    assert loaded(runs["on"]) == "True True"
    trace = "".join(p.read_text() for p in runs["trace"].glob("*.jsonl"))
    assert '"name": "sglang"' in trace and "framework_loaded" in trace


def test_import_only_disabled_adapter_does_nothing(runs):
    assert loaded(runs["off"]) == "False False"


def test_import_only_an_sglang_outside_the_supported_range_is_refused_when_a_plugin_is_on(version_gate, runs):
    """SGLang's own plugin loader, with the installed version read as one just outside
    ``rlweave.frameworks``' range (below it, its excluded upper bound): the adapter refuses with
    the supported range and the fix alone, and the process stops (SGLang's loader would log a
    plugin's exception and go on without it)."""
    from rlweave.frameworks import FRAMEWORKS

    outside, _ = version_gate
    for version in outside("sglang"):
        proc = runs[version]
        assert (f"sglang {version} is not supported by rlweave "
                f"(supported: {FRAMEWORKS['sglang'].supported_range})") in proc.stderr
        assert proc.returncode != 0 and not proc.stdout.strip(), f"sglang {version} was accepted: {proc.stdout}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
