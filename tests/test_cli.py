from __future__ import annotations

import argparse
import sys

import pytest

from rlweave.cli import BENCH_EXTRA, build_parser, main


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


def test_every_command_prints_its_help():
    # argparse formats help strings with %: a bare "5%" in one crashed `bench stream --help`.
    parser = build_parser()
    stack = [parser]
    while stack:
        p = stack.pop()
        assert p.format_help()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())


FAKE_BENCH = '''
import logging, subprocess, sys
from pathlib import Path
from rlweave.benchmarks import BenchResult

def add_arguments(parser):
    pass

def run(args):
    print("run 1/1 ...")
    logging.getLogger("vllm").warning("an engine's WARNING line")
    subprocess.run([sys.executable, "-c", "print('engine core says hi')"], check=True)
    return BenchResult({"ratio": 2.0}, [["policy", "ratio"], ["rlweave", "2.0"]], "test regime")

def plot(result, path):
    Path(path).write_bytes(b"png")
    return Path(path)
'''


def test_bench_output_is_progress_and_table_with_the_frameworks_logs_in_a_file(tmp_path):
    """What `rlweave bench` prints for a person, and what goes to bench-results/<name>.log."""
    import json
    import subprocess
    import sys

    (tmp_path / "fake_bench.py").write_text(FAKE_BENCH)
    driver = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
              "from rlweave.benchmarks import BENCHMARKS, Benchmark\n"
              "BENCHMARKS['fake'] = Benchmark('fake', 'fake_bench', ('numpy',), '.venv', 'a test')\n"
              "from rlweave.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", driver, "bench", "fake", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "run 1/1 ..." in done.stdout and "rlweave bench fake" in done.stdout
    assert "WARNING" not in done.stdout + done.stderr and "engine core" not in done.stdout + done.stderr
    log = (out / "fake.log").read_text()
    assert "an engine's WARNING line" in log and "engine core says hi" in log
    assert json.loads((out / "fake.json").read_text())["log"] == str(out / "fake.log")
    done = subprocess.run([sys.executable, "-c", driver, "bench", "fake", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == {"ratio": 2.0}  # stdout is the JSON alone
    assert "run 1/1 ..." in done.stderr


@pytest.mark.parametrize("absent", ["rlweave.benchmarks", "matplotlib"])
@pytest.mark.parametrize("argv", [["bench", "moe", "--seed", "1"], ["demo"]])
def test_bench_and_demo_without_the_bench_extra_say_how_to_install_it(monkeypatch, capsys, absent, argv):
    """The runtime wheel ships without the benchmarks and plotting: one line names the fix."""
    monkeypatch.setitem(sys.modules, absent, None)  # what an install without the extra looks like
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"rlweave {argv[0]}: needs the bench extra ({absent} is not installed): {BENCH_EXTRA}"]
    assert "pip install 'rlweave[bench]'" in err


def test_the_runtime_commands_work_without_the_bench_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rlweave.benchmarks", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["doctor", "--here"]) == 0
    assert "verl" in capsys.readouterr().out
    assert "needs the bench extra" in build_parser().format_help()


def test_trace_without_matplotlib_writes_the_perfetto_trace_and_names_the_extra_for_the_png(
        monkeypatch, capsys, tmp_path):
    from rlweave.tracing import Tracer

    tracer = Tracer()
    tracer.configure(tmp_path, process_name="driver")
    tracer.record_span("generate", "rollout", 0.0, 2e6)
    tracer.flush()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["trace", str(tmp_path)]) == 2
    assert (tmp_path / "trace.json").is_file() and not (tmp_path / "timeline.png").exists()
    assert capsys.readouterr().err.strip() == (f"rlweave trace: wrote {tmp_path / 'trace.json'}; the timeline PNG "
                                               f"needs matplotlib, which comes with the bench extra: {BENCH_EXTRA}")
