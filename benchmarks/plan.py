"""``rlweave bench plan``: the planner's predictions against the CPU rig's stored measurements.

Nothing is rerun: each stored ``bench-results/*.json`` that the planner can read is turned into
the planner's input (the run's own engine model, workload and setup, as its trace would give
them), planned with :mod:`rlweave.plan` on that same setup, and its prediction set beside the
measured ratio: error ``|predicted / measured - 1|``, goal within 0.15 for every plugin
(issue 44). A plugin without a stored measurement, or whose stored JSON holds nothing the
planner reads, gets a row that says so and no error.

Readable today: ``rlweave bench agentic`` (its engine cost model, its seeded workloads, its
instances and slots), compared on verl's makespan over the oracle's (Heddle with true remaining
work; the planner's oracle is presorted placement and longest-remaining-first turns without the
benchmark's migration at tool calls), and on verl's over rlweave's (the plugin with its learned
predictor), for which the planner's figure is its non-clairvoyant index: even placement, turns
by expected remaining turns given those done, learned from the recorded turns. It stands for
Heddle's predictor, which the planner does not run: it knows the turn distribution, not the
prompt's task or its siblings.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.agentic_workload import synthetic
from rlweave.plan import parse_cluster, predict_step
from rlweave.plan.generation import INDEX, ORACLE, predict_agentic, predict_stream
from rlweave.plan.prediction import Baseline
from rlweave.plan.record import Iterations, JobRecord, Trajectory
from rlweave.plan.training import lost_share
from rlweave.plugins.overlap.choose import best
from rlweave.plugins.overlap.model import Shape
from rlweave.plugins.overlap.profiles import BUILTIN
from rlweave.plugins.stream_generation.planner import PlanMode
from rlweave.sim import EngineModel

GOAL = 0.15
PAPER_GOAL = 0.25
PLUGINS = ("stream_generation", "agentic_rollout", "preemptive_serving", "overlap", "resilience", "stage_fusion",
           "replay_balance")
SAME = {"kind": "measured", "bf16_tflops": 1.0, "hbm_tbs": 1.0}  # recorded on the setup it is planned for
SAME_LINKS = {"nvlink_gbs": 1.0, "network_gbs": 1.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default="bench-results", help="folder of stored bench JSON files (read only)")


def _option(argv: list[str], name: str, default: int) -> int:
    return int(argv[argv.index(name) + 1]) if name in argv else default


def _agentic_rows(record: dict, source: str) -> list[dict]:
    """One comparison per workload of a stored ``bench agentic`` run."""
    cost, argv = record["details"]["cost_model"], record.get("argv", [])
    engine = EngineModel(cost["base_s"], cost["per_seq_s"], cost["slots"], cost["prefill_s_per_token"])
    instances = _option(argv, "--instances", 2)
    rows = []
    for name, workload in record["details"]["workloads"].items():
        batch = workload["batches"][0]
        trajs = synthetic(batch["seed"], workload=name)
        lengths = np.array([n for t in trajs for n in t.turn_tokens])
        verl_s = float(np.median(batch["makespan_s"]["verl"]))
        job = JobRecord(source, {1: {"generate": verl_s}}, lengths,
                        Iterations(np.zeros(0, int), np.zeros(0, int), np.zeros(0)),
                        tuple(f"engine{i}" for i in range(instances)), engine.slots, engine,
                        float(np.mean([t.prompt_len for t in trajs])),
                        tuple(Trajectory(t.id, len(t.turn_tokens), float(sum(t.tool_s)), tuple(t.tool_s))
                              for t in trajs))
        cluster = parse_cluster({
            "gpu": SAME | {"count": instances}, "links": SAME_LINKS,
            "model": {"params_b": 1.0, "layers": 1, "hidden": 1},
            "parallelism": {"tp": 1, "pp": 1, "dp": instances, "rollout_tp": 1},
            "recorded": {"gpu": "measured", "gpus": instances, "params_b": 1.0, **SAME_LINKS,
                         "bf16_tflops": 1.0, "hbm_tbs": 1.0},
            "job": {"requests_per_step": len(lengths), "slots": engine.slots}}, source)
        base = Baseline(job, cluster, predict_step(job, cluster))
        policies = predict_agentic(base, instances=instances).policies
        measured = record["headline"][name]
        for case, policy, key in ((f"{name}: verl over oracle", ORACLE, "oracle_makespan_ratio"),
                                  (f"{name}: verl over rlweave (planner: its non-clairvoyant index)", INDEX,
                                   "makespan_ratio")):
            predicted, against = float(1 / policies[policy]), float(measured[key])
            rows.append({"plugin": "agentic_rollout", "kind": "cpu", "case": case, "source": source,
                         "predicted": predicted, "measured": against, "error": abs(predicted / against - 1)})
    return rows


READERS = {"agentic": _agentic_rows}

# verl's fully_async_policy README (verl-project/verl @0351589; shared/research/planner_anchors.md
# section 2.1): H20, Qwen2.5-Math-7B, DAPO, 512 prompts x 16, 28K max response; the colocated sync
# step, its generate / old_log_prob / update_actor, and the fully async step, in seconds
VERL_ASYNC = {32: (790.1, (357.4, 107.7, 269.8), 294.8), 64: (365.3, (150.7, 70.3, 133.4), 189.3),
              128: (356.3, (177.9, 53.9, 113.8), 150.6)}
# [A] what the README does not publish: the response lengths (log-normal, median 3,000 tokens,
# sigma 0.8, cut at 28K), the engine's shape (its speed is calibrated to the published generate
# stage), one instance per GPU of 128 slots; the rest of the sync step (reward and the like) is
# kept as a host stage
PAPER_ASSUMED = "lengths log-normal (median 3,000, sigma 0.8, max 28K), 128 slots, TP 1 [A]"


def _paper_job(gpus: int, engine: EngineModel, lengths: np.ndarray) -> tuple[JobRecord, object]:
    step, (gen, old, update), _ = VERL_ASYNC[gpus]
    stages = {"generate": gen, "old_log_prob": old, "update_actor": update, "reward": step - gen - old - update}
    job = JobRecord("verl fully_async_policy README", {1: stages},
                    lengths, Iterations(np.zeros(0, int), np.zeros(0, int), np.zeros(0)), (), engine.slots, engine,
                    512.0, ())
    cluster = parse_cluster({
        "gpu": {"kind": "H20", "count": gpus}, "model": {"params_b": 7.6, "layers": 28, "hidden": 3584},
        "parallelism": {"tp": 1, "pp": 1, "dp": gpus, "rollout_tp": 1},
        "recorded": {"gpu": "H20", "gpus": gpus, "params_b": 7.6},
        "job": {"requests_per_step": 512 * 16}}, "verl fully_async_policy README")
    return job, cluster


def _paper_rows() -> list[dict]:
    """verl's fully async against its colocated sync step, at 32, 64 and 128 H20s: the planner's
    async stream generation on the published stages, its engine calibrated to the published
    generate stage."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(np.log(3000), 0.8, 512 * 16), 28_000).astype(int) + 1  # one step's
    rows = []
    for gpus, (step, stages, async_s) in VERL_ASYNC.items():
        engine = EngineModel(base_s=0.02, per_seq_s=1e-4, slots=128)
        job, cluster = _paper_job(gpus, engine, lengths)
        simulated = predict_step(job, cluster, sample=16).stages["generate"].seconds
        job, cluster = _paper_job(gpus, engine.scaled(stages[0] / simulated), lengths)
        base = Baseline(job, cluster, predict_step(job, cluster, sample=16))
        p = predict_stream(base, PlanMode.ASYNC)
        measured = step / async_s
        predicted = float(1 / p.ratio) if p.ratio else float("nan")
        rows.append({"plugin": "stream_generation", "kind": "paper",
                     "case": f"verl fully_async, {gpus} H20: sync over async",
                     "source": "verl fully_async_policy README (published inputs; " + PAPER_ASSUMED + ")",
                     "predicted": predicted, "measured": measured, "error": abs(predicted / measured - 1),
                     "settings": p.settings})
    return rows


# MegaScale's production run (12,288 GPUs, ETTR above 90%) with the Llama 3 report's failure rate
# (419 unexpected interruptions on 16,384 GPUs in 54 days: 2.0e-5 per GPU-hour) and MegaScale's
# back-to-progress time of 15 minutes [P]; the snapshot's stall [A] (planner_anchors.md 2.7)
MEGASCALE = {"gpus": 12_288, "gpu_mtbf_hours": 16_384 * 54 * 24 / 419, "recover_s": 15 * 60.0, "snapshot_s": 10.0,
             "step_s": 10.0, "ettr_at_least": 0.90}


def _megascale_row() -> dict:
    """The resilience model's ETTR at MegaScale's scale: published as a floor (above 90%), so the
    error is how far the prediction falls short of it (0 at or above)."""
    m = MEGASCALE
    lost, tau = lost_share(m["snapshot_s"], m["recover_s"], m["gpu_mtbf_hours"] * 3600 / m["gpus"], m["step_s"])
    ettr = 1 / (1 + lost)
    return {"plugin": "resilience", "kind": "paper", "case": "MegaScale ETTR, 12,288 GPUs (at least)",
            "source": "MegaScale (NSDI'24) and the Llama 3 report's failure rate; snapshot stall 10 s, step 10 s [A]",
            "predicted": ettr, "measured": m["ettr_at_least"], "error": max(0.0, 1 - ettr / m["ettr_at_least"]),
            "settings": {"snapshot interval s": round(tau)}}


# FLUX (arXiv 2406.06858) op level, GPT-3 175B shapes at TP 8: AllGather+GEMM (n, k) = (49152,
# 12288), GEMM+ReduceScatter (12288, 49152), m = 1024..8192; the published average E_overlap per
# cluster (papers_flux_megascale.md 1.4). The column shard n / 8 and the row shard k / 8 per GPU
# are read from the shapes [A]; H800 is overlap's H100 profile with NVLink 400 GB/s [R]
FLUX_AVERAGE = {"a100-pcie": 0.40, "a100-nvlink": 0.63, "h800-nvlink": 0.72}


def _flux_rows() -> list[dict]:
    """The overlap plugin's own timeline model (FLUX's tile backend, its best pieces) against
    FLUX's published average E_overlap per cluster."""
    h100 = BUILTIN["h100-nvlink"]
    profiles = {"a100-pcie": BUILTIN["a100-pcie"], "a100-nvlink": BUILTIN["a100-nvlink"],
                "h800-nvlink": replace(h100, name="h800-nvlink", link_bps=h100.link_bps * 400 / 900,
                                       collective_bps=h100.collective_bps * 400 / 900)}
    rows = []
    for name, published in FLUX_AVERAGE.items():
        shapes = [s for m in (1024, 2048, 4096, 8192)
                  for s in (Shape("ag_gemm", m, 49152 // 8, 12288, 8), Shape("gemm_rs", m, 12288, 49152 // 8, 8))]
        predicted = float(np.mean([best(profiles[name], s, "tile", 8).e_overlap for s in shapes]))
        rows.append({"plugin": "overlap", "kind": "paper", "case": f"FLUX average E_overlap, {name}",
                     "source": "FLUX op-level table (GPT-3 175B shapes, TP 8); overlap's built-in profiles",
                     "predicted": predicted, "measured": published, "error": abs(predicted / published - 1),
                     "settings": {}})
    return rows


def run(args: argparse.Namespace) -> BenchResult:
    rows: list[dict] = []
    for path in sorted(Path(args.results).glob("*.json")):
        record = json.loads(path.read_text())
        reader = READERS.get(record.get("benchmark", ""))
        if reader:
            rows += reader(record, str(path))
    compared = {r["plugin"] for r in rows}
    missing = {p: "no stored CPU-rig result the planner reads" for p in PLUGINS if p not in compared}
    errors = {p: float(max(r["error"] for r in rows if r["plugin"] == p)) for p in compared}
    worst = max(errors.values(), default=None)
    papers = [*_paper_rows(), *_flux_rows(), _megascale_row()]
    rows += papers
    table = [["plugin", "case", "predicted (SIMULATED or MODELLED)", "measured or published", "error"]]
    table += [[r["plugin"], r["case"], f"{r['predicted']:.3f}", f"{r['measured']:.3f}", f"{r['error']:.3f}"]
              for r in rows]
    table += [[p, why, "-", "-", "-"] for p, why in missing.items()]
    paper_worst = float(max(r["error"] for r in papers))
    headline = {"max_planner_error_cpu": worst, "goal": GOAL,
                "goal_met": None if worst is None else bool(worst <= GOAL), "error_per_plugin": errors,
                "not_compared": missing, "max_paper_error": paper_worst, "paper_goal": PAPER_GOAL,
                "paper_goal_met": paper_worst <= PAPER_GOAL,
                "papers_not_compared": "FLUX's model-level table, MegaScale's MFU, the headline-only papers "
                                       "(docs/plan.md, Not built yet)"}
    regime = (f"stored results in {args.results}/ (not rerun) and verl's published fully-async table; predictions "
              f"SIMULATED by rlweave.plan on each run's own setup; measured ratios from the CPU rig; "
              f"published inputs where given, {PAPER_ASSUMED}")
    return BenchResult(headline, table, regime, {"rows": rows})


def plot(result: BenchResult, path: Path) -> Path:
    """Predicted against measured, one pair of bars per case, the goal's band drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.details["rows"]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(rows) + 2), 3.6))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["measured"] for r in rows], 0.4, label="measured (CPU rig) or published")
    ax.bar(x + 0.2, [r["predicted"] for r in rows], 0.4, label="predicted (SIMULATED)")
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [r["measured"] * (1 - GOAL)] * 2, "k:", lw=1)
        ax.plot([i - 0.4, i + 0.4], [r["measured"] * (1 + GOAL)] * 2, "k:", lw=1)
    ax.set_xticks(x, [f"{r['plugin']}\n{r['case']}" for r in rows], fontsize=7)
    ax.set_ylabel("ratio (verl's default over the plugin); ETTR")
    ax.set_title(f"rlweave bench plan: planner vs CPU rig (dotted: +-{GOAL:.0%}) and papers")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
