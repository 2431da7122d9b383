"""``rlweave bench plan``: the planner against the CPU rig's stored results, read, never rerun.
The stored ``bench agentic`` run becomes the planner's input (its engine model, its seeded
workloads, its instances and slots); every other plugin says it has nothing to compare."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from rlweave.benchmarks.plan import GOAL, PLUGINS, plot, run
from rlweave.benchmarks.plan_papers import (
    FLUX_COMM_SHARE,
    FLUX_MODEL,
    MEGASCALE_MFU,
    PAPER_GOAL,
    TAGS,
    ULTRAEP_IMBALANCE,
    VERL_ASYNC,
    VERL_STALENESS,
)

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
    papers = [r for r in result.details["rows"] if r["kind"] == "paper" and r["case"].endswith("sync over async")]
    assert [r["measured"] for r in papers] == [pytest.approx(s / a) for s, _, a in VERL_ASYNC.values()]
    for r in papers:
        assert r["error"] == pytest.approx(abs(r["predicted"] / r["measured"] - 1))
        assert r["settings"]["generation_gpus"] + r["settings"]["training_gpus"] == int(r["case"].split()[2])
    h = result.headline
    megascale = next(r for r in result.details["rows"] if r["case"].startswith("MegaScale ETTR"))
    assert megascale["measured"] == 0.90 and 0.9 < megascale["predicted"] < 1  # a floor, which it clears
    assert megascale["error"] == 0.0
    flux = [r for r in result.details["rows"] if r["case"].startswith("FLUX average E_overlap")]
    assert [r["measured"] for r in flux] == [0.40, 0.63, 0.72]
    assert all(-1 < r["predicted"] < 1 for r in flux)  # an E_overlap
    every = [r for r in result.details["rows"] if r["kind"] == "paper"]
    assert {id(r) for r in [*papers, *flux, megascale]} <= {id(r) for r in every}
    assert h["max_paper_error"] == max(r["error"] for r in every)
    assert h["paper_goal_met"] == (h["max_paper_error"] <= PAPER_GOAL)


def test_every_paper_row_marks_each_input_published_or_assumed(nothing_stored):
    rows = [r for r in nothing_stored.details["rows"] if r["kind"] == "paper"] + nothing_stored.details["headlines"]
    for r in rows:
        assert r["label"] in ("SIMULATED", "MODELLED"), r["case"]
        assert r["inputs"] and all(v.endswith(TAGS) for v in r["inputs"].values()), r["case"]
        tags = " ".join(r["inputs"].values())
        assert "[P]" in tags and "[A]" in tags, r["case"]  # each rests on something published and says what it assumes
    for entry in nothing_stored.headline["paper_headlines"].values():
        assert entry["published"] and entry["assumed"]


def test_no_paper_row_is_dropped_silently(nothing_stored):
    h, details = nothing_stored.headline, nothing_stored.details
    cases = {r["case"] for r in details["rows"] if r["kind"] == "paper"}
    model = {f"FLUX {use} speedup, {name}" for name, uses in FLUX_MODEL.items() for use in uses}
    shares = {c for c in cases if c.startswith("FLUX TP share")}
    mfu = {f"MegaScale MFU, 12,288 GPUs: {s}" for s in MEGASCALE_MFU}
    assert len(model) == 8 and model | mfu <= cases and len(shares) == len(FLUX_COMM_SHARE)
    assert set(h["paper_errors"]) == cases  # each compared row reaches --json with its error
    assert "FLUX decode, h800-nvlink" in h["papers_not_compared"]  # the one published cell that is empty
    papers = [c.split(":")[0] for c in h["paper_headlines"]]
    assert papers == ["StreamRL", "RLHFuse", "Heddle", "FastServe", "ReLibra"]
    printed = {row[1] for row in nothing_stored.rows}
    assert cases | set(h["paper_headlines"]) <= printed  # and to the terminal's table


def _paper(result, case):
    return next(r for r in result.details["rows"] if r["case"] == case)


def test_flux_model_level_rows_are_the_overlap_models_figures(nothing_stored):
    """Pinned: the overlap plugin's timeline model on FLUX's published shapes (MODELLED). A change
    to the model or the profiles moves them; the docs' table must move with them."""
    pinned = {("training", "a100-pcie"): 1.411, ("training", "a100-nvlink"): 1.036,
              ("training", "h800-nvlink"): 1.306, ("prefill", "a100-pcie"): 1.574,
              ("prefill", "a100-nvlink"): 1.064, ("prefill", "h800-nvlink"): 1.474,
              ("decode", "a100-pcie"): 1.202, ("decode", "a100-nvlink"): 1.020}
    for (use, name), figure in pinned.items():
        r = _paper(nothing_stored, f"FLUX {use} speedup, {name}")
        assert r["measured"] == FLUX_MODEL[name][use]
        assert r["predicted"] == pytest.approx(figure, abs=6e-4), (use, name)
        assert r["predicted"] >= 1.0  # the tiles are used only where they beat the collective-then-GEMM path
        assert r["error"] == pytest.approx(abs(r["predicted"] / r["measured"] - 1))
    for name, (low, high) in FLUX_COMM_SHARE.items():
        r = _paper(nothing_stored, f"FLUX TP share of a training step, {name} ({low:.0%} to {high:.0%})")
        inside = low <= r["predicted"] <= high
        assert (r["error"] == 0.0) == inside and 0 < r["predicted"] < 1


def test_megascale_mfu_is_train_flops_from_the_3072_gpu_run(nothing_stored):
    """The planner's train-flops keeps the recorded efficiency: at 12,288 GPUs it predicts the
    3,072-GPU MFU, and errs by the published drop."""
    for system, (recorded, published) in MEGASCALE_MFU.items():
        r = _paper(nothing_stored, f"MegaScale MFU, 12,288 GPUs: {system}")
        assert r["predicted"] == pytest.approx(recorded, rel=1e-9) and r["measured"] == published
        assert r["error"] == pytest.approx(recorded / published - 1, rel=1e-9)


def test_headline_only_papers_give_a_figure_a_ceiling_and_a_verdict(nothing_stored):
    rows = {r["case"].split(":")[0]: r for r in nothing_stored.details["headlines"]}
    verl = [r for r in nothing_stored.details["rows"] if r["case"].endswith("sync over async")]
    assert rows["StreamRL"]["predicted"] == max(r["predicted"] for r in verl)
    assert rows["StreamRL"]["ceiling"] >= rows["StreamRL"]["predicted"]
    assert rows["StreamRL"]["plausible"].startswith("not judged")  # the model misses verl's own rows there
    fuse = rows["RLHFuse"]  # fusion's ceiling over the same system unfused is 2, below the 3.7x headline
    assert fuse["ceiling"] == 2.0 and 1.0 < fuse["predicted"] <= 2.0
    assert fuse["plausible"] == "not plausible under these assumptions"
    heddle = rows["Heddle"]  # pinned: its figure (the oracle's) never exceeds its bound by construction
    assert heddle["predicted"] == pytest.approx(1.2912, abs=5e-4)
    assert heddle["ceiling"] == pytest.approx(1.3962, abs=5e-4)
    assert heddle["plausible"] == "not plausible under these assumptions"  # the 2.5x headline is above it
    assert rows["FastServe"]["plausible"] == "not judged (another metric)"
    relibra = rows["ReLibra"]
    assert relibra["predicted"] is None and relibra["ceiling"] == ULTRAEP_IMBALANCE[0] / ULTRAEP_IMBALANCE[1]
    assert relibra["plausible"] == "plausible (under the model's ceiling)"
    json.dumps(nothing_stored.headline)


def test_verls_staleness_ablation_is_planned_from_its_staleness_0_run(nothing_stored):
    """Partial rollout with staleness 0.1, 0.3 and 0.5 over streaming alone (128 H20, 64:64):
    the planner's fully_async mode, from the staleness-0 run's stages, against the published
    steps. The engine is calibrated to that run's step (its simulated step is the recorded one),
    so each ratio is what the model says running ahead and partial rollout buy."""
    rows = [r for r in nothing_stored.details["rows"] if "over 0" in r["case"]]
    assert [r["case"].split("staleness ")[1] for r in rows] == [f"{s:g} over 0" for s in VERL_STALENESS if s]
    for r, (staleness, published) in zip(rows, [(s, p) for s, p in VERL_STALENESS.items() if s], strict=True):
        assert r["measured"] == pytest.approx(VERL_STALENESS[0.0] / published)
        assert r["settings"]["simulated staleness-0 step s"] == pytest.approx(VERL_STALENESS[0.0], rel=0.02)
        assert r["predicted"] > 1.0  # running ahead with partial rollout never loses to streaming alone here
        assert r["error"] == pytest.approx(abs(r["predicted"] / r["measured"] - 1))
        assert r["case"] in nothing_stored.headline["paper_errors"]
