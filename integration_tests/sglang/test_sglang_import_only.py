"""SGLang cannot run on this CPU-only machine (its CPU kernels are not on PyPI), so this checks
only that SGLang's own plugin loader finds and runs rlweave's adapter: import level only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# SGLang 0.5.12 imports torchvision (a CUDA build on PyPI) from `import sglang`: stand-ins
# for its GPU-only imports first (cuda_stand_ins.py; unused where a version does not import them).
LOAD = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cuda_stand_ins; "
    "from sglang.srt.plugins import load_plugins; load_plugins(); "
    "import rlweave.adapters.sglang as a; from rlweave.host import get_host; "
    "print(a._registered, get_host().active)"
)


def run(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    proc = subprocess.run([sys.executable, "-c", LOAD], env=base | env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_import_only_sglang_plugin_loader_runs_rlweave_adapter(tmp_path):
    assert run(RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=str(tmp_path)) == "True True"
    trace = "".join(p.read_text() for p in tmp_path.glob("*.jsonl"))
    assert '"name": "sglang"' in trace and "framework_loaded" in trace


def test_import_only_disabled_adapter_does_nothing():
    assert run() == "False False"


def test_import_only_an_sglang_outside_the_supported_range_is_refused_when_a_plugin_is_on(version_gate):
    """SGLang's own plugin loader, with the installed version read as one just outside
    ``rlweave.frameworks``' range (below it, its excluded upper bound): the adapter refuses with
    the supported range and the fix alone, and the process stops (SGLang's loader would log a
    plugin's exception and go on without it)."""
    from rlweave.frameworks import FRAMEWORKS

    outside, run_with = version_gate
    for version in outside("sglang"):
        proc = run_with("sglang", version, LOAD, RLWEAVE__TRACING__ENABLE="true")
        assert (f"sglang {version} is not supported by rlweave "
                f"(supported: {FRAMEWORKS['sglang'].supported_range})") in proc.stderr
        assert proc.returncode != 0 and not proc.stdout.strip(), f"sglang {version} was accepted: {proc.stdout}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
