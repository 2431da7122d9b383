"""``rlweave bench plan``'s readers: each turns one benchmark's stored JSON into the planner's
input on that run's own setup, plans it, and returns rows of predicted against measured.

A reader takes ``(record, source)`` (the JSON ``rlweave bench <name>`` wrote, and its path) and
returns rows ``{"plugin", "kind": "cpu", "case", "source", "predicted", "measured", "error",
"label", "inputs"}``; the ratio is always the default over the plugin (above 1: the plugin is
faster). Every predicted figure is SIMULATED, but ReLibra's, which is MODELLED. Readable:

- ``agentic`` (Heddle): its engine cost model, seeded workloads, instances and slots; verl's
  makespan over the oracle's (Heddle with true remaining work; the planner's oracle is presorted
  placement and longest-remaining-first turns without the benchmark's migration at tool calls),
  and verl's over rlweave's (the plugin with its learned predictor), for which the planner's
  figure is its non-clairvoyant index: even placement, turns by expected remaining turns given
  those done, learned from the recorded turns. It stands for Heddle's predictor, which the
  planner does not run: it knows the turn distribution, not the prompt's task or its siblings.
- ``stream`` (StreamRL): per stored round, the verl sync run's engine profile, each run's
  stages, latencies and CPU, and the workload's lengths, through StreamRL's planner (the
  bench's own planner check, re-run from the stored inputs); verl sync's step over each rlweave
  run's, the planner's colocated prediction of verl sync over its prediction of the run, median
  over the rounds.
- ``fusion-executor`` (RLHFuse): the per-stage forward and backward seconds measured on the real
  pipeline stages; separate 1F1B over the fused schedule, stage fusion's own search
  (:func:`rlweave.plan.training.pipeline_fusion`) on those costs against the measured steps.
- ``fusion-inter`` (RLHFuse, inter-stage): per round, each side on its own engine's cost as
  the run's trace fitted it (the stream run's for the plugin's stages, each verl run's for its
  generation), the fused run's inference per sample, dynamic batch and prompt tokens, verl's
  measured inference stage and the workload's lengths; verl sync's stage (generation up to its
  replay buffer's poll, then its inference) over the plugin's fused one, each step's migration
  chosen by the plugin's own ``plan_migration`` on the step before
  (:mod:`rlweave.plan.inter_stage`), median over the rounds; likewise with verl's 50 ms poll, and streaming without migration over fused.
- ``moe`` (ReLibra): its measured part, Megatron's MoE layer and ReLibra's on gloo at EP 2; the
  busiest rank's tokens under each placement as the run counted them
  (:func:`rlweave.plan.training.expert_balance_speedup`) against the measured steps.
- ``serving`` (FastServe): per load and round, the run's own requests (its seeded workload at
  the round's rate), under FCFS and under the preemptive_serving plugin's own scheduler, each on
  its own engine's model (requests alone, their fixed cost outside the iterations, and that
  engine's saturation probe)
  (:func:`rlweave.plan.generation.serve_open_loop`); FCFS's mean normalised latency over the
  policy's, median over the rounds.
- ``resilience`` (MegaScale): its ETTR part; each side's ETTR from the planner's model
  (:func:`rlweave.plan.training.ettr_at` at the run's own save interval) on its fault
  interval, clean step, restarts and saves, against the ETTR measured over the window, and
  rlweave's over verl's (MODELLED).

:data:`NOT_READ` says, for every other plugin, why no stored run of it is compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

from rlweave.benchmarks.agentic_workload import synthetic
from rlweave.benchmarks.fusion_inter import FUSED, INFERENCE_MICRO, RUNS, STREAM, VERL, VERL_FAST
from rlweave.benchmarks.plan_papers import agentic_baseline
from rlweave.benchmarks.stream import FAST_POLL_S, VERL_POLL_S
from rlweave.plan.generation import FCFS, INDEX, ORACLE, PLUGIN_POLICIES, predict_agentic, serve_open_loop
from rlweave.plan.inter_stage import (InterStageFusion, InterStageSetup, SequentialStage, inter_stage_fusion,
                                      sequential_generation)
from rlweave.plan.training import ettr_at, expert_balance_speedup, pipeline_fusion
from rlweave.plugins.resilience.options import ResilienceConfig
from rlweave.plugins.stage_fusion.migration import InferenceCost, engine_cost
from rlweave.plugins.stage_fusion.options import StageFusionConfig
from rlweave.plugins.stage_fusion.problem import FusedPipelineProblem, StageCosts
from rlweave.sim import EngineModel, Request
from rlweave.types import EngineInfo, RolloutInstance

SIMULATED, MODELLED = "SIMULATED", "MODELLED"


def option(argv: list[str], name: str, default: int) -> int:
    """An integer option of the stored command line (its default where absent)."""
    return int(argv[argv.index(name) + 1]) if name in argv else default


def _row(plugin: str, case: str, source: str, predicted: float, measured: float, inputs: str,
         label: str = SIMULATED) -> dict:
    return {"plugin": plugin, "kind": "cpu", "case": case, "source": source, "label": label,
            "predicted": float(predicted), "measured": float(measured),
            "error": abs(float(predicted) / float(measured) - 1), "inputs": inputs}


def agentic_rows(record: dict, source: str) -> list[dict]:
    """One comparison per workload of a stored ``bench agentic`` run."""
    cost, argv = record["details"]["cost_model"], record.get("argv", [])
    engine = EngineModel(cost["base_s"], cost["per_seq_s"], cost["slots"], cost["prefill_s_per_token"])
    instances = option(argv, "--instances", 2)
    rows = []
    for name, workload in record["details"]["workloads"].items():
        batch = workload["batches"][0]
        base = agentic_baseline(synthetic(batch["seed"], workload=name), engine, instances,
                                float(np.median(batch["makespan_s"]["verl"])), source)
        policies = predict_agentic(base, instances=instances).policies
        measured = record["headline"][name]
        for case, policy, key in ((f"{name}: verl over oracle", ORACLE, "oracle_makespan_ratio"),
                                  (f"{name}: verl over rlweave (planner: its non-clairvoyant index)", INDEX,
                                   "makespan_ratio")):
            rows.append(_row("agentic_rollout", case, source, 1 / policies[policy], measured[key],
                             f"its cost model, seeded workload {name}, {instances} instances"))
    return rows


def stream_rows(record: dict, source: str) -> list[dict]:
    """verl sync over each rlweave run of a stored ``bench stream``, median over its rounds."""
    from rlweave.benchmarks.stream import stored_predictions

    details = record["details"]
    seed = option(record.get("argv", []), "--seed", 0)
    predicted: dict[str, list[float]] = {}
    measured: dict[str, list[float]] = {}
    for runs, check in zip(details["rounds"], details["planner_rounds"], strict=True):
        steps = stored_predictions(check["engine_tokens_per_s"], runs, details["lengths"], details["setup"], seed)
        verl = runs["verl sync"]["samples_per_s"]
        for label, step in steps.items():
            if label.startswith("rlweave") and label in runs:
                predicted.setdefault(label, []).append(steps["verl sync"] / step)
                measured.setdefault(label, []).append(runs[label]["samples_per_s"] / verl)
    return [_row("stream_generation", f"stream: verl sync over {label}", source, statistics.median(predicted[label]),
                 statistics.median(measured[label]),
                 f"{len(predicted[label])} round(s): the verl sync run's engine profile, each run's stages, "
                 "latencies and CPU, the workload's lengths")
            for label in predicted]


def fusion_executor_rows(record: dict, source: str) -> list[dict]:
    """Separate 1F1B over the fused schedule of a stored ``bench fusion-executor`` run."""
    from rlweave.benchmarks.fusion_executor import ACTOR_PP

    details = record["details"]
    settings, costs = details["settings"], details["costs"]
    m = settings["micro_batches"]
    problem = FusedPipelineProblem(ACTOR_PP, settings["critic_pp"], m, m, StageCosts(*map(tuple, costs["actor"])),
                                   StageCosts(*map(tuple, costs["critic"])))
    fused = pipeline_fusion(problem, seconds=1.0, seed=settings.get("seed", 0))
    return [_row("stage_fusion", f"fusion-executor: separate 1F1B over fused (actor pp {ACTOR_PP}, critic pp "
                                 f"{settings['critic_pp']}, {m} micro-batches)", source, fused.speedup,
                 record["headline"]["speedup"],
                 "each stage's forward and backward seconds as measured (median over the rounds)")]


VERL_POLLS = {VERL: VERL_POLL_S, VERL_FAST: FAST_POLL_S}  # how often each verl run looks for the finished batch
FUSION_INTER_STEPS = 6  # drawn steps: the first plans the second, ..., as steps 2-6 of the run


def fusion_inter_engine(cost: dict[str, float]) -> EngineModel:
    """The engine cost a stored ``bench fusion-inter`` run fitted on its own trace (``cost_model``)."""
    return engine_cost(cost["decode_base_ms"] / 1e3, cost["decode_per_seq_ms"] / 1e3, cost["prefill_us_per_token"] / 1e6)


def fusion_inter_model(runs: dict[str, dict], lengths: list[int], prompts: int, slots: int,
                       seed: int) -> tuple[InterStageFusion, dict[str, SequentialStage]]:
    """One round of a stored ``bench fusion-inter``, each side on its own engine's cost, as a
    trace of each job gives it. The plugin's side (:func:`rlweave.plan.inter_stage.inter_stage_fusion`):
    the engine cost fitted on the round's stream run, the fused run's layout (a replica on the
    trainer's core and one beside it, ``slots`` each), its inference per sample as the trainer
    measured it (or beside an engine, over the plugin's slowdown), its dynamic batch and prompt
    tokens. verl's (:func:`~rlweave.plan.inter_stage.sequential_generation`), per verl run that
    stored its fitted cost: its generation on that cost, on the same instances and dispatch
    orders. Steps of ``prompts`` samples drawn from the workload's ``lengths``."""
    fused = runs[FUSED]
    slowdown = StageFusionConfig().shared_slowdown
    per_sample = fused["inference_s_per_sample"] or fused["inference_s_per_sample_shared"] / slowdown
    instances = (RolloutInstance("core 1", False, slots), RolloutInstance("core 0", True, slots))
    setup = InterStageSetup(fusion_inter_engine(runs[STREAM]["cost_model"]), instances,
                            InferenceCost(per_sample, slowdown, RUNS[FUSED][1] * INFERENCE_MICRO),
                            round(fused.get("prompt_len", 0)))
    rng = np.random.default_rng(seed)
    steps = [rng.choice(lengths, prompts, replace=False).tolist() for _ in range(FUSION_INTER_STEPS)]
    verl = {label: sequential_generation(steps, instances, fusion_inter_engine(runs[label]["cost_model"]), seed)
            for label in VERL_POLLS if "cost_model" in runs.get(label, {})}
    return inter_stage_fusion(steps, setup, seed), verl


def fusion_inter_rows(record: dict, source: str) -> list[dict]:
    """verl sync's generation+inference stage (and the 50 ms poll's, and streaming without
    migration) over rlweave fused's in a stored ``bench fusion-inter``: per round,
    :func:`fusion_inter_model`, verl's stage its simulated generation (on its own run's engine
    cost) up to its next poll plus the inference stage it measured; median over the rounds. A
    verl run stored without its fitted cost is not planned."""
    d = record["details"]
    lengths = [row[0] for row in d["lengths"]]
    seed = option(record.get("argv", []), "--seed", 0)
    predicted: dict[str, list[float]] = {}
    measured: dict[str, list[float]] = {}
    for runs in d["rounds"]:
        if FUSED not in runs or STREAM not in runs:
            continue
        model, verl = fusion_inter_model(runs, lengths, d["setup"]["prompts"], d["setup"]["slots"], seed)
        stages = {label: stage.stage_s(runs[label]["inference_s"], VERL_POLLS[label])
                  for label, stage in verl.items()} | {STREAM: model.streamed_mean_s}
        for label, stage_s in stages.items():
            predicted.setdefault(label, []).append(stage_s / model.fused_mean_s)
            measured.setdefault(label, []).append(runs[label]["stage_s"] / runs[FUSED]["stage_s"])
    inputs = (f"{len(d['rounds'])} round(s): the stream run's engine cost (the fused and streamed stages), each "
              f"verl run's own (its generation), the fused run's inference per sample, dynamic batch and prompt "
              f"tokens, verl's measured inference stage, {FUSION_INTER_STEPS - 1} steps "
              f"of {d['setup']['prompts']} drawn from the workload's lengths")
    return [_row("stage_fusion", f"fusion-inter: {label} over rlweave fused (stage)", source,
                 statistics.median(predicted[label]), statistics.median(measured[label]), inputs)
            for label in predicted]


def moe_rows(record: dict, source: str) -> list[dict]:
    """Megatron's MoE layer over ReLibra's in a stored ``bench moe`` run's measured part (EP 2 on
    gloo; none where it was skipped): :func:`rlweave.plan.training.expert_balance_speedup` on
    the run's own per-rank token loads under each placement, the layer being the whole step."""
    measured = record["details"].get("measured_ep2")
    if not measured:
        return []
    imbalance = measured["max_mean_rank_tokens"]
    return [_row("replay_balance", "moe: Megatron's MoE layer over ReLibra's (EP 2, measured on gloo)", source,
                 expert_balance_speedup(imbalance["static"], imbalance["rlweave"]), measured["speedup"],
                 f"max/mean rank tokens {imbalance['static']:.3f} (static) and {imbalance['rlweave']:.3f} "
                 "(ReLibra's plans), as the run's ranks counted them", MODELLED)]


# what the serving reader plans from (a run recorded before 2026-12-07 has no block_size)
SERVING_INPUTS = {"levels", "policies", "capacity_req_s", "calibration_tokens_per_s", "alone_fit_fixed_prompt_output_s",
                  "max_num_seqs", "num_kv_blocks", "block_size", "workload"}


def serving_rows(record: dict, source: str) -> list[dict]:
    """FCFS's mean normalised latency over each preemptive policy's, per load, of a stored
    ``bench serving`` run (its engine client, synthetic workload; none for a trace or ``--client
    vllm``): per round, the run's requests at that round's rate, each policy on the engine model
    fitted to requests alone (their fixed cost as latency outside the iterations) and to its own
    engine's saturation probe that round (not the speed calibrated to the measured FCFS), FCFS
    against the plugin's own scheduler, median over the rounds. None for a run that lacks any of
    :data:`SERVING_INPUTS`."""
    from rlweave.benchmarks.serving import synthetic_workload, unit_rate
    from rlweave.benchmarks.serving_ceiling import fit_engine
    from rlweave.benchmarks.serving_engine import PROBE_REQUESTS, calibration_outputs, probe_lengths

    details, argv = record["details"], record.get("argv", [])
    if details.get("client") == "vllm" or "--trace" in argv or not SERVING_INPUTS <= set(details):
        return []
    workload = unit_rate(synthetic_workload(option(argv, "--requests", 300), option(argv, "--seed", 0),
                                            details["workload"]))
    slots, (prompt, output) = details["max_num_seqs"], probe_lengths(workload)
    history = calibration_outputs(workload)  # what each engine finished before its first load
    engines = {p: [fit_engine(details["alone_fit_fixed_prompt_output_s"], probe, prompt, output, slots, PROBE_REQUESTS)
                   for probe in details["calibration_tokens_per_s"][p]] for p in details["policies"]}
    rows = []
    for key, level in details["levels"].items():
        ratios = _serving_ratios(workload[: level["requests"]], float(key), engines, details, history)
        rows += [_row("preemptive_serving", f"serving: FCFS over {p} ({PLUGIN_POLICIES[p]}), mean normalised "
                                            f"latency at load {key}", source, statistics.median(ratios[p]),
                      level[p]["vs_fcfs"]["mean_norm_latency_s"]["median"],
                      f"{len(ratios[p])} round(s): each engine's model fitted to requests alone (their fixed "
                      f"cost outside the iterations) and its own probe that round, {level['requests']} requests "
                      f"at {key} of the round's FCFS capacity, the plugin's own scheduler")
                 for p in ratios]
    return rows


def _serving_ratios(workload: list[dict], load: float, engines: dict[str, list[EngineModel]], details: dict,
                    history: list[int]) -> dict[str, list[float]]:
    """Per policy but FCFS, per round: FCFS's simulated mean normalised latency over the
    policy's, ``workload`` arriving at ``load`` times the round's FCFS capacity, each policy on
    its own engine that round (``engines[policy][round]``)."""
    info = EngineInfo("vllm", "simulated", details["max_num_seqs"], 0, details["num_kv_blocks"],
                      details["block_size"], can_preempt=True, keeps_preempted_kv=True)
    ratios: dict[str, list[float]] = {}
    for n, capacity in enumerate(details["capacity_req_s"]):
        rate = load * capacity
        reqs = [Request(i, r["arrival_s"] / rate, r["output_len"], r["prompt_len"]) for i, r in enumerate(workload)]
        arrival = np.array([r.arrival_s for r in reqs])
        tokens = np.array([r.output_tokens for r in reqs])
        mean = {p: float(np.mean((serve_open_loop(reqs, engines[p][n], p, info, history) - arrival) / tokens))
                for p in (FCFS, *details["policies"][1:])}
        for p in details["policies"][1:]:
            ratios.setdefault(p, []).append(mean[FCFS] / mean[p])
    return ratios


def ettr_inputs(ettr: dict, side: str, save_freq: int) -> dict[str, float]:
    """One side of a stored ETTR part as the planner's resilience model takes it: the fault
    interval, the clean step (the mean of the two clean runs beside the side), the mean restart
    per fault (the trace's: to the rebuild's end, or to a resubmitted job's first ``generate``),
    the save interval (rlweave: a host snapshot every step, the plugin's default; verl: its
    ``save_freq``) and the stall per interval (rlweave pays its snapshot every step and verl's
    checkpoint, staged to host memory, every ``save_freq`` steps)."""
    costs = ettr[side]["costs"]
    step = statistics.mean(ettr[side]["clean_step_s"])
    checkpoint = statistics.median(costs["save_checkpoint_s"]) if costs["save_checkpoint_s"] else 0.0
    every, stall = ((ResilienceConfig().snapshot_every, statistics.median(costs["snapshot_s"])
                     + checkpoint / save_freq) if side == "rlweave" else (save_freq, checkpoint))
    restarts = [r for r in costs["restart_s"] if r is not None]
    return {"mtbf_s": ettr["fault_every_s"], "step_s": step, "restart_s": statistics.mean(restarts),
            "interval_s": every * step, "save_s": stall}


def resilience_rows(record: dict, source: str) -> list[dict]:
    """A stored ``bench resilience`` ETTR part (none where it was not run): each side's ETTR as
    the planner's model gives it (:func:`rlweave.plan.training.ettr_at`), on that side's own fault interval, clean
    step, restarts, save interval and stall, against the ETTR measured over the window (steps x
    clean step / window), and rlweave's over verl's. The restarts are measured on the same faults,
    so what is tested is the model's structure around them: half an interval redone, the stall
    per save, the pace between faults the clean one, and failures counted per wall-clock second."""
    ettr = record["details"]["parts"].get("ettr")
    if not ettr or "costs" not in ettr["rlweave"]:
        return []
    save_freq = record["details"]["args"]["save_freq"]
    predicted, inputs = {}, {}
    for side in ("rlweave", "verl"):
        x = inputs[side] = ettr_inputs(ettr, side, save_freq)
        predicted[side] = ettr_at(x["save_s"], x["restart_s"], x["mtbf_s"], x["step_s"], x["interval_s"])[0]
    where = f"a trainer rank killed every {ettr['fault_every_s']:.0f} s over {ettr['window_s']:.0f} s"

    def said(side: str) -> str:
        x = inputs[side]
        return (f"{side}: clean step {x['step_s']:.2f} s, restart {x['restart_s']:.1f} s per fault, saves every "
                f"{x['interval_s']:.1f} s stalling {x['save_s'] * 1e3:.0f} ms")

    measured = {side: ettr[side]["ettr"] for side in predicted}
    return [_row("resilience", f"resilience: ETTR with rlweave ({where})", source, predicted["rlweave"],
                 measured["rlweave"], said("rlweave"), MODELLED),
            _row("resilience", f"resilience: ETTR on verl's resubmit-and-resume ({where})", source, predicted["verl"],
                 measured["verl"], said("verl"), MODELLED),
            _row("resilience", "resilience: rlweave's ETTR over verl's", source,
                 predicted["rlweave"] / predicted["verl"], measured["rlweave"] / measured["verl"],
                 f"{said('rlweave')}; {said('verl')}", MODELLED)]


READERS: dict[str, Callable[[dict, str], list[dict]]] = {
    "agentic": agentic_rows, "stream": stream_rows, "fusion-executor": fusion_executor_rows,
    "fusion-inter": fusion_inter_rows, "moe": moe_rows, "serving": serving_rows,
    "resilience": resilience_rows}
# the plugin each reader's rows compare (a plugin may have several readers)
READS = {"agentic": "agentic_rollout", "stream": "stream_generation", "fusion-executor": "stage_fusion",
         "fusion-inter": "stage_fusion", "moe": "replay_balance", "serving": "preemptive_serving",
         "resilience": "resilience"}

# why no stored run of these plugins is compared, even where one is stored
NOT_READ = {
    "overlap": "bench overlap's CPU timings are no overlap figure (gloo's loopback copies need the cores that "
               "compute, docs/results/overlap.md); its E_overlap is the plugin's model itself, and its GPU part "
               "needs a lent GPU (no reader)",
}
