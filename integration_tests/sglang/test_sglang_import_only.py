"""SGLang cannot run on this CPU-only machine (its CPU kernels are not on PyPI), so this checks
only that SGLang's own plugin loader finds and runs rlweave's adapter: import level only."""

from __future__ import annotations

import os
import subprocess
import sys

LOAD = (
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
