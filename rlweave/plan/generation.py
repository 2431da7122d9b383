"""Per-plugin predictions on the generation side: StreamRL's pools (stream_generation), Heddle's
placement and priority (agentic_rollout), FastServe's preemptive queue (preemptive_serving).

Each runs the plugin's own planner or the plugin's own placement on :mod:`rlweave.sim` (one
model, no other simulator) on a *slice* of the cluster (assumption ``slice``): a few instances
with their share of the step's requests, simulated whole; the slice's ratio of the plugin's step
to the default's is applied to verl's default step on the whole cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlweave.plan.prediction import UPDATE_STAGES, Baseline, PluginPrediction, no_prediction
from rlweave.plugins.agentic_rollout.placement import TrajectoryLoad, presorted_balance
from rlweave.plugins.stream_generation.planner import (
    FullyAsync,
    GenerationProfile,
    HardwarePool,
    PlanError,
    PlanMode,
    TrainingProfile,
    Workload,
    plan,
)
from rlweave.plugins.preemptive_serving.options import PreemptiveServingConfig
from rlweave.plugins.preemptive_serving.scheduler import PreemptiveScheduler
from rlweave.sim import (
    ArrivalOrder,
    EngineModel,
    KeepRunning,
    Request,
    ShortestRemaining,
    ShortestRemainingPreempts,
    Simulator,
)
from rlweave.sim.deciding import DecidedSimulator
from rlweave.sim.learned import ExpectedRemaining
from rlweave.sim.trajectories import Trajectory, run_trajectories
from rlweave.types import EngineInfo, RequestView

SIMULATED = "SIMULATED"
SLICE_INSTANCES = 8  # generation instances in a slice (fewer where the cluster has fewer)
# async's slice: StreamRL's async simulation grows with the square of the slice's requests
ASYNC_SLICE_INSTANCES = 4
MINIBATCHES = 4  # assumption minibatches: verl's default train batch over its ppo mini batch
GROUP = 8  # assumption groups: responses per prompt (GRPO's n), which StreamRL dispatches together


def _slice_devices(base: Baseline, instances: int = SLICE_INSTANCES) -> int:
    """A slice of whole generation instances and whole training replicas (tp x pp)."""
    par = base.cluster.parallelism
    unit = math.lcm(par.rollout_tp, par.tp * par.pp)
    return min(base.cluster.gpus, unit * max(1, instances * par.rollout_tp // unit))


def _profile(base: Baseline) -> GenerationProfile:
    """The target engine as StreamRL's throughput table (prefill amortized over tokens)."""
    slots = base.step.engine.slots
    batches = sorted({*(2 ** i for i in range(int(math.log2(slots)) + 1)), slots})
    return GenerationProfile(tuple(batches), tuple(b / base.effective_iteration_s(b) for b in batches),
                             devices=base.cluster.parallelism.rollout_tp)


def predict_stream(base: Baseline, mode: PlanMode = PlanMode.ON_POLICY, seed: int = 0, instances: int | None = None,
                   train_factor: float = 1.0, default_train_factor: float = 1.0,
                   default_s: float | None = None, policy: FullyAsync | None = None,
                   group: int = GROUP) -> PluginPrediction:
    """StreamRL's planner on a slice of ``instances`` generation instances: the best split into
    generation and training instances in ``mode``, against its own colocated (verl's sync)
    prediction of the same slice, whose ratio is applied to ``default_s`` (verl's default step).
    A composable set scales the training stages by ``train_factor`` with the plugin and by
    ``default_train_factor`` in the default (overlap's TP collectives, hidden and exposed).
    ``fully_async`` (verl's ``fully_async_policy``, settings ``policy``) trains on the rollout's
    log-probs, as verl's does by default: its training pool has no ``old_log_prob`` stage.
    ``group``: responses per prompt (assumption ``groups``)."""
    name = f"stream_generation ({mode.value})"
    c, par = base.cluster, base.cluster.parallelism
    default_s = base.step.step_s if default_s is None else default_s
    devices = _slice_devices(base, instances or (ASYNC_SLICE_INSTANCES if mode is PlanMode.ASYNC else SLICE_INSTANCES))
    requests = group * max(MINIBATCHES, round(base.step.requests_per_instance * devices / par.rollout_tp / group))
    host = base.seconds("reward", "adv")
    if base.train_s + host <= 0:
        return no_prediction(name, default_s, "the trace holds no training stage to overlap generation with")
    replica = par.tp * par.pp
    rng = np.random.default_rng(seed)
    lengths = rng.choice(base.job.output_lengths, requests).reshape(-1, group)
    workload = Workload(lengths, max(1, len(lengths) // MINIBATCHES), weight_sync_s=base.seconds("weight_sync"))
    skipped = base.seconds("old_log_prob") if mode is PlanMode.FULLY_ASYNC else 0.0

    def pool(factor: float, skip: float = 0.0) -> HardwarePool:
        train_s = (base.train_s - skip) * factor + host
        per_sample = train_s * devices / (requests * replica)  # each replica trains its share in train_s
        deferred = base.seconds(*UPDATE_STAGES) * factor / train_s
        return HardwarePool("gpu", devices, _profile(base), TrainingProfile(per_sample, replica, deferred))

    try:
        colocated = plan([pool(default_train_factor)], workload, PlanMode.COLOCATED)
        best = plan([pool(train_factor, skipped)], workload, mode, policy=policy)
    except (PlanError, RuntimeError) as error:  # RuntimeError: simulate_async found no steady step
        return no_prediction(name, default_s, f"StreamRL's planner: {error}")
    gen_devices, train_devices = best.devices["gpu"]
    engine = base.step.engine
    work = (lengths.sum() * base.effective_iteration_s(engine.slots) / engine.slots * par.rollout_tp
            + (base.train_s - skipped + host) * devices) / devices + workload.weight_sync_s  # every GPU busy, no comm
    scale = default_s / colocated.step_s
    share = c.gpus / devices
    settings = {"generation_gpus": round(gen_devices * share), "training_gpus": round(train_devices * share),
                "generation_instances": round(best.generation.get("gpu", 0) * share),
                "slice": f"{devices} GPUs, {requests} requests"}
    return PluginPrediction(name, default_s, best.step_s * scale, work * scale, SIMULATED, settings,
                            f"StreamRL's planner on a slice of {devices} GPUs; its colocated step is verl's")


def _trajectories(base: Baseline, count: int, rng: np.random.Generator) -> list[Trajectory]:
    """``count`` trajectories like the recorded ones: turns and tool gaps of a recorded trajectory
    (its gaps as recorded, each after its own turn; spread evenly where the trace has only their
    sum), each turn's tokens drawn from the recorded lengths (assumption ``turn-lengths``)."""
    recorded = base.job.trajectories
    prompt = int(round(base.job.mean_prompt_tokens))
    out = []
    for k in rng.integers(len(recorded), size=count):
        t = recorded[k]
        turns = max(t.turns, 1)
        gaps = t.gaps if len(t.gaps) == turns - 1 else ()
        out.append(Trajectory(tuple(int(n) for n in rng.choice(base.job.output_lengths, turns)),
                              t.tool_s / max(turns - 1, 1), prompt, gaps))
    return out


ORACLE = "Heddle oracle (presorted, longest remaining)"
INDEX = "non-clairvoyant (even, expected remaining turns)"
VERL = "verl (even, FCFS)"


def _agentic_makespans(base: Baseline, trajs: list[Trajectory], turns: np.ndarray, engines: int) -> dict[str, float]:
    """The slice's makespan under verl's balancer, the learned index and Heddle's oracle."""
    engine = base.step.engine
    even = [k % engines for k in range(len(trajs))]
    loads = [TrajectoryLoad(str(k), float(sum(t.turns)), t.tool_left(0)) for k, t in enumerate(trajs)]
    heddle = presorted_balance(loads, [str(e) for e in range(engines)], engine, {})
    placed = [int(heddle[str(k)]) for k in range(len(trajs))]
    full = base.effective_iteration_s(engine.slots)  # a token of a busy engine
    learned = ExpectedRemaining(turns)

    def oracle(k: int, done: int) -> float:
        t = trajs[k]
        return -(sum(t.turns[done:]) * full + t.tool_left(done))

    return {VERL: run_trajectories(trajs, engine, even, engines).max(),
            INDEX: run_trajectories(trajs, engine, even, engines, lambda k, done: -learned.expected(done)).max(),
            ORACLE: run_trajectories(trajs, engine, placed, engines, oracle).max()}


BOUND = "bound"
# agentic slices are drawn until they hold this many trajectories in all (at most MAX_DRAWS slices),
# and the plan takes each figure's median: one slice's ratio hangs on where its few deepest
# trajectories land (on bench agentic's depth-mix, 96 trajectories, one draw gives 1.15 to 1.45)
AGENTIC_TRAJECTORIES = 512
MAX_DRAWS = 9


def _agentic_draw(base: Baseline, count: int, engines: int, turns: np.ndarray,
                  rng: np.random.Generator) -> dict[str, float]:
    """One drawn slice: each policy's makespan over verl's, and the bound's (:data:`BOUND`)."""
    trajs = _trajectories(base, count, rng)
    figures = _agentic_makespans(base, trajs, turns, engines)
    engine = base.step.engine
    critical = max(sum(t.turns) * engine.iteration_s(1) + t.tool_left(0) for t in trajs)
    work = sum(sum(t.turns) for t in trajs) * base.effective_iteration_s(engine.slots) / engine.slots / engines
    return {k: v / figures[VERL] for k, v in figures.items()} | {BOUND: max(critical, work) / figures[VERL]}


def predict_agentic(base: Baseline, seed: int = 0, instances: int = SLICE_INSTANCES,
                    trajectories: int = AGENTIC_TRAJECTORIES) -> PluginPrediction:
    """Heddle on a slice of instances: verl's balancer (trajectories spread evenly, turns first
    come first served) against Heddle's presorted balance with longest-remaining-first turns, as
    the oracle (true remaining tokens and tool time) and as a non-clairvoyant index policy (the
    learned distribution of turns: expected remaining turns given those done). Slices are drawn
    until they hold ``trajectories`` in all (one slice at least, :data:`MAX_DRAWS` at most); each
    figure is the median over the draws."""
    name = "agentic_rollout"
    if not base.job.trajectories:
        return no_prediction(name, base.step.step_s, "the trace holds no agent-loop trajectory (trajectory_* "
                                                     "events): record an agentic job with tracing on")
    engines = min(base.cluster.instances, instances)
    turns = np.array([max(t.turns, 1) for t in base.job.trajectories])
    per_engine = max(1, round(base.step.requests_per_instance / turns.mean()))
    draws = min(MAX_DRAWS, max(1, math.ceil(trajectories / (engines * per_engine))))
    rng = np.random.default_rng(seed)
    drawn = [_agentic_draw(base, engines * per_engine, engines, turns, rng) for _ in range(draws)]
    figures = {k: float(np.median([d[k] for d in drawn])) for k in drawn[0]}
    bound = figures.pop(BOUND)
    rest = base.step.step_s - base.generate_s
    return PluginPrediction(
        name, base.step.step_s, rest + figures[ORACLE] * base.generate_s, rest + bound * base.generate_s, SIMULATED,
        {"placement": "presorted balance (longest predicted first)", "priority": "longest remaining first",
         "slice": f"{engines} instances x {per_engine} trajectories, median of {draws} draws"},
        "Heddle with true remaining work (its predictor's ceiling) on a slice; the step's generation is "
        "the slice's ratio times verl's", figures)


def _serve(lengths: np.ndarray, engine: EngineModel, prompt: int, order: object,
           preemption: object) -> tuple[float, float]:
    """(makespan, mean finish) of ``lengths`` all submitted at once to one engine."""
    sim = Simulator([engine], order=order, preemption=preemption)
    sim.submit([Request(i, 0.0, int(n), prompt) for i, n in enumerate(lengths)])
    finish = sim.run().finish_array()
    return float(finish.max()), float(finish.mean())


# bench serving's schedulers: vLLM's FCFS, and the preemptive_serving plugin's own policies
FCFS = "fcfs"
PLUGIN_POLICIES = {"rlweave": "adaptive", "fastserve": "skip_join_mlfq"}


def serve_open_loop(requests: Sequence[Request], engine: EngineModel, policy: str, info: EngineInfo,
                    history: Sequence[int] = ()) -> np.ndarray:
    """Finish time of each of ``requests``, arriving at their ``arrival_s`` (an open loop:
    Poisson arrivals at a load, a trace), on one engine under bench serving's ``policy``:
    :data:`FCFS` (vLLM's default: a request keeps its slot until it ends) or one of
    :data:`PLUGIN_POLICIES`, the preemptive_serving plugin's own scheduler deciding as it does
    inside vLLM (:class:`~rlweave.sim.deciding.DecidedSimulator`). Each request's cap
    (``max_tokens``) is its length, as under ``ignore_eos``; ``history``: output lengths the
    engine finished before, each at its cap, which the scheduler's length model has learnt;
    ``info``: the engine as the scheduler is told of it (its slots are the engine's). Each finish
    includes the engine's ``request_s`` (its front end's time, outside the iterations)."""
    if policy == FCFS:
        sim = Simulator([engine], ArrivalOrder(), KeepRunning(), slots=[info.max_num_seqs])
    else:
        scheduler = PreemptiveScheduler(PreemptiveServingConfig(enable=True, policy=PLUGIN_POLICIES[policy]), info)
        for n in history:
            scheduler.finish(RequestView("history", 0.0, 0, int(n), int(n)))
        sim = DecidedSimulator(engine, scheduler, info, {r.id: int(r.output_tokens) for r in requests})
    sim.submit(requests)
    return sim.run().finish_array() + engine.request_s


def predict_serving(base: Baseline, seed: int = 0, instances: int = 4) -> PluginPrediction:
    """FastServe's question on ``instances`` sampled generation instances: first come first
    served against preempting by expected remaining tokens (the learned length distribution:
    the non-clairvoyant index FastServe's MLFQ approximates) and by true remaining tokens (the
    SRPT oracle). A sync step submits every request at once and waits for the last, so the step
    follows the makespan; the mean request latency is the serving figure (requests arriving
    over time: :func:`serve_open_loop`)."""
    engine, prompt = base.step.engine, int(round(base.job.mean_prompt_tokens))
    learned = ExpectedRemaining(base.job.output_lengths)
    rng = np.random.default_rng(seed)
    policies = {"FCFS": (ArrivalOrder(), KeepRunning()),
                "non-clairvoyant (expected remaining)": (learned, ShortestRemainingPreempts()),
                "oracle (SRPT)": (ShortestRemaining(), ShortestRemainingPreempts())}
    makespan = {k: 0.0 for k in policies}
    latency = {k: 0.0 for k in policies}
    for _ in range(instances):
        lengths = rng.choice(base.job.output_lengths, base.step.requests_per_instance)
        for k, (order, preemption) in policies.items():
            m, mean = _serve(lengths, engine, prompt, order, preemption)
            makespan[k] += m
            latency[k] += mean
    ratio = makespan["non-clairvoyant (expected remaining)"] / makespan["FCFS"]
    rest = base.step.step_s - base.generate_s
    figures = {f"mean latency, {k}": latency[k] / latency["FCFS"] for k in policies}
    figures |= {f"makespan, {k}": makespan[k] / makespan["FCFS"] for k in policies}
    bound = base.generation_bound_s(base.step.requests_per_instance) * base.generate_s / (makespan["FCFS"] / instances)
    return PluginPrediction(
        "preemptive_serving", base.step.step_s, rest + base.generate_s * ratio, rest + min(bound, base.generate_s),
        SIMULATED, {"queue order": "expected remaining tokens (learned lengths)", "preemption": "KV kept"},
        "the non-clairvoyant index on the recorded lengths stands for FastServe's MLFQ (its ceiling); preempted "
        "KV is kept at no cost; it changes latency, not the step's last finish", figures)
