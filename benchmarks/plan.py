"""``rlweave bench plan``: the planner's predictions against the CPU rig's stored measurements.

Nothing is rerun: each stored ``bench-results/*.json`` that the planner can read is turned into
the planner's input (the run's own engine model, workload and setup, as its trace would give
them), planned with :mod:`rlweave.plan` on that same setup, and its prediction set beside the
measured ratio: error ``|predicted / measured - 1|``, goal within 0.15 for every plugin
(issue 44). A plugin without a stored measurement, or whose stored JSON holds nothing the
planner reads, gets a row that says so and no error.

Readable today (:mod:`.plan_readers`): ``rlweave bench agentic`` (Heddle), ``bench stream``
(StreamRL), ``bench fusion-executor`` and ``bench fusion-inter`` (RLHFuse's intra- and
inter-stage fusion: one plugin, two readers, its error the worse), ``bench moe``'s measured
part (ReLibra), ``bench serving`` (FastServe) and ``bench resilience``'s ETTR part (MegaScale), each on its own setup; :data:`NOT_READ` says why
the other plugins' runs are not compared.

Beside them, the papers (:mod:`.plan_papers`): rows whose inputs are published, predicted against
the published figure (``max_paper_error``, goal within 0.25), and one row per headline-only
paper, its figure under stated assumptions and whether the headline is plausible there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.plan_papers import PAPER_GOAL, PAPERS_NOT_COMPARED, headline_rows, paper_rows
from rlweave.benchmarks.plan_readers import NOT_READ, READERS, READS

GOAL = 0.15
PLUGINS = ("stream_generation", "agentic_rollout", "preemptive_serving", "overlap", "resilience", "stage_fusion",
           "replay_balance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default="bench-results", help="folder of stored bench JSON files (read only)")


def _tags(inputs: dict[str, str], tag: str) -> list[str]:
    return [name for name, value in inputs.items() if value.endswith(tag)]


def _headline_json(r: dict) -> dict:
    """A headline-only paper's entry in ``--json``: figures, verdict, and its inputs by tag."""
    return {"headline": r["headline"], "predicted": r["predicted"], "ceiling": r["ceiling"],
            "plausible": r["plausible"], "label": r["label"], "published": _tags(r["inputs"], "[P]"),
            "assumed": _tags(r["inputs"], "[A]"), "note": r["note"]}


def _figure(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def run(args: argparse.Namespace) -> BenchResult:
    rows: list[dict] = []
    for path in sorted(Path(args.results).glob("*.json")):
        record = json.loads(path.read_text())
        reader = READERS.get(record.get("benchmark", ""))
        if reader:
            rows += reader(record, str(path))
    compared = {r["plugin"] for r in rows}
    benches = {p: " or ".join(f"bench {b}" for b, plugin in READS.items() if plugin == p) for p in READS.values()}
    missing = {p: NOT_READ.get(p) or f"no stored {benches[p]} run in {args.results}/ with what its reader "
                                      f"compares (the reader is built)" for p in PLUGINS if p not in compared}
    # a plugin with several readers (stage fusion: intra- and inter-stage): its worst row
    errors = {p: float(max(r["error"] for r in rows if r["plugin"] == p)) for p in compared}
    worst = max(errors.values(), default=None)
    papers = paper_rows()
    headlines = headline_rows(papers)
    rows += papers
    table = [["plugin", "case", "predicted (SIMULATED or MODELLED)", "measured or published", "error"]]
    table += [[r["plugin"], r["case"], f"{r['predicted']:.3f}", f"{r['measured']:.3f}", f"{r['error']:.3f}"]
              for r in rows]
    table += [[r["plugin"], r["case"], _figure(r["predicted"]), f"headline {r['headline']:g}x (ceiling "
               f"{_figure(r['ceiling'])})", r["plausible"]] for r in headlines]
    table += [[p, why, "-", "-", "-"] for p, why in missing.items()]
    paper_worst = float(max(r["error"] for r in papers))
    headline = {"max_planner_error_cpu": worst, "goal": GOAL,
                "goal_met": None if worst is None else bool(worst <= GOAL), "error_per_plugin": errors,
                "not_compared": missing, "max_paper_error": paper_worst, "paper_goal": PAPER_GOAL,
                "paper_goal_met": paper_worst <= PAPER_GOAL,
                "paper_errors": {r["case"]: r["error"] for r in papers},
                "papers_not_compared": PAPERS_NOT_COMPARED,
                "paper_headlines": {r["case"]: _headline_json(r) for r in headlines}}
    regime = (f"stored results in {args.results}/ (not rerun); predictions SIMULATED or MODELLED by rlweave.plan "
              f"on each run's own setup; measured ratios from the CPU rig; the papers' published inputs [P] where "
              f"given, the rest assumed [A] (each row's inputs)")
    return BenchResult(headline, table, regime, {"rows": rows, "headlines": headlines})


def _compared_panel(ax: object, rows: list[dict]) -> None:
    """Measured or published against predicted, one pair of bars per case, the goal's band
    (the CPU rig's, or the papers') dotted."""
    y = np.arange(len(rows))[::-1]
    ax.barh(y + 0.2, [r["measured"] for r in rows], 0.4, label="measured (CPU rig) or published")
    ax.barh(y - 0.2, [r["predicted"] for r in rows], 0.4, label="predicted (SIMULATED or MODELLED)")
    for i, r in zip(y, rows):
        goal = GOAL if r["kind"] == "cpu" else PAPER_GOAL
        for side in (1 - goal, 1 + goal):
            ax.plot([r["measured"] * side] * 2, [i - 0.4, i + 0.4], "k:", lw=1)
    ax.set_yticks(y, [f"{r['plugin']}: {r['case']}" for r in rows], fontsize=7)
    ax.set_xlabel("ratio (default over the plugin), E_overlap, TP share, MFU or ETTR")
    ax.set_title(f"planner vs CPU rig (dotted: +-{GOAL:.0%}) and vs published inputs (+-{PAPER_GOAL:.0%})",
                 fontsize=9)
    ax.legend(fontsize=7)


def _headline_panel(ax: object, rows: list[dict]) -> None:
    """Each headline-only paper: its headline, the planner's figure under the assumptions, and
    the model's ceiling there (no bar where the model gives none)."""
    y = np.arange(len(rows))[::-1]
    for shift, key, name in ((0.27, "headline", "published headline"),
                             (0.0, "predicted", "planner under [A] inputs (SIMULATED or MODELLED)"),
                             (-0.27, "ceiling", "the model's ceiling there")):
        ax.barh(y + shift, [r[key] or 0.0 for r in rows], 0.27, label=name)
    ax.set_yticks(y, [f"{r['case']}\n({r['plausible']})" for r in rows], fontsize=7)
    ax.set_xlabel("speedup (x)")
    ax.set_title("headline-only papers: plausibility under assumed inputs, no goal", fontsize=9)
    ax.legend(fontsize=7)


def plot(result: BenchResult, path: Path) -> Path:
    """Two panels: the compared rows, then the headline-only papers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, headlines = result.details["rows"], result.details["headlines"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 0.3 * (len(rows) + 2 * len(headlines)) + 3),
                                      gridspec_kw={"height_ratios": [len(rows), 1.6 * len(headlines)]})
    _compared_panel(top, rows)
    _headline_panel(bottom, headlines)
    fig.suptitle("rlweave bench plan (every predicted figure SIMULATED or MODELLED)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # the suptitle's own strip, above the first panel's title
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
