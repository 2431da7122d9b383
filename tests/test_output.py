"""``rlweave bench`` and ``demo`` output: the frameworks' logs to a file, rlweave's to the terminal."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging, subprocess, sys, warnings
from pathlib import Path
from rlweave.output import frameworks_log_to

with frameworks_log_to(Path(sys.argv[1]), stdout_is_data=sys.argv[2] == "json") as stdout:
    logging.basicConfig(level=logging.INFO)  # as verl configures the root logger
    logging.getLogger("vllm").info("an engine's INFO line")
    warnings.warn("a framework's warning")
    framework = {"__name__": "ray._private.worker"}
    exec("def forward(): print('a worker line Ray forwards to the driver')", framework)
    framework["forward"]()
    subprocess.run([sys.executable, "-c", "import sys; print('engine core stdout'); print('engine core stderr', file=sys.stderr)"])
    class Engine:
        def __del__(self):
            raise TypeError("'NoneType' object is not callable")
    engine = Engine()
    del engine
    kept = Engine()  # finalized at interpreter exit, as vLLM's engines pinned by a traceback are
    print("rlweave progress")
    print("the result", file=stdout)
logging.getLogger("vllm").info("logged after the block, by a handler made inside it")
"""
FRAMEWORK_LINES = ("an engine's INFO line", "a framework's warning", "a worker line Ray forwards",
                   "engine core stdout", "engine core stderr", "TypeError", "logged after the block")


def run(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "bench.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log), mode], capture_output=True,
                          text=True, check=True, timeout=60)
    return done, log.read_text()


def test_framework_output_goes_to_the_log_and_rlweave_output_to_the_terminal(tmp_path):
    done, log = run(tmp_path, "table")
    assert done.stdout.splitlines() == ["rlweave progress", "the result"]
    assert done.stderr == ""  # not even the exception ignored at exit
    assert log.count("TypeError") == 2
    for line in FRAMEWORK_LINES:
        assert line in log
    assert "rlweave progress" not in log


def test_with_json_stdout_carries_the_result_only(tmp_path):
    done, _ = run(tmp_path, "json")
    assert done.stdout.splitlines() == ["the result"]
    assert done.stderr.splitlines() == ["rlweave progress"]
