"""bench overlap's modelled part and its reading of the GPU check's results (no framework)."""

from __future__ import annotations

import json

from rlweave.benchmarks.overlap import CPU_TIMINGS, gpu_summary, layer_model
from rlweave.plugins.overlap.profiles import BUILTIN


def test_layer_model_covers_every_linear_both_directions():
    model = layer_model(BUILTIN["h200-nvlink"], 8, [4096, 8192])
    assert set(model) == {"m=4096", "m=8192"}
    ops = model["m=4096"]["ops"]
    assert len(ops) == 8 and any(k.startswith("fc1.fwd (ag_gemm") for k in ops) and any(k.startswith("fc2.fwd (gemm_rs") for k in ops)
    e = model["m=8192"]["layer_e_overlap"]
    assert e["tile"] > e["decomposed"] and e["tile"] > 0
    assert "mean nothing" in CPU_TIMINGS


def test_gpu_summary_reads_the_gpu_checks_file(tmp_path):
    assert gpu_summary(tmp_path / "missing.json") is None
    row = {"op": "ag_gemm", "m": 4096}
    for v in ("decomposed", "tile"):
        row[v] = {"e_overlap": 0.5, "model_e_overlap": 0.55, "ect_s": 1e-4, "model_ect_s": 1.1e-4}
    path = tmp_path / "overlap-gpu.json"
    path.write_text(json.dumps({"date": "d", "device": "NVIDIA H200", "statement": "one GPU", "link": {},
                                "results_equal_cublas": True, "rows": [row]}))
    summary = gpu_summary(path)
    assert summary["rows"]["ag_gemm@4096"]["tile"]["e_overlap"] == 0.5 and summary["statement"] == "one GPU"
