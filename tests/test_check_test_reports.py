"""scripts/run_tests.sh's verdict beyond pytest's exit code: a group below its test-count floor,
or a skip the runner does not expect, fails CI; the floors table is one CI can read."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_test_reports.py"
spec = importlib.util.spec_from_file_location("check_test_reports", SCRIPT)
check = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = check  # its dataclasses look their module up there
spec.loader.exec_module(check)


def junit(path: Path, passed: int, skips: tuple[str, ...] = (), failed: int = 0) -> Path:
    """A JUnit report as ``pytest --junitxml`` writes it (a testsuites root)."""
    cases = [f'<testcase classname="t" name="p{i}"/>' for i in range(passed)]
    cases += [f'<testcase classname="t" name="f{i}"><failure message="x"/></testcase>' for i in range(failed)]
    cases += [f'<testcase classname="t" name="s{i}"><skipped type="pytest.skip" message="{reason}"/></testcase>'
              for i, reason in enumerate(skips)]
    path.write_text(f'<testsuites><testsuite name="pytest" tests="{len(cases)}">{"".join(cases)}'
                    "</testsuite></testsuites>")
    return path


def test_a_group_that_ran_its_floor_with_only_expected_skips_passes(tmp_path):
    report = check.read_report(junit(tmp_path / "g.xml", 3, ("needs a GPU (CUDA)",), failed=1))
    assert (report.tests, report.ran, report.failed) == (5, 4, 1)
    assert check.breaches("g", report, 4, ("needs a GPU",)) == []


def test_a_group_whose_tests_all_skip_fails_on_its_floor_and_on_each_skip(tmp_path):
    report = check.read_report(junit(tmp_path / "g.xml", 0, ("could not import 'triton'", "")))
    assert check.breaches("g", report, 2, ()) == [
        "g: ran 0 tests, below its floor of 2 (scripts/test_floors.txt)",
        "g: unexpected skip of t::s0: could not import 'triton'",
        "g: unexpected skip of t::s1: (no reason given)"]


def test_a_group_without_a_report_or_a_line_in_the_table_fails(tmp_path, monkeypatch, capsys):
    table = tmp_path / "floors.txt"
    table.write_text("# group floor skips\nunit 1 -\nvllm 1 needs a GPU | needs NCCL\n")
    monkeypatch.setattr(check, "FLOORS", table)
    assert check.read_floors(table)["vllm"] == (1, ("needs a GPU", "needs NCCL"))
    junit(tmp_path / "unit.xml", 1)
    junit(tmp_path / "extra.xml", 1)
    assert check.main(str(tmp_path)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "CHECK FAILED: extra: no line in scripts/test_floors.txt",
        "CHECK FAILED: vllm: no report (the group did not run to its end)"]


def test_the_repositorys_table_names_every_group_run_tests_runs_by_name():
    """(A group named in a loop, ``vllm_sched_$v``, is checked when CI runs: a report without a
    line fails.)"""
    runner = (SCRIPT.parent / "run_tests.sh").read_text()
    groups = {name for name, _ in re.findall(r"(?<![\w$])(\w+) (\.venv[\w-]*) ", runner)}
    assert groups and groups <= set(check.read_floors())


@pytest.mark.parametrize("line", ["unit", "unit many -", "unit 3"])
def test_a_malformed_table_line_is_refused_with_its_place(tmp_path, line):
    table = tmp_path / "floors.txt"
    table.write_text(line + "\n")
    with pytest.raises(SystemExit, match=r"floors.txt:1: expected 'group floor expected-skips'"):
        check.read_floors(table)
