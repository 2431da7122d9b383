from __future__ import annotations

import pytest

from rlweave.cli import build_parser, main


def test_doctor_lists_every_framework(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("verl", "vllm", "megatron-core", "sglang", "vllm_scheduler_cls", "verl_sglang_priority", "tracing"):
        assert name in out
    assert "rlweave = rlweave.adapters.verl" in out  # the entry point verl loads rlweave through
    assert "trainer.v1.trainer_mode=rlweave_stream" in out  # what stream_generation needs of verl


def test_doctor_here_reports_this_interpreter_only(capsys):
    assert main(["doctor", "--here"]) == 0
    out = capsys.readouterr().out
    assert ".venv-vllm" not in out


def test_bench_accepts_seed_json_and_size_options():
    args = build_parser().parse_args(["bench", "overhead", "--json", "--seed", "3", "--requests", "8"])
    assert args.json and args.seed == 3 and args.requests == 8


def test_unknown_benchmark_is_rejected(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "nope"])
    assert "invalid choice" in capsys.readouterr().err
