"""Scale (first cut): the recorded job projected onto the cluster, as verl's default sync step.

verl's default loop runs its stages one after another on every GPU: generation, then the
inference stages (old_log_prob, ref, values), the updates, the weight sync. The predicted step
is their sum: generation SIMULATED with :mod:`rlweave.sim` on the recorded length distribution,
every other stage MODELLED by scaling its recorded seconds. Each scaling is a named assumption
(:data:`ASSUMPTIONS`, printed with every prediction); none is tuned to an answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import ClassVar

import numpy as np

from rlweave.plan.cluster import Cluster
from rlweave.plan.record import JobRecord, RecordError
from rlweave.sim import EngineModel, Request, Simulator

SIMULATED, MODELLED = "SIMULATED", "MODELLED"

ASSUMPTIONS: dict[str, str] = {
    "decode-bandwidth": "an engine iteration's decode cost (base + per sequence) is bound by HBM: it scales by the "
                        "recorded device's over the target's bandwidth, times the weights each GPU reads "
                        "(params / rollout_tp, target over recorded)",
    "prefill-flops": "prefill per token scales by dense FLOP/s (recorded over target) times params / rollout_tp",
    "same-slots": "a target instance holds as many sequences as the recorded engine (or the file's [job] slots)",
    "same-lengths": "the target's responses follow the recorded length distribution (sampled with replacement)",
    "weak-scaling": "without [job] requests_per_step, each GPU gets the recorded requests per GPU (an instance "
                    "of rollout_tp GPUs, rollout_tp times as many)",
    "train-flops": "old_log_prob, ref, values and the updates are FLOP-bound at the recorded efficiency (MFU): "
                   "seconds scale by FLOP/s (recorded over target) x params (target over recorded) x tokens "
                   "per GPU (target over recorded); pipeline bubbles and TP/DP communication are not modelled",
    "weight-sync-nvlink": "the weight sync reshards over NVLink: seconds scale by params and by NVLink bandwidth "
                          "(recorded over target)",
    "host-stages": "reward and adv run on the host and are kept as recorded",
    "sampled-tail": "beyond the simulated instances, the step waits for the slowest of all: the tail of a normal "
                    "fitted to the sampled instances' makespans at the 1 - 1/(instances+1) quantile",
}
FLOP_STAGES = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
_HOST_STAGES = ("reward", "adv")


@dataclass(frozen=True)
class Figure:
    """One predicted figure: seconds, and how it was produced (SIMULATED or MODELLED)."""

    seconds: float
    label: str


@dataclass(frozen=True)
class StepPrediction:
    """verl's default sync step on the cluster. ``stages``: each stage's figure (generation
    SIMULATED, the rest MODELLED); ``instances``: generation instances on the cluster,
    ``simulated``: how many of them were simulated; ``requests_per_instance`` the load of each;
    ``sample_max_s``: the slowest simulated instance (the tail estimate is ``stages['generate']``)."""

    label: ClassVar[str] = f"{SIMULATED} (generation) + {MODELLED} (other stages)"

    gpus: int
    instances: int
    simulated: int
    requests_per_instance: int
    sample_max_s: float
    stages: dict[str, Figure]
    engine: EngineModel

    @property
    def step_s(self) -> float:
        return sum(f.seconds for f in self.stages.values())


def target_engine(engine: EngineModel, cluster: Cluster) -> EngineModel:
    """The recorded engine on one target instance (assumptions decode-bandwidth, prefill-flops,
    same-slots)."""
    rec, gpu, par = cluster.recorded, cluster.gpu, cluster.parallelism
    weights = (cluster.model.params_b / par.rollout_tp) / (rec.params_b / rec.rollout_tp)
    decode = rec.gpu.hbm_tbs / gpu.hbm_tbs * weights
    prefill = rec.gpu.bf16_tflops / gpu.bf16_tflops * weights
    return replace(engine, base_s=engine.base_s * decode, per_seq_s=engine.per_seq_s * decode,
                   prefill_s_per_token=engine.prefill_s_per_token * prefill,
                   throughput=tuple((b, t / decode) for b, t in engine.throughput),
                   slots=cluster.slots or engine.slots)


def _instance_makespans(job: JobRecord, engine: EngineModel, per_instance: int, count: int,
                        seed: int) -> np.ndarray:
    """Each of ``count`` instances' generation time: ``per_instance`` requests, lengths drawn
    from the recorded ones, all submitted at once (verl's sync loop), first come first served."""
    rng = np.random.default_rng(seed)
    prompt = int(round(job.mean_prompt_tokens))
    out = np.empty(count)
    for k in range(count):
        lengths = rng.choice(job.output_lengths, per_instance, replace=True)
        sim = Simulator([engine])
        sim.submit([Request(i, 0.0, int(n), prompt) for i, n in enumerate(lengths)])
        out[k] = sim.run().finish_array().max()
    return out


def _tail(makespans: np.ndarray, instances: int) -> float:
    """The slowest of ``instances`` makespans: exact when all were simulated, else the
    sampled-tail assumption (never below the slowest simulated one)."""
    if len(makespans) >= instances:
        return float(makespans.max())
    z = NormalDist().inv_cdf(1 - 1 / (instances + 1))
    return max(float(makespans.max()), float(makespans.mean() + makespans.std(ddof=1) * z))


def _other_stages(job: JobRecord, cluster: Cluster, requests: int) -> dict[str, Figure]:
    rec, gpu = cluster.recorded, cluster.gpu
    tokens = (requests / cluster.gpus) / (job.requests_per_step / rec.gpus)
    flops = rec.gpu.bf16_tflops / gpu.bf16_tflops * cluster.model.params_b / rec.params_b * tokens
    sync = cluster.model.params_b / rec.params_b * rec.gpu.nvlink_gbs / gpu.nvlink_gbs
    out = {}
    for name, seconds in job.stage_s().items():
        if name in FLOP_STAGES:
            out[name] = Figure(seconds * flops, MODELLED)
        elif name == "weight_sync":
            out[name] = Figure(seconds * sync, MODELLED)
        elif name in _HOST_STAGES:
            out[name] = Figure(seconds, MODELLED)
    return out


def predict_step(job: JobRecord, cluster: Cluster, sample: int = 64, seed: int = 0) -> StepPrediction:
    """verl's default sync step of the recorded ``job`` on ``cluster``: generation simulated on
    at most ``sample`` instances (all of them when there are fewer), the other stages scaled."""
    if job.engine is None or not len(job.output_lengths):
        raise RecordError(f"the trace in {job.directory} has no engine iterations or no finished requests: "
                          f"record with the tracing plugin enabled in the engines too (vLLM)")
    requests = cluster.requests_per_step or max(1, round(job.requests_per_step / cluster.recorded.gpus * cluster.gpus))
    per_instance = math.ceil(requests / cluster.instances)
    engine = target_engine(job.engine, cluster)
    if engine.slots is None:
        raise RecordError("the trace gives no engine slot count (no engine_started event, no running request): "
                          "give [job] slots in the cluster file")
    makespans = _instance_makespans(job, engine, per_instance, min(sample, cluster.instances), seed)
    stages = {"generate": Figure(_tail(makespans, cluster.instances), SIMULATED)}
    stages |= _other_stages(job, cluster, requests)
    return StepPrediction(cluster.gpus, cluster.instances, len(makespans), per_instance, float(makespans.max()),
                          stages, engine)
