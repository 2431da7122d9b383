"""``rlweave bench overlap``: FLUX's overlapped TP linears.

What a CPU can show and what it cannot:
- ``cpu_equal``: Megatron's ColumnParallelLinear / RowParallelLinear and rlweave's (built by the
  same classes a user's spec gets, through the overlap plugin with ``backend=ring``), TP=2 on
  gloo, same weights and input: outputs and gradients equal (fp32). Their forward+backward times
  are reported too, and mean nothing as overlap figures: both cores compute, and gloo's
  loopback copies need the same cores.
- ``e_overlap_model`` (MODELLED, not measured): the timeline model's ECT and E_overlap for the
  TP8 linears of a 70B-class layer (hidden 8192, 64 heads with 8 KV heads, gated ffn 28672),
  forward and input-gradient collectives, at m = 2048, 4096, 8192 tokens, for the sequential
  baseline (NCCL then the fastest GEMM), the decomposed ring, torch's symm_mem pipeline and the
  tile kernels, on the GPU profile (the measured one in ``bench-results/overlap-profile-h200.json``
  when the GPU check wrote it, else the built-in estimate); plus the profile measured on this CPU.
- ``gpu``: the summary of ``bench-results/overlap-gpu.json`` (scripts/gpu_check_overlap.sh,
  one H200, emulated ranks) when present, else null.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlweave.benchmarks import BenchResult
from rlweave.plugins.overlap.choose import best, shapes
from rlweave.plugins.overlap.model import DeviceProfile, predict
from rlweave.plugins.overlap.profiles import BUILTIN, dump, load
from rlweave.types import LinearInfo, TPDevice

CPU_TIMINGS = ("CPU timings of overlap mean nothing here: both cores compute, and gloo's loopback "
               "copies need the same cores")
# (name, kind, input_size, output_size) of one 70B-class layer (Llama-2-70B dimensions).
LAYER_70B = (("qkv", "column", 8192, 8192 + 2 * 1024), ("proj", "row", 8192, 8192),
             ("fc1", "column", 8192, 2 * 28672), ("fc2", "row", 28672, 8192))
GPU_DEVICE = TPDevice("NVIDIA H200", "nccl", ("ring", "symm_mem", "tile"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--gpu-results", type=Path, default=Path("bench-results/overlap-gpu.json"))
    parser.add_argument("--gpu-profile", default=None,
                        help="profile for the model (default: bench-results/overlap-profile-h200.json if present, "
                             "else the built-in h200-nvlink estimate)")
    parser.add_argument("--skip-cpu", action="store_true", help="model and GPU summary only")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_part(out_dir: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE")}
    env.update(RLWEAVE__OVERLAP__ENABLE="true", RLWEAVE__OVERLAP__BACKEND="ring",
               RLWEAVE__OVERLAP__CHUNKS_PER_RANK="2")
    with tempfile.TemporaryDirectory() as tmp, open(out_dir / "overlap-cpu.log", "w") as log:
        subprocess.run([sys.executable, "-W", "ignore", "-m", "rlweave.benchmarks.overlap_cpu", "2", tmp,
                        str(_free_port())], env=env, check=True, timeout=600, stdout=log, stderr=log)
        return json.loads(Path(tmp, "overlap-cpu.json").read_text())


def cpu_profile(measured: dict[str, Any]) -> DeviceProfile:
    """The timeline model's profile of this CPU from the worker's GEMM and gloo timings."""
    gemm = {int(m): t for m, t in measured["gemm_s_by_m_512x512"].items()}
    link = {int(b): t for b, t in measured["exchange_s_by_bytes"].items()}
    (m0, t0), (m1, t1) = min(gemm.items()), max(gemm.items())
    per_row = (t1 - t0) / (m1 - m0)
    flops = 2 * 512 * 512 / per_row
    half_rows = max(0.0, (t0 / per_row) - m0)
    (b0, l0), (b1, l1) = min(link.items()), max(link.items())
    bps = (b1 - b0) / max(l1 - l0, 1e-9)
    base = BUILTIN["cpu-gloo"]
    return DeviceProfile("cpu-gloo-measured", "rlweave bench overlap (this machine, gloo loopback)", flops,
                         half_rows, base.launch_s, bps, max(l0 - b0 / bps, 0.0), bps, base.memory_bps,
                         base.overlap_slowdown, 1.0, 1)


def layer_model(profile: DeviceProfile, tp: int, tokens: list[int]) -> dict[str, Any]:
    """Per linear and direction, ECT and E_overlap of each method; and the whole layer's."""
    methods = {"decomposed": "ring", "symm_mem": "symm_mem", "tile": "tile"}
    out: dict[str, Any] = {}
    for m in tokens:
        per_op, ect = {}, {name: 0.0 for name in ("sequential", *methods)}
        for name, kind, k_in, n_out in LAYER_70B:
            info = LinearInfo(kind, k_in, n_out, tp, 0, True, m, 2, GPU_DEVICE)
            for direction, shape in zip(("fwd", "bwd"), shapes(info)):
                seq = predict(profile, shape, "sequential")
                row = {"sequential_ect_ms": seq.ect_s * 1e3}
                ect["sequential"] += seq.ect_s
                for label, backend in methods.items():
                    p = best(profile, shape, backend, 8)
                    row[label] = {"chunks": p.chunks_per_rank, "ect_ms": p.ect_s * 1e3,
                                  "e_overlap": round(p.e_overlap, 3)}
                    ect[label] += p.ect_s
                per_op[f"{name}.{direction} ({shape.op} m={m} n={shape.n} k={shape.k})"] = row
        out[f"m={m}"] = {"ops": per_op, "layer_e_overlap": {
            label: round(1 - ect[label] / ect["sequential"], 3) for label in methods}}
    return out


def gpu_summary(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    rows = {f"{r['op']}@{r['m']}": {v: {"e_overlap": round(r[v]["e_overlap"], 3),
                                        "model_e_overlap": round(r[v]["model_e_overlap"], 3),
                                        "ect_ms": round(r[v]["ect_s"] * 1e3, 4),
                                        "model_ect_ms": round(r[v]["model_ect_s"] * 1e3, 4)}
                                    for v in ("decomposed", "tile")} for r in data["rows"]}
    return {"file": str(path), "date": data["date"], "device": data["device"], "statement": data["statement"],
            "results_equal_cublas": data["results_equal_cublas"], "link": data["link"], "rows": rows}


def run(args: argparse.Namespace) -> BenchResult:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = args.gpu_profile or (str(out_dir / "overlap-profile-h200.json")
                                if (out_dir / "overlap-profile-h200.json").is_file() else "h200-nvlink")
    gpu_profile = load(spec, "NVIDIA H200")
    model = layer_model(gpu_profile, args.tp, args.tokens)
    details: dict[str, Any] = {"model_profile": gpu_profile.__dict__, "model": model}
    headline: dict[str, Any] = {"cpu_equal": None, "e_overlap_model": {
        "simulated": True, "profile": gpu_profile.name, "tp": args.tp,
        "layer": {k: v["layer_e_overlap"] for k, v in model.items()}}, "gpu": gpu_summary(args.gpu_results),
        "cpu_timings": CPU_TIMINGS}
    rows = [["m", "op", "sequential ECT ms", "decomposed E", "symm_mem E", "tile E"]]
    for key, entry in model.items():
        for op, r in entry["ops"].items():
            rows.append([key, op, f"{r['sequential_ect_ms']:.3f}", f"{r['decomposed']['e_overlap']:.2f}",
                         f"{r['symm_mem']['e_overlap']:.2f}", f"{r['tile']['e_overlap']:.2f}"])
        e = entry["layer_e_overlap"]
        rows.append([key, "layer (MODELLED)", "", f"{e['decomposed']:.2f}", f"{e['symm_mem']:.2f}", f"{e['tile']:.2f}"])
    if not args.skip_cpu:
        cpu = cpu_part(out_dir)
        equal = cpu["equal"]
        headline["cpu_equal"] = equal["max_abs_diff"] <= 1e-5 and "ring" in equal["column_plans"] + equal["row_plans"]
        headline["cpu_max_abs_diff"] = equal["max_abs_diff"]
        profile = cpu_profile(cpu["profile"])
        dump(profile, out_dir / "overlap-profile-cpu.json")
        details["cpu"] = cpu | {"profile_fitted": profile.__dict__}
        med = equal["median_s"]
        rows.append(["cpu TP2", "fwd+bwd both linears (meaningless as overlap)",
                     f"megatron {med['megatron'] * 1e3:.2f} ms", f"rlweave ring {med['rlweave'] * 1e3:.2f} ms", "", ""])
    regime = ("CPU: TP=2 gloo, fp32, equality and timings (not an overlap measurement); model: TP8 70B-class "
              f"layer on {gpu_profile.name} ({gpu_profile.source}), SIMULATED; gpu: one H200 with emulated ranks")
    return BenchResult(headline, rows, regime, details)


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = result.details["model"]
    gpu = result.headline.get("gpu")
    fig, axes = plt.subplots(1, 2 if gpu else 1, figsize=(11 if gpu else 6, 4), squeeze=False)
    ax = axes[0][0]
    ms = [int(k.split("=")[1]) for k in model]
    for label, color in (("decomposed", "tab:orange"), ("symm_mem", "tab:blue"), ("tile", "tab:green")):
        ax.plot(ms, [model[f"m={m}"]["layer_e_overlap"][label] for m in ms], "o-", color=color, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (m)")
    ax.set_ylabel("E_overlap of the layer (MODELLED)")
    ax.set_title(f"70B-class layer, TP8, {result.details['model_profile']['name']} (simulated)")
    ax.legend(fontsize=8)
    if gpu:
        ax = axes[0][1]
        for op, marker in (("ag_gemm", "o"), ("gemm_rs", "s")):
            keys = sorted((k for k in gpu["rows"] if k.startswith(op)), key=lambda k: int(k.split("@")[1]))
            xs = [int(k.split("@")[1]) for k in keys]
            for v, color in (("decomposed", "tab:orange"), ("tile", "tab:green")):
                ax.plot(xs, [gpu["rows"][k][v]["e_overlap"] for k in keys], marker + "-", color=color,
                        label=f"{op} {v}")
                ax.plot(xs, [gpu["rows"][k][v]["model_e_overlap"] for k in keys], marker + ":", color=color, alpha=0.5)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{gpu['device']}: measured (solid), model (dotted), emulated ranks")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
