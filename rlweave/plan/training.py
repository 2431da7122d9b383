"""Per-plugin predictions on the training side: FLUX's overlapped TP linears (overlap), the
checkpoint interval under failures (resilience), and why stage fusion and ReLibra give none.

Overlap runs the plugin's own timeline model (:mod:`rlweave.plugins.overlap.choose`) on each TP
linear of a transformer layer; resilience is Young's interval on the cluster file's failure
figures. Both are MODELLED.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rlweave.plan.gpus import DEFAULTS
from rlweave.plan.prediction import FLOP_STAGES, UPDATE_STAGES, Baseline, PluginPrediction, no_prediction
from rlweave.plugins.overlap.choose import best
from rlweave.plugins.overlap.model import DeviceProfile, Shape
from rlweave.plugins.overlap.profiles import BUILTIN
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem
from rlweave.plugins.stage_fusion.search import search

MODELLED = "MODELLED"
FFN = 4  # assumption linears: a layer's linears are QKV and out (h x 3h, h x h) and an MLP of 4h
MAX_CHUNKS = 8


def overlap_device(base: Baseline) -> DeviceProfile:
    """Overlap's H100 profile scaled to the target by the datasheet ratios (GEMM by dense FLOP/s,
    links by NVLink, local adds by HBM): assumption ``overlap-device``."""
    h100, gpu = DEFAULTS["H100_SXM"], base.cluster.gpu
    ref = BUILTIN["h100-nvlink"]
    link = gpu.nvlink_gbs / h100.nvlink_gbs
    return replace(ref, name=f"{gpu.name} (scaled from h100-nvlink)", gemm_flops=ref.gemm_flops * gpu.bf16_tflops
                   / h100.bf16_tflops, link_bps=ref.link_bps * link, collective_bps=ref.collective_bps * link,
                   memory_bps=ref.memory_bps * gpu.hbm_tbs / h100.hbm_tbs)


def layer_shapes(hidden: int, tp: int, rows: int) -> dict[str, tuple[Shape, Shape]]:
    """(forward, input-gradient) shapes of one TP rank for a layer's four linears (QKV, out, an
    MLP of ``FFN`` x hidden), ``rows`` tokens gathered (a multiple of ``tp``)."""
    h = hidden
    out = {}
    for name, kind, k, n in (("qkv", "column", h, 3 * h), ("proj", "row", h, h),
                             ("fc1", "column", h, FFN * h), ("fc2", "row", FFN * h, h)):
        if kind == "column":
            out[name] = (Shape("ag_gemm", rows, n // tp, k, tp), Shape("gemm_rs", rows, k, n // tp, tp))
        else:
            out[name] = (Shape("gemm_rs", rows, n, k // tp, tp), Shape("ag_gemm", rows, k // tp, n, tp))
    return out


@dataclass(frozen=True)
class LayerOverlap:
    """One layer's TP linears on one rank, per direction (forward, input gradient): the unsplit
    GEMMs' seconds, the collectives' seconds exposed when each runs before or after its GEMM
    (Megatron's and vLLM's own path), and those left exposed under FLUX's tiles (the own path
    where the tiles lose, as ``choose`` keeps it). Shared by the plan's overlap row and
    ``bench plan``'s FLUX model-level rows, so both read one model."""

    gemm: tuple[float, float]
    exposed: tuple[float, float]
    left: tuple[float, float]
    chunks: dict[str, str]

    @property
    def training_work_s(self) -> float:
        """A training pass's GEMMs: forward, weight gradient (the forward's again), input gradient."""
        return 2 * self.gemm[0] + self.gemm[1]

    def forward_speedup(self) -> float:
        """A forward pass (prefill or decode) with the own path over one with FLUX's tiles."""
        return (self.gemm[0] + self.exposed[0]) / (self.gemm[0] + self.left[0])

    def training_speedup(self) -> float:
        """A training pass with the own path over one with FLUX's tiles."""
        return (self.training_work_s + sum(self.exposed)) / (self.training_work_s + sum(self.left))

    def training_comm_share(self) -> float:
        """The exposed collectives' share of a training pass on the own path."""
        return sum(self.exposed) / (self.training_work_s + sum(self.exposed))


def layer_overlap(device: DeviceProfile, shapes: dict[str, tuple[Shape, Shape]]) -> LayerOverlap:
    """Overlap's timeline model (tile backend, its best pieces per rank) on each linear."""
    gemm, exposed, left = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    chunks = {}
    for linear, pair in shapes.items():
        tile = [best(device, s, "tile", MAX_CHUNKS) for s in pair]
        for d, p in enumerate(tile):
            gemm[d] += p.gemm_nonsplit_s
            exposed[d] += p.sequential_s - p.gemm_nonsplit_s
            left[d] += min(max(p.time_s, p.gemm_nonsplit_s), p.sequential_s) - p.gemm_nonsplit_s
        chunks[linear] = "/".join(str(p.chunks_per_rank) for p in tile)
    return LayerOverlap((gemm[0], gemm[1]), (exposed[0], exposed[1]), (left[0], left[1]), chunks)


def predict_overlap(base: Baseline) -> PluginPrediction:
    """FLUX's tile-level overlap of each TP linear's collective with its GEMM. verl's default here
    exposes each collective after (or before) its GEMM, which the default step's training model
    leaves out (``train-flops``): this row adds it to both sides, so its ratio is comm exposed
    against comm overlapped. Assumption ``linear-bound``: the training stages' time is their
    linears' GEMMs (forward; an update adds the input and weight gradients, twice the forward)."""
    name = "overlap"
    tp = base.cluster.parallelism.tp
    if tp < 2:
        return no_prediction(name, base.step.step_s, "tp = 1: no tensor-parallel collective to overlap")
    if base.train_s <= 0:
        return no_prediction(name, base.step.step_s, "the trace holds no training stage")
    exposed, left, settings = overlap_extra_s(base)
    return PluginPrediction(name, base.step.step_s + exposed, base.step.step_s + left, base.step.step_s, MODELLED,
                            settings,
                            "verl's default here includes the TP collectives (exposed); forward-only stages "
                            "pay the forward ones; pipeline and data-parallel communication not modelled")


def overlap_extra_s(base: Baseline) -> tuple[float, float, dict[str, object]]:
    """Seconds the TP collectives add to the training stages (exposed, as verl's default runs
    them; left over, as FLUX's tiles overlap them), and the settings chosen."""
    tp = base.cluster.parallelism.tp
    rows = tp * math.ceil((base.job.mean_prompt_tokens + base.mean_length) / tp)  # a micro-batch of one sequence
    device = overlap_device(base)
    layer = layer_overlap(device, layer_shapes(base.cluster.model.hidden, tp, rows))
    forward = base.seconds(*(s for s in FLOP_STAGES if s not in UPDATE_STAGES)) / layer.gemm[0]
    update = base.seconds(*UPDATE_STAGES) / layer.training_work_s
    settings = {"backend": "tile (FLUX)", "chunks per rank (fwd/bwd)": layer.chunks, "rows": rows,
                "device": device.name}
    return (forward * layer.exposed[0] + update * sum(layer.exposed),
            forward * layer.left[0] + update * sum(layer.left), settings)


def young_interval_s(save_s: float, mtbf_s: float, step_s: float) -> float:
    """Young's interval ``sqrt(2 save mtbf)``, never shorter than a step."""
    return max(math.sqrt(2 * save_s * mtbf_s), step_s)


def ettr_at(save_s: float, restart_s: float, mtbf_s: float, step_s: float,
            interval_s: float | None = None) -> tuple[float, float]:
    """(ETTR, interval): the share of wall time that makes progress when a save stalls ``save_s``
    after every interval of work, and a failure, arriving every ``mtbf_s`` of wall-clock time
    (hardware fails whether or not the job progresses), costs the restart and half an interval
    redone. Over wall time W that is W / mtbf failures, so W (1 - lost / mtbf) = work (1 + save /
    interval). The interval is ``interval_s`` where given (a run's own save_freq or
    snapshot_every, in seconds), else Young's; 0 where failures come faster than the job
    recovers from them."""
    tau = young_interval_s(save_s, mtbf_s, step_s) if interval_s is None else interval_s
    return max(0.0, 1 - (restart_s + tau / 2) / mtbf_s) / (1 + save_s / tau), tau


def predict_resilience(base: Baseline) -> PluginPrediction:
    """verl's default (checkpoints to storage, a job restart per failure) against resilience's
    host-memory snapshots and group rebuild, each at Young's interval for the cluster's failure
    rate. The step is the failure-free step over the ETTR: the default's over resilience's is the
    ETTR ratio. The bound is no failure at all."""
    name = "resilience"
    f = base.cluster.failures
    if f is None:
        return no_prediction(name, base.step.step_s, "no [failures] in the cluster file: give gpu_mtbf_hours, "
                                                     "checkpoint_s, restart_s, snapshot_s and recover_s")
    step = base.step.step_s
    mtbf = f.gpu_mtbf_hours * 3600 / base.cluster.gpus
    verl, tau = ettr_at(f.checkpoint_s, f.restart_s, mtbf, step)
    if verl == 0:
        return no_prediction(name, step, _never_progresses("verl's restart_s", f.restart_s, tau, mtbf, base))
    if f.snapshot_s is None:
        return no_prediction(name, step / verl, "[failures] gives no snapshot_s and recover_s: resilience's "
                                                "own costs are needed to predict it")
    kept, tau_r = ettr_at(f.snapshot_s, f.recover_s, mtbf, step)
    if kept == 0:
        return no_prediction(name, step / verl, _never_progresses("resilience's recover_s", f.recover_s, tau_r,
                                                                  mtbf, base))
    return PluginPrediction(name, step / verl, step / kept, step, MODELLED,
                            {"snapshot_every (steps)": max(1, round(tau_r / step)),
                             "verl save_freq at Young's interval (steps)": max(1, round(tau / step)),
                             "cluster MTBF h": round(mtbf / 3600, 2)},
                            f"ETTR {verl:.3f} (verl) vs {kept:.3f} (resilience); a failure "
                            f"every {mtbf / 3600:.2f} h on {base.cluster.gpus} GPUs")


def _never_progresses(cost: str, restart_s: float, interval_s: float, mtbf_s: float, base: Baseline) -> str:
    """Why there is no ETTR to divide by: the cluster fails before a restart and the work redone
    are over, so the job never gets ahead."""
    return (f"a failure every {mtbf_s:.0f} s on {base.cluster.gpus} GPUs comes before {cost} ({restart_s:g} s) and "
            f"half an interval redone ({interval_s / 2:.0f} s) are over: the job would never progress; check "
            f"[failures] gpu_mtbf_hours and the restart figures")


def predict_stage_fusion(base: Baseline) -> PluginPrediction:
    """RLHFuse fills pipeline bubbles (intra-stage) and migrates the generation tail
    (inter-stage); neither has a baseline to gain on here. The migration's model
    (:mod:`rlweave.plan.inter_stage`) needs a layout with instances beside the trainer's
    devices, which verl's default (every replica on the trainer's devices) does not have."""
    return no_prediction("stage_fusion", base.step.step_s,
                         "the default's training model has no pipeline bubbles to fill (train-flops) and the trace "
                         "holds no per-micro-batch costs; the generation-tail migration (rlweave.plan.inter_stage) "
                         "needs instances off the trainer's devices to migrate onto, and verl's default colocates "
                         "every replica on them")


@dataclass(frozen=True)
class PipelineFusion:
    """Stage fusion's intra-stage gain on a known pipeline: separate 1F1B's simulated makespan
    over the searched fused schedule's (``speedup``) and over the fused lower bound
    (``bound_speedup``), both SIMULATED on the given stage costs."""

    speedup: float
    bound_speedup: float
    separate_1f1b_s: float
    fused_s: float


def pipeline_fusion(problem: FusedPipelineProblem, seconds: float = 1.0, seed: int = 0) -> PipelineFusion:
    """What RLHFuse's fused actor-critic schedule buys on ``problem``, whose per-stage forward
    and backward costs a trace of stage spans does not hold (``predict_stage_fusion``); a run
    that measured them (``bench fusion-executor``) gives them. Stage fusion's own search."""
    result = search(problem, seconds=seconds, seed=seed)
    return PipelineFusion(result.separate_1f1b / result.makespan, result.separate_1f1b / result.lower_bound.value,
                          result.separate_1f1b, result.makespan)


def expert_balance_speedup(max_mean_before: float, max_mean_after: float, moe_share: float = 1.0) -> float:
    """ReLibra's gain where an MoE layer's time is its busiest rank's tokens (the other ranks wait
    for it at the all-to-all): the step with the MoE layers' share ``moe_share`` shortened by the
    busiest rank's load after balancing over before (max/mean rank tokens, the same tokens in
    all). Copies, moves and the plan's own time are left out."""
    return 1 / (1 - moe_share + moe_share * max_mean_after / max_mean_before)


def predict_replay_balance(base: Baseline) -> PluginPrediction:
    """ReLibra balances expert loads; a trace of stage spans holds none."""
    if base.cluster.model.experts == 0:
        reason = "a dense model (experts = 0): no expert load to balance"
    else:
        reason = ("the trace holds no expert routing (per-expert token loads per micro-batch); ReLibra's planner "
                  "needs them to choose slots")
    return no_prediction("replay_balance", base.step.step_s, reason)
