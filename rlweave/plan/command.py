"""``python -m rlweave.plan TRACE --cluster FILE``: the recorded job and its predicted step on
the cluster, as a table. ``rlweave plan`` calls :func:`add_arguments` and :func:`run`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from rlweave.plan.cluster import ClusterError, load_cluster
from rlweave.plan.record import NOT_IN_TRACE, JobRecord, RecordError, record
from rlweave.plan.scale import ASSUMPTIONS, StepPrediction, predict_step


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("trace", help="a trace directory written by rlweave's tracing plugin")
    parser.add_argument("--cluster", required=True, help="the cluster file (TOML; see docs/plan.md)")
    parser.add_argument("--sample", type=int, default=64,
                        help="generation instances simulated at most (the step is taken from their tail)")
    parser.add_argument("--json", action="store_true", help="print the prediction as one JSON object")
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


def _json(prediction: StepPrediction) -> str:
    return json.dumps({"gpus": prediction.gpus, "instances": prediction.instances,
                       "simulated_instances": prediction.simulated, "step_s": prediction.step_s,
                       "label": prediction.label, "assumptions": ASSUMPTIONS,
                       "stages": {k: {"seconds": f.seconds, "label": f.label} for k, f in prediction.stages.items()}})


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    try:
        cluster = load_cluster(args.cluster)
        job = record(args.trace)
        prediction = predict_step(job, cluster, sample=args.sample)
    except (ClusterError, RecordError) as error:
        print(f"rlweave plan: {error}", file=sys.stderr)
        return 2
    print(_json(prediction) if args.json else _table(job, prediction, time.perf_counter() - start))
    return 0


def main(argv: list[str]) -> int:
    return run(add_arguments(argparse.ArgumentParser(prog="python -m rlweave.plan")).parse_args(argv))
