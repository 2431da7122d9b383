"""``rlweave bench plan``: the planner against the CPU rig's stored results, read, never rerun.
The stored ``bench agentic`` run becomes the planner's input (its engine model, its seeded
workloads, its instances and slots); every other plugin says it has nothing to compare."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from rlweave.benchmarks.plan import GOAL, PAPER_GOAL, PLUGINS, VERL_ASYNC, plot, run

# A ``rlweave bench agentic --workload depth-mix,depth-mix-grouped`` run on the CPU rig, kept
# beside the tests: bench-results/ is a local, ignored folder, so a clean checkout has none.
STORED = Path(__file__).resolve().parent / "data" / "bench-agentic-depth-mix.json"


def test_the_stored_agentic_run_is_planned_on_its_own_setup_and_compared(tmp_path):
    shutil.copy(STORED, tmp_path / "agentic.json")
    (tmp_path / "unreadable.json").write_text(json.dumps({"benchmark": "overhead", "headline": {}}))
    result = run(argparse.Namespace(results=str(tmp_path)))
    rows = {r["case"]: r for r in result.details["rows"] if r["kind"] == "cpu"}
    index = "verl over rlweave (planner: its non-clairvoyant index)"
    assert set(rows) == {f"{w}: {c}" for w in ("depth-mix", "depth-mix-grouped") for c in ("verl over oracle", index)}
    stored = json.loads(STORED.read_text())["headline"]
    for case, r in rows.items():
        workload, against = case.split(": ", 1)
        key = "oracle_makespan_ratio" if against == "verl over oracle" else "makespan_ratio"
        assert r["measured"] == stored[workload][key]
        assert r["error"] == pytest.approx(abs(r["predicted"] / r["measured"] - 1))
        if against == "verl over oracle":  # Heddle's oracle shortens the makespan on both shapes, beyond the index
            assert r["predicted"] > max(1.0, rows[f"{workload}: {index}"]["predicted"])
    h = result.headline
    assert h["max_planner_error_cpu"] == max(r["error"] for r in rows.values())
    assert h["goal_met"] == (h["max_planner_error_cpu"] <= GOAL)
    assert set(h["not_compared"]) == set(PLUGINS) - {"agentic_rollout"}
    json.dumps(h)  # --json prints it
    assert plot(result, tmp_path / "plan.png").stat().st_size > 0


@pytest.fixture(scope="module")
def nothing_stored(tmp_path_factory):
    return run(argparse.Namespace(results=str(tmp_path_factory.mktemp("empty"))))


def test_without_stored_results_nothing_is_compared_and_it_says_so(nothing_stored):
    h = nothing_stored.headline
    assert h["max_planner_error_cpu"] is None and h["goal_met"] is None
    assert set(h["not_compared"]) == set(PLUGINS)


def test_verls_published_async_table_is_planned_from_its_published_stages(nothing_stored):
    result = nothing_stored
    papers = [r for r in result.details["rows"] if r["kind"] == "paper" and r["plugin"] == "stream_generation"]
    assert [r["measured"] for r in papers] == [pytest.approx(s / a) for s, _, a in VERL_ASYNC.values()]
    for r in papers:
        assert r["error"] == pytest.approx(abs(r["predicted"] / r["measured"] - 1))
        assert r["settings"]["generation_gpus"] + r["settings"]["training_gpus"] == int(r["case"].split()[2])
    h = result.headline
    megascale = next(r for r in result.details["rows"] if r["case"].startswith("MegaScale ETTR"))
    assert megascale["measured"] == 0.90 and 0.9 < megascale["predicted"] < 1  # a floor, which it clears
    assert megascale["error"] == 0.0
    flux = [r for r in result.details["rows"] if r["case"].startswith("FLUX")]
    assert [r["measured"] for r in flux] == [0.40, 0.63, 0.72]
    assert all(-1 < r["predicted"] < 1 for r in flux)  # an E_overlap
    assert h["max_paper_error"] == max(r["error"] for r in [*papers, *flux, megascale])
    assert h["paper_goal_met"] == (h["max_paper_error"] <= PAPER_GOAL)
