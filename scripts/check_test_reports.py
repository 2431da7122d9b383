"""The verdict of ``scripts/run_tests.sh`` on its groups' JUnit reports, beyond pytest's exit
code: each group listed in ``scripts/test_floors.txt`` ran at least its floor of tests, and every
skip is one that table expects. Usage: ``python scripts/check_test_reports.py REPORTS_DIR``
(``REPORTS_DIR/<group>.xml``); prints each group's counts and exits 1 with one line per breach.

pytest exits 0 when every test of a group skips, and a renamed or dropped file only shrinks the
count: without this check either would leave CI green while testing nothing.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

FLOORS = Path(__file__).resolve().parent / "test_floors.txt"


@dataclass
class GroupReport:
    tests: int = 0
    failed: int = 0
    skips: list[tuple[str, str]] = field(default_factory=list)  # (test, reason)

    @property
    def ran(self) -> int:
        return self.tests - len(self.skips)


def read_floors(path: Path = FLOORS) -> dict[str, tuple[int, tuple[str, ...]]]:
    """group -> (floor, the texts one of which a skip's reason must contain)."""
    table = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 2)
        if len(parts) != 3 or not parts[1].isdigit():
            raise SystemExit(f"{path}:{number}: expected 'group floor expected-skips', got {line!r}")
        group, floor, skips = parts
        table[group] = (int(floor), () if skips == "-" else tuple(s.strip() for s in skips.split("|")))
    return table


def read_report(path: Path) -> GroupReport:
    root = ET.parse(path).getroot()
    report = GroupReport()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for case in suite.iter("testcase"):
            report.tests += 1
            skipped = case.find("skipped")
            if skipped is not None:
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                report.skips.append((name, skipped.get("message", "") or (skipped.text or "")))
            elif case.find("failure") is not None or case.find("error") is not None:
                report.failed += 1
    return report


def breaches(group: str, report: GroupReport | None, floor: int, expected: tuple[str, ...]) -> list[str]:
    if report is None:
        return [f"{group}: no report (the group did not run to its end)"]
    found = [f"{group}: ran {report.ran} tests, below its floor of {floor} "
             f"(scripts/test_floors.txt)"] if report.ran < floor else []
    found += [f"{group}: unexpected skip of {name}: {reason or '(no reason given)'}"
              for name, reason in report.skips if not any(text in reason for text in expected)]
    return found


def main(reports_dir: str) -> int:
    floors = read_floors(FLOORS)
    found: list[str] = []
    reports = {p.stem: read_report(p) for p in sorted(Path(reports_dir).glob("*.xml"))}
    for group in sorted(set(reports) - set(floors)):
        found.append(f"{group}: no line in scripts/test_floors.txt")
    for group, (floor, expected) in floors.items():
        report = reports.get(group)
        if report is not None:
            print(f"{group:13s} {report.tests:4d} tests, {report.failed} failed, "
                  f"{len(report.skips)} skipped (floor {floor})")
        found += breaches(group, report, floor, expected)
    ran, failed = sum(r.ran for r in reports.values()), sum(r.failed for r in reports.values())
    print(f"tests: {ran - failed} passed, {failed} failed, "
          f"{sum(len(r.skips) for r in reports.values())} skipped")
    for line in found:
        print(f"CHECK FAILED: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
