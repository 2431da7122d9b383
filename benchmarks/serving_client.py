"""``rlweave bench serving --client vllm``: measured the way a vLLM user measures.

For each length distribution, ``vllm serve`` of the tiny Llama (``max_num_seqs`` slots,
``VLLM_CPU_KVCACHE_SPACE=1``), started without and with ``RLWEAVE__PREEMPTIVE_SERVING__ENABLE``
(rlweave's default adaptive policy), is driven by vLLM's own benchmark client
(``vllm.benchmarks.serve``; vllm-cpu 0.32's ``vllm`` console script cannot find a ``vllm``
distribution, so both run as modules). Each server first takes a saturation pass (the same for
both: it warms the server, and the first FCFS one gives the capacity that sets the rate), then
the measured run: Poisson arrivals at ``--client-load`` of that capacity, ``--ignore-eos``,
TTFT, TPOT and end-to-end latency at p50, p95 and p99. Runs interleave FCFS and rlweave and
repeat (``--repeats``). Server logs go to ``<out>/serving-vllm-logs/``; the regime the plugin
logged is reported beside its figures.

Workloads: ``near-uniform`` (vLLM's random dataset, input 64, output 96, range ratio 0.1:
outputs 86-106), ``uniform`` (the same with range ratio 0.9: outputs 9-183, vLLM's ranges are
``[L*(1-r), L*(1+r)]``) and ``heavy`` (a custom JSONL dataset with the heavy-tailed lengths of
``bench serving``: lognormal prompts and outputs).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult

WORKLOADS = ("near-uniform", "uniform", "heavy")
SERVERS = {"fcfs": {}, "rlweave": {"RLWEAVE__PREEMPTIVE_SERVING__ENABLE": "true"}}
LABELS = {"fcfs": "vllm serve (FCFS)", "rlweave": "vllm serve + rlweave"}
METRICS = ("ttft", "tpot", "e2el")
STATS = ("mean", "p50", "p95", "p99")
# vLLM's benchmark client, run as a module (its console script is broken on vllm-cpu 0.32).
CLIENT = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
          "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
          "p = FlexibleArgumentParser()\nadd_cli_args(p)\nmain(p.parse_args(sys.argv[1:]))\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--client-requests", type=int, default=200, help="--client vllm: requests per run")
    parser.add_argument("--client-load", type=float, default=0.95,
                        help="--client vllm: Poisson rate as a fraction of FCFS's saturation throughput")
    parser.add_argument("--client-workloads", default=",".join(WORKLOADS),
                        help=f"--client vllm: length distributions ({', '.join(WORKLOADS)})")


def dataset_args(workload: str, folder: Path, n: int, seed: int) -> tuple[list[str], float]:
    """vLLM client arguments for ``workload`` and its mean output length."""
    if workload in ("near-uniform", "uniform"):
        ratio = 0.1 if workload == "near-uniform" else 0.9
        return (["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "96",
                 "--random-range-ratio", str(ratio)], 96.0)
    from rlweave.benchmarks.serving import synthetic_workload

    if importlib.util.find_spec("pandas") is None:
        raise RuntimeError("the heavy workload is a custom JSONL dataset, which vLLM's benchmark "
                           "client reads with pandas: pip install pandas into the vLLM environment "
                           "(scripts/setup_envs.sh vllm does)")
    rows = synthetic_workload(n, seed, "heavy")
    words = "what is 12 plus 34 ? the answer is 46 .".split()
    path = folder / "heavy.jsonl"
    path.write_text("".join(json.dumps({"prompt": " ".join(words[j % len(words)] for j in range(r["prompt_len"])),
                                        "output_tokens": r["output_len"]}) + "\n" for r in rows))
    return (["--dataset-name", "custom", "--dataset-path", str(path), "--custom-output-len", "-1",
             "--skip-chat-template", "--disable-shuffle"], float(np.mean([r["output_len"] for r in rows])))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(env: dict[str, str], model: str, slots: int, log: Path, timeout_s: float = 400) -> Iterator[str]:
    """``vllm serve`` (as its module) on a free port, logging to ``log``; yields the base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "tiny-llama", "--max-model-len", "512", "--max-num-seqs", str(slots),
           "--seed", "0", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            if time.time() > deadline:
                raise RuntimeError(f"vllm serve did not become healthy in {timeout_s:.0f} s; see {log}")
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def client(url: str, model: str, data: list[str], n: int, rate: float, seed: int, result: Path, log: Path) -> dict:
    """One run of vLLM's benchmark client; returns its result JSON."""
    cmd = [sys.executable, "-c", CLIENT, "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", "tiny-llama", "--tokenizer", model, *data, "--num-prompts", str(n),
           "--request-rate", "inf" if rate == float("inf") else f"{rate:.3f}", "--seed", str(seed),
           "--ignore-eos", "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,95,99",
           "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
           "--disable-tqdm"]
    with open(log, "a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM's benchmark client failed ({proc.returncode}); see {log}")
    return json.loads(result.read_text())


def regime_lines(log: Path) -> list[str]:
    return re.findall(r"believes lengths are ([a-z -]+) \(", log.read_text()) if log.exists() else []


def run(args: argparse.Namespace) -> BenchResult:
    from tqdm import tqdm

    from rlweave.tiny_models import ensure_tiny_model

    seed = getattr(args, "seed", 0) or 0
    workloads = [w.strip() for w in args.client_workloads.split(",") if w.strip()]
    if not workloads or any(w not in WORKLOADS for w in workloads):
        raise SystemExit(f"--client-workloads {args.client_workloads}: choose from {', '.join(WORKLOADS)}")
    model = str(ensure_tiny_model("tiny-llama"))
    logs = Path(getattr(args, "out", "bench-results")) / "serving-vllm-logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    results: dict[str, Any] = {}
    plan = [(w, r, s) for w in workloads for r in range(args.repeats) for s in SERVERS]
    bar = tqdm(plan, desc="vllm serve runs (interleaved)", file=sys.stderr)
    for workload, rep, name in bar:
        entry = results.setdefault(workload, {"runs": {s: [] for s in SERVERS}, "regimes": [], "errors": []})
        tag = f"{workload}-{name}-{rep}"
        try:
            data, mean_out = dataset_args(workload, logs, args.client_requests, seed)
            with server(base | SERVERS[name], model, args.max_num_seqs, logs / f"server-{tag}.log") as url:
                warm = client(url, model, data, 64, float("inf"), seed + 1, logs / f"warm-{tag}.json",
                              logs / f"client-{tag}.log")
                if "rate_req_s" not in entry:  # the first FCFS saturation pass sets the rate
                    entry["capacity_tokens_per_s"] = warm["output_throughput"]
                    entry["rate_req_s"] = args.client_load * warm["output_throughput"] / mean_out
                out = client(url, model, data, args.client_requests, entry["rate_req_s"], seed,
                             logs / f"run-{tag}.json", logs / f"client-{tag}.log")
            entry["runs"][name].append({f"{s}_{m}_ms": out.get(f"{s}_{m}_ms") for m in METRICS for s in STATS}
                                       | {"output_throughput": out["output_throughput"],
                                          "completed": out["completed"]})
            if name == "rlweave":
                entry["regimes"].append(regime_lines(logs / f"server-{tag}.log"))
        except (RuntimeError, subprocess.TimeoutExpired) as error:  # report the other runs
            entry["errors"].append(f"{tag}: {error}")
            print(f"bench serving --client vllm: {tag} failed: {error}", file=sys.stderr)
    return report(args, results, logs)


def summary(runs: list[dict], key: str) -> dict[str, float] | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return ({"median": statistics.median(values), "min": min(values), "max": max(values)}
            if values else None)


def report(args: argparse.Namespace, results: dict[str, Any], logs: Path) -> BenchResult:
    rows = [["workload: metric (ms)", LABELS["fcfs"], LABELS["rlweave"], "FCFS / rlweave (>1: rlweave better)"]]
    headline: dict[str, Any] = {"client": "vllm", "load": args.client_load}
    for workload, entry in results.items():
        runs = entry["runs"]
        entry["summary"] = {s: {k: summary(runs[s], k) for k in (runs[s][0] if runs[s] else {})} for s in SERVERS}
        pairs = list(zip(runs["fcfs"], runs["rlweave"]))
        entry["ratios"] = {f"{s}_{m}": summary([{"r": f[f"{s}_{m}_ms"] / o[f"{s}_{m}_ms"]} for f, o in pairs
                                               if f.get(f"{s}_{m}_ms") and o.get(f"{s}_{m}_ms")], "r")
                           for m in METRICS for s in STATS}
        for m in METRICS:
            for s in STATS:
                cells = [entry["summary"][p].get(f"{s}_{m}_ms") for p in SERVERS]
                ratio = entry["ratios"][f"{s}_{m}"]
                rows.append([f"{workload}: {m} {s}", *(_fmt(c) for c in cells), _fmt(ratio, 2, "x")])
        thr = [entry["summary"][p].get("output_throughput") for p in SERVERS]
        rows.append([f"{workload}: output tokens/s", *(_fmt(c, 0) for c in thr), "-"])
        regimes = sorted({r[-1] for r in entry["regimes"] if r})
        rows.append([f"{workload}: rate req/s / rlweave's last regime", f"{entry.get('rate_req_s', 0):.1f}",
                     ", ".join(regimes) or "-", "; ".join(entry["errors"]) or "-"])
        for key in ("mean_e2el", "p95_e2el", "mean_ttft", "mean_tpot"):
            if entry["ratios"][key]:
                headline[f"{workload}_{key}_ratio"] = round(entry["ratios"][key]["median"], 3)
    regime = (f"vllm serve (OpenAI API server module) of tiny-llama bf16 eager, max_num_seqs={args.max_num_seqs}, "
              f"VLLM_CPU_KVCACHE_SPACE=1, with and without RLWEAVE__PREEMPTIVE_SERVING__ENABLE=true; "
              f"vLLM's benchmark client (vllm.benchmarks.serve) on the same 2-core machine, "
              f"{args.client_requests} requests, Poisson at {args.client_load} of the FCFS saturation "
              f"throughput, ignore_eos; {args.repeats} interleaved run(s) per server, medians [min-max]; "
              f"server logs in {logs}")
    return BenchResult(headline, rows, regime, details={"client": "vllm", "workloads": results,
                                                         "max_num_seqs": args.max_num_seqs})


def _fmt(m: dict[str, float] | None, digits: int = 1, unit: str = "") -> str:
    if m is None:
        return "-"
    one = f"{m['median']:.{digits}f}{unit}"
    return one if m["min"] == m["max"] else f"{one} [{m['min']:.{digits}f}-{m['max']:.{digits}f}]"


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = result.details["workloads"]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(13, 3.8))
    width = 0.38
    names = list(workloads)
    for ax, metric in zip(axes, METRICS):
        for k, stat in enumerate(("mean", "p95", "p99")):
            for j, server_name in enumerate(SERVERS):
                vals = [(workloads[w]["summary"][server_name].get(f"{stat}_{metric}_ms") or {}).get("median", 0)
                        for w in names]
                xs = np.arange(len(names)) * 3 + k + (j - 0.5) * width
                ax.bar(xs, vals, width, color=("tab:grey", "tab:orange")[j],
                       label=LABELS[server_name] if k == 0 else None, alpha=(1.0, 0.7, 0.45)[k])
        ax.set_xticks(np.arange(len(names)) * 3 + 1)
        ax.set_xticklabels([f"{w}\nmean/p95/p99" for w in names], fontsize=8)
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(metric.upper())
    axes[0].legend(fontsize=8)
    fig.suptitle("bench serving --client vllm: vllm serve with and without rlweave, vLLM's benchmark client")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
