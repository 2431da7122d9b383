"""``rlweave bench serving``'s workload side: seeded synthetic traffic, the JSONL trace format
and its errors, and the rescaling of arrivals to a load level."""

from __future__ import annotations

import json

import pytest

from rlweave.benchmarks.serving import MAX_MODEL_LEN, read_trace, synthetic_workload, unit_rate


def test_synthetic_workload_is_seeded_heavy_tailed_and_fits_the_model():
    a, b = synthetic_workload(400, seed=3), synthetic_workload(400, seed=3)
    assert a == b != synthetic_workload(400, seed=4)
    outputs = sorted(r["output_len"] for r in a)
    assert outputs[-1] > 5 * outputs[len(outputs) // 2]  # a heavy tail
    assert all(r["prompt_len"] + r["output_len"] < MAX_MODEL_LEN for r in a)


def test_trace_is_read_sorted_and_rescaled_to_unit_rate(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        {"arrival_s": 14.0, "prompt_len": 8, "output_len": 4},
        {"arrival_s": 10.0, "prompt_len": 16, "output_len": 30},
        {"arrival_s": 12.0, "prompt_len": 32, "output_len": 2})) + "\n")
    workload = unit_rate(read_trace(path))
    assert [r["arrival_s"] for r in workload] == [0.0, 1.0, 2.0]
    assert [r["prompt_len"] for r in workload] == [16, 32, 8]


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": 1, "prompt_len": 8}', "trace.jsonl:1: expected"),
    ('{"arrival_s": 1, "prompt_len": 500, "output_len": 20}', "sum below 512"),
])
def test_bad_trace_line_names_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text(line + "\n" + '{"arrival_s": 2, "prompt_len": 8, "output_len": 8}\n')
    with pytest.raises(SystemExit, match=message):
        read_trace(path)
