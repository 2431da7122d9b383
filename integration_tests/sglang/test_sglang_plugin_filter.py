"""``rlweave doctor``'s reading of ``SGLANG_PLUGINS`` against SGLang's own plugin loader: for
each value, doctor says rlweave is filtered out exactly when the installed SGLang's
``load_plugins_by_group`` skips rlweave's entry point. Import level only (see
test_sglang_import_only.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlweave.frameworks import FRAMEWORKS

# Unset, empty (SGLang: every plugin), blank, names with spaces, verl's 'auto' (not special to
# SGLang), another plugin only, a case change.
VALUES = [None, "", " ", ",", "rlweave", " rlweave , other", "auto", "other", "RLWEAVE"]

LOADED = f"""
import json, os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r}); import cuda_stand_ins
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
found = {{}}
for value in json.loads(sys.argv[1]):
    os.environ.pop("SGLANG_PLUGINS", None)
    if value is not None:
        os.environ["SGLANG_PLUGINS"] = value
    found[json.dumps(value)] = "rlweave" in load_plugins_by_group(GENERAL_PLUGINS_GROUP)
print(json.dumps(found))
"""


def test_import_only_doctor_reads_sglang_plugins_as_sglangs_loader_does():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLWEAVE", "SGLANG_PLUGINS"))}
    proc = subprocess.run([sys.executable, "-c", LOADED, json.dumps(VALUES)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = {json.loads(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    assert set(loaded.values()) == {True, False}  # both outcomes occur among the values
    sglang = FRAMEWORKS["sglang"]
    said = {v: sglang.filters_out_rlweave({} if v is None else {"SGLANG_PLUGINS": v}) is None for v in VALUES}
    assert said == loaded
