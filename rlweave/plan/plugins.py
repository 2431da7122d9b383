"""Plan: what each plugin, and each composable set, would buy on the cluster (issue 44).

:func:`plan_plugins` predicts verl's default step (:func:`rlweave.plan.scale.predict_step`),
then each plugin's step from its own planner or model (:mod:`rlweave.plan.generation`,
:mod:`rlweave.plan.training`), the composable sets, and a sensitivity line per plugin: each
input moved by -20% and +20%, the one or two that move the plugin's ratio most. Every figure is
SIMULATED or MODELLED; a plugin without an honest model says why it gives none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from rlweave.plan.cluster import Cluster
from rlweave.plan.generation import (
    AGENTIC_TRAJECTORIES,
    MAX_DRAWS,
    SIMULATED,
    predict_agentic,
    predict_serving,
    predict_stream,
)
from rlweave.plan.prediction import FLOP_STAGES, Baseline, PluginPrediction, no_prediction
from rlweave.plan.record import JobRecord
from rlweave.plan.scale import predict_step
from rlweave.plan.training import (
    ettr_at,
    overlap_extra_s,
    predict_overlap,
    predict_replay_balance,
    predict_resilience,
    predict_stage_fusion,
)
from rlweave.plugins.stream_generation.planner import PlanMode

PLAN_ASSUMPTIONS: dict[str, str] = {
    "slice": "stream generation, agentic and serving are simulated on a slice of a few instances with their share "
             "of the requests; the slice's ratio (plugin over default) is applied to the whole cluster's default; "
             f"agentic slices are drawn until they hold {AGENTIC_TRAJECTORIES} trajectories (at most "
             f"{MAX_DRAWS} draws) and each figure is the draws' median",
    "prefill-amortized": "StreamRL's throughput table spreads each sequence's prompt prefill over its tokens",
    "groups": "responses come in groups of 8 (GRPO's n), dispatched together; 4 mini-batches a step",
    "turn-lengths": "an agentic trajectory keeps a recorded trajectory's turns and tool gaps (each after its own "
                    "turn; spread evenly where the trace has only their sum); each turn's tokens are drawn from "
                    "the recorded lengths; every turn prefills the mean prompt (no prefix cache)",
    "overlap-device": "overlap's H100 profile scaled to the target GPU by dense FLOP/s, NVLink and HBM",
    "linear-bound": "the training stages' time is their TP linears' GEMMs (QKV, out, MLP of 4h), one sequence of "
                    "the mean length per micro-batch",
    "young": "checkpoints and snapshots at Young's interval sqrt(2 x save x cluster MTBF); failures arrive "
             "per wall-clock second, each costing the restart and half an interval redone",
    "composition": "a set runs StreamRL's planner with overlap's training time (and Heddle's generation ratio), "
                   "then divides by resilience's ETTR; members without a prediction are left out",
}

# composable sets: plugins that act on different parts of the step
SETS = (("stream_generation (on_policy)", "overlap", "resilience"),
        ("stream_generation (async)", "overlap", "resilience"),
        ("agentic_rollout", "overlap", "resilience"))


@dataclass(frozen=True)
class Fidelity:
    """How much is simulated: default-step instances, slice sizes, serving's sampled instances,
    agentic trajectories over its drawn slices. The sensitivity reruns use a cheaper one."""

    sample: int = 64
    slice_instances: int = 8
    async_instances: int = 4
    serving_instances: int = 4
    agentic_trajectories: int = AGENTIC_TRAJECTORIES


SHOWN = 5e-4  # a move the printed ratio (three places) cannot show is no move
CHEAP = Fidelity(sample=8, slice_instances=2, async_instances=2, serving_instances=1, agentic_trajectories=0)


PREDICTORS: dict[str, Callable[[Baseline, Fidelity], PluginPrediction]] = {
    "stream_generation (on_policy)": lambda b, f: predict_stream(b, PlanMode.ON_POLICY, instances=f.slice_instances),
    "stream_generation (async)": lambda b, f: predict_stream(b, PlanMode.ASYNC, instances=f.async_instances),
    "agentic_rollout": lambda b, f: predict_agentic(b, instances=f.slice_instances,
                                                    trajectories=f.agentic_trajectories),
    "preemptive_serving": lambda b, f: predict_serving(b, instances=f.serving_instances),
    "overlap": lambda b, f: predict_overlap(b),
    "resilience": lambda b, f: predict_resilience(b),
    "stage_fusion": lambda b, f: predict_stage_fusion(b),
    "replay_balance": lambda b, f: predict_replay_balance(b),
}


def _rows(base: Baseline, fid: Fidelity, only: frozenset[str] | None = None) -> dict[str, PluginPrediction]:
    return {n: p(base, fid) for n, p in PREDICTORS.items() if only is None or n in only}


def _compose(base: Baseline, rows: dict[str, PluginPrediction], members: tuple[str, ...],
             fid: Fidelity) -> PluginPrediction:
    """One composable set, see ``composition``."""
    name = " + ".join(members)
    have = [m for m in members if rows[m].step_s is not None]
    if len(have) < 2:
        return no_prediction(name, base.step.step_s, "fewer than two of its plugins have a prediction")
    exposed = left = 0.0
    default_s, step_s, bound_s = base.step.step_s, base.step.step_s, base.step.step_s
    if "overlap" in have:
        exposed, left, _ = overlap_extra_s(base)
        default_s, step_s = default_s + exposed, step_s + left
    first = have[0]
    if first.startswith("stream_generation"):
        mode = PlanMode.ASYNC if "async" in first else PlanMode.ON_POLICY
        train = base.train_s or 1.0
        stream = predict_stream(base, mode, instances=fid.async_instances if mode is PlanMode.ASYNC
                                else fid.slice_instances, train_factor=1 + left / train,
                                default_train_factor=1 + exposed / train, default_s=default_s)
        step_s, bound_s = stream.step_s, stream.bound_s
    elif first == "agentic_rollout":
        step_s -= base.generate_s - (rows[first].step_s - (base.step.step_s - base.generate_s))
        bound_s = rows[first].bound_s
    f = base.cluster.failures
    if "resilience" in have:
        mtbf = f.gpu_mtbf_hours * 3600 / base.cluster.gpus
        verl = ettr_at(f.checkpoint_s, f.restart_s, mtbf, base.step.step_s)[0]
        kept = ettr_at(f.snapshot_s, f.recover_s, mtbf, base.step.step_s)[0]
        default_s, step_s = default_s / verl, step_s / kept
    label = SIMULATED if any(rows[m].label == SIMULATED for m in have) else "MODELLED"
    left_out = [m for m in members if m not in have]
    return PluginPrediction(name, default_s, step_s, bound_s, label, note="set of " + ", ".join(have) + (
        f" ({', '.join(left_out)}: no prediction)" if left_out else ""))


def _scaled_stages(job: JobRecord, k: float) -> JobRecord:
    return replace(job, stages={s: {n: v * k if n in FLOP_STAGES else v for n, v in st.items()}
                                for s, st in job.stages.items()})


# input name -> (job, cluster, factor) -> (job, cluster)
Perturb = Callable[[JobRecord, Cluster, float], tuple[JobRecord, Cluster]]
INPUTS: dict[str, Perturb] = {
    "GPU FLOP/s": lambda j, c, k: (j, replace(c, gpu=replace(c.gpu, bf16_tflops=c.gpu.bf16_tflops * k))),
    "HBM bandwidth": lambda j, c, k: (j, replace(c, gpu=replace(c.gpu, hbm_tbs=c.gpu.hbm_tbs * k))),
    "NVLink bandwidth": lambda j, c, k: (j, replace(c, gpu=replace(c.gpu, nvlink_gbs=c.gpu.nvlink_gbs * k))),
    "model size": lambda j, c, k: (j, replace(c, model=replace(c.model, params_b=c.model.params_b * k))),
    "response lengths": lambda j, c, k: (replace(j, output_lengths=np.maximum(1, np.round(j.output_lengths * k))
                                                 .astype(int)), c),
    "requests per step": lambda j, c, k: (j, replace(c, requests_per_step=max(1, round(
        (c.requests_per_step or j.requests_per_step / c.recorded.gpus * c.gpus) * k)))),
    "engine slots": lambda j, c, k: (j, replace(c, slots=max(1, round((c.slots or j.slots or 1) * k)))),
    "recorded training time": lambda j, c, k: (_scaled_stages(j, k), c),
    "GPU MTBF": lambda j, c, k: (j, replace(c, failures=replace(c.failures, gpu_mtbf_hours=c.failures.gpu_mtbf_hours
                                                                * k) if c.failures else None)),
}


# an input moves only these rows (the others' models never read it); absent: every row
MOVES = {"GPU MTBF": frozenset({"resilience"}),
         "NVLink bandwidth": frozenset({"stream_generation (on_policy)", "stream_generation (async)", "overlap",
                                        "resilience"}),
         "recorded training time": frozenset({"stream_generation (on_policy)", "stream_generation (async)",
                                              "overlap", "resilience"})}


def _sensitivity(job: JobRecord, cluster: Cluster, rows: dict[str, PluginPrediction], seed: int) -> dict[str, str]:
    """Per plugin with a ratio: the inputs whose ±20% moves its ratio most (top two), each rerun
    at the cheaper :data:`CHEAP` fidelity (its center too). The moves are given relative to that
    center, whose level can sit well off the full-fidelity ratio (a slice of two instances holds
    a different tail), so that the line reads as a change and not as a second prediction."""
    predicted = frozenset(n for n, r in rows.items() if r.ratio is not None)

    def ratios(j: JobRecord, c: Cluster, only: frozenset[str]) -> dict[str, float | None]:
        base = Baseline(j, c, predict_step(j, c, sample=CHEAP.sample, seed=seed))
        return {n: r.ratio for n, r in _rows(base, CHEAP, only).items()}

    center = ratios(job, cluster, predicted)
    moves: dict[str, list[tuple[float, str]]] = {n: [] for n in center}
    for name, perturb in INPUTS.items():
        if name == "GPU MTBF" and cluster.failures is None:
            continue
        only = predicted & MOVES.get(name, predicted)
        low, high = ratios(*perturb(job, cluster, 0.8), only), ratios(*perturb(job, cluster, 1.2), only)
        for n in only:
            mid = center[n]
            if mid is not None and low[n] is not None and high[n] is not None:
                moves[n].append((max(abs(low[n] - mid), abs(high[n] - mid)),
                                 f"{name} ({low[n] / mid - 1:+.1%} at -20%, {high[n] / mid - 1:+.1%} at +20%, "
                                 f"of {mid:.3f} at that fidelity)"))
    return {n: "; ".join(text for size, text in sorted(m, reverse=True)[:2] if size >= SHOWN) or "no input moves it"
            for n, m in moves.items()}


@dataclass(frozen=True)
class PluginPlan:
    """verl's default step, and every plugin's and set's prediction beside it."""

    baseline: Baseline
    rows: tuple[PluginPrediction, ...]


def plan_plugins(job: JobRecord, cluster: Cluster, sample: int = 64, seed: int = 0,
                 sensitivity: bool = True) -> PluginPlan:
    """The plugins' predictions for ``job`` on ``cluster`` (see the module docstring)."""
    fid = replace(Fidelity(), sample=sample)
    base = Baseline(job, cluster, predict_step(job, cluster, sample=sample, seed=seed))
    rows = _rows(base, fid)
    sets = [_compose(base, rows, members, fid) for members in SETS]
    lines = _sensitivity(job, cluster, rows, seed) if sensitivity else {}
    out = [replace(r, sensitivity=lines.get(n, "")) for n, r in rows.items()]
    return PluginPlan(base, (*out, *sets))
