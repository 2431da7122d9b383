"""``python -m rlweave.plan TRACE --cluster FILE``: the recorded job, its predicted step on the
cluster, and what each plugin would buy there, as tables. ``rlweave plan`` calls
:func:`add_arguments` and :func:`run`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from rlweave.plan.cluster import ClusterError, load_cluster
from rlweave.plan.record import NOT_IN_TRACE, JobRecord, RecordError, record
from rlweave.plan.plugins import PLAN_ASSUMPTIONS, PluginPlan, plan_plugins
from rlweave.plan.prediction import PluginPrediction
from rlweave.plan.scale import ASSUMPTIONS, StepPrediction


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("trace", help="a trace directory written by rlweave's tracing plugin")
    parser.add_argument("--cluster", required=True, help="the cluster file (TOML; see docs/plan.md)")
    parser.add_argument("--sample", type=int, default=64,
                        help="generation instances simulated at most (the step is taken from their tail)")
    parser.add_argument("--json", action="store_true", help="print the prediction as one JSON object")
    parser.add_argument("--png", metavar="PATH", help="also draw the plan as one PNG (needs the bench extra)")
    parser.add_argument("--no-sensitivity", action="store_true",
                        help="skip the sensitivity lines (each input moved by 20%% both ways and rerun)")
    return parser


def _table(job: JobRecord, prediction: StepPrediction, seconds: float) -> str:
    recorded = job.stage_s()
    lines = [f"recorded: {job.directory}: {job.steps} steps, {len(job.output_lengths)} requests, "
             f"{len(job.iterations.seconds)} engine iterations on {len(job.engines)} engines",
             f"predicted: verl's default sync step on {prediction.gpus} GPUs, {prediction.instances} generation "
             f"instances x {prediction.requests_per_instance} requests ({prediction.simulated} simulated)",
             f"{'stage':<14}{'recorded s':>12}{'predicted s':>13}  how"]
    for name, figure in prediction.stages.items():
        lines.append(f"{name:<14}{recorded.get(name, float('nan')):>12.3f}{figure.seconds:>13.3f}  {figure.label}")
    lines.append(f"{'step':<14}{sum(recorded.values()):>12.3f}{prediction.step_s:>13.3f}  {prediction.label}")
    lines.append(f"slowest simulated instance {prediction.sample_max_s:.3f} s; planned in {seconds:.1f} s")
    lines.append("assumptions: " + "; ".join(ASSUMPTIONS))
    lines.append("not in the trace (the cluster file states it): " + "; ".join(NOT_IN_TRACE))
    return "\n".join(lines)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _plugin_table(plan: PluginPlan) -> str:
    """One row per plugin and set: step over the default's step, the lower bound's, the default
    step it is compared with; then each row's settings, policies, sensitivity and note."""
    lines = ["", f"per plugin on {plan.baseline.cluster.gpus} GPUs (ratio: predicted step / verl's default step; "
             f"below 1 is faster; every figure SIMULATED or MODELLED as labelled)",
             f"{'plugin':<54}{'ratio':>7}{'bound':>7}{'default s':>11}  how"]
    for r in plan.rows:
        lines.append(f"{r.name:<54}{_figure(r.ratio):>7}{_figure(r.bound_ratio):>7}{r.default_s:>11.2f}  {r.label}")
    for r in plan.rows:
        lines.append(f"- {r.name}: {r.note}")
        if r.settings:
            lines.append("    settings: " + "; ".join(f"{k} = {v}" for k, v in r.settings.items()))
        if r.policies:
            lines.append(f"    policies ({r.label}, over the first): "
                         + "; ".join(f"{k} {v:.3f}" for k, v in r.policies.items()))
        if r.sensitivity:
            lines.append(f"    sensitivity (ratio moves most with): {r.sensitivity}")
    lines.append("plan assumptions: " + "; ".join(PLAN_ASSUMPTIONS))
    return "\n".join(lines)


def _row_json(r: PluginPrediction) -> dict:
    return {"name": r.name, "ratio": r.ratio, "bound_ratio": r.bound_ratio, "step_s": r.step_s,
            "bound_s": r.bound_s, "default_s": r.default_s, "label": r.label, "settings": r.settings,
            "policies": r.policies, "sensitivity": r.sensitivity, "note": r.note}


def _json(prediction: StepPrediction, plan: PluginPlan) -> str:
    return json.dumps({"gpus": prediction.gpus, "instances": prediction.instances,
                       "simulated_instances": prediction.simulated, "step_s": prediction.step_s,
                       "label": prediction.label, "assumptions": ASSUMPTIONS | PLAN_ASSUMPTIONS,
                       "stages": {k: {"seconds": f.seconds, "label": f.label} for k, f in prediction.stages.items()},
                       "plugins": [_row_json(r) for r in plan.rows]}, default=str)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    try:
        cluster = load_cluster(args.cluster)
        job = record(args.trace)
        plan = plan_plugins(job, cluster, sample=args.sample, sensitivity=not args.no_sensitivity)
    except (ClusterError, RecordError) as error:
        print(f"rlweave plan: {error}", file=sys.stderr)
        return 2
    if args.png:
        from rlweave.plan.figure import draw_plan

        try:
            draw_plan(plan, args.png)
        except RuntimeError as error:
            print(f"rlweave plan: {error}", file=sys.stderr)
            return 2
    if args.json:
        print(_json(plan.baseline.step, plan))
    else:
        print(_table(job, plan.baseline.step, time.perf_counter() - start) + "\n" + _plugin_table(plan))
    return 0


def main(argv: list[str]) -> int:
    return run(add_arguments(argparse.ArgumentParser(prog="python -m rlweave.plan")).parse_args(argv))
