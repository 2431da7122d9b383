"""``rlweave plan stream``: StreamRL's resource planner as a tool a user runs before a job.

Given profiles measured on the real engine and trainer (``rlweave bench stream`` writes them to
``bench-results/stream-profile.json``; any measurement in the same layout works) and a step's
output lengths, it searches every split of each hardware pool into generation and training
instances and prints the best one with its predicted step and each stage's idle. The
prediction is the planner's model (:mod:`.planner`), a planning figure, not a measurement.

Profile file (JSON)::

    {"pools": [{"name": "h20", "devices": 16,
                "generation": {"batch_sizes": [1, 8], "tokens_per_s": [500, 3000], "devices": 1},
                "training": {"seconds_per_sample": 0.02, "devices": 1, "deferred_share": 0.0},
                "cpu_s_per_sample": 0.0}],
     "weight_sync_s": 0.1, "dispatch_s": 0.05, "delivery_s": 0.02,
     "lengths": [61, 12, 230, ...]}

A pool without a ``generation`` or ``training`` entry cannot run that stage. ``cpu_s_per_sample``
(optional, 0 by default) is for a pool whose devices are cores the host side shares, as on the
CPU rig: the CPU seconds per sample of the trainers and the host side, which with the engines'
simulated busy time bound a step from below. ``lengths``
(output tokens per prompt) is the default workload; ``--lengths FILE`` (JSONL with
``output_len`` per line, as ``bench stream`` takes) replaces it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.plugins.stream_generation.planner import (
    GenerationProfile,
    HardwarePool,
    PlanError,
    PlanMode,
    TrainingProfile,
    Workload,
    plan,
)
from rlweave.plugins.stream_generation.ranker import tail_first_order

TAIL_FRACTION = {PlanMode.ON_POLICY: 0.125, PlanMode.ASYNC: 1.0}  # rlweave's dispatch order per mode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, help="profiles JSON (see `rlweave bench stream`)")
    parser.add_argument("--devices", type=int, help="devices of the first pool (default: as in the profile)")
    parser.add_argument("--mode", choices=[m.value for m in PlanMode], default=PlanMode.ASYNC.value)
    parser.add_argument("--lengths", help="JSONL, one prompt per line with output_len (default: the profile's)")
    parser.add_argument("--prompts", type=int, default=0, help="prompts per step (default: every length once)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO group)")
    parser.add_argument("--minibatch", type=int, default=2, help="groups per PPO mini-batch")
    parser.add_argument("--seed", type=int, default=0, help="draws the step's prompts when --prompts is set")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _profile(entry: dict[str, Any] | None, cls: type, where: str) -> Any:
    if entry is None:
        return None
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
    except (TypeError, ValueError) as error:
        raise PlanError(f"{where}: {error}") from None


def load_pools(data: dict[str, Any], source: str, devices: int | None = None) -> list[HardwarePool]:
    """The hardware pools of a profile file; ``devices`` replaces the first pool's count."""
    pools = data.get("pools")
    if not isinstance(pools, list) or not pools:
        raise PlanError(f"{source}: needs \"pools\", a non-empty list of {{name, devices, generation, training}}")
    out = []
    for i, p in enumerate(pools):
        where = f"{source}: pools[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not isinstance(p.get("devices"), int):
            raise PlanError(f"{where} needs a string \"name\" and an integer \"devices\"")
        cpu_s = p.get("cpu_s_per_sample", 0.0)
        if not isinstance(cpu_s, int | float) or cpu_s < 0:
            raise PlanError(f"{where}.cpu_s_per_sample must be a number >= 0 (CPU seconds per sample where the "
                            f"host side shares the pool's cores; 0 or absent elsewhere), got {cpu_s!r}")
        out.append(HardwarePool(p["name"], devices if devices and i == 0 else p["devices"],
                                _profile(p.get("generation"), GenerationProfile, f"{where}.generation"),
                                _profile(p.get("training"), TrainingProfile, f"{where}.training"),
                                float(cpu_s)))
    return out


def read_lengths(path: str) -> list[int]:
    """Output lengths from JSONL (``{"output_len": N, ...}`` per line)."""
    lengths = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            length = int(json.loads(line)["output_len"])
        except (ValueError, KeyError, TypeError):
            raise PlanError(f"{path}:{number}: expected a JSON object with an integer output_len") from None
        if length < 1:
            raise PlanError(f"{path}:{number}: output_len must be positive, got {length}")
        lengths.append(length)
    if not lengths:
        raise PlanError(f"{path}: no lengths")
    return lengths


def step_workload(data: dict[str, Any], lengths: list[int], mode: PlanMode, args: argparse.Namespace) -> Workload:
    """One step's groups in the order rlweave dispatches them in ``mode`` (by the true lengths:
    the ranker learns a prompt's length once it has seen it)."""
    chosen = np.asarray(lengths, dtype=float)
    if args.prompts:
        chosen = np.random.default_rng(args.seed).choice(chosen, args.prompts, replace=args.prompts > len(chosen))
    if mode in TAIL_FRACTION:
        chosen = chosen[tail_first_order(chosen, TAIL_FRACTION[mode])]
    if len(chosen) < args.minibatch:
        raise PlanError(f"a step of {len(chosen)} prompts holds no mini-batch of {args.minibatch} groups: "
                        f"give more lengths or --prompts")
    try:
        return Workload(np.repeat(chosen[:, None], args.group, axis=1), args.minibatch,
                        float(data.get("weight_sync_s", 0.0)), float(data.get("dispatch_s", 0.0)),
                        float(data.get("delivery_s", 0.0)))
    except ValueError as error:
        raise PlanError(str(error)) from None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The best plan for the profile file and workload of ``args``, as a JSON-ready dict."""
    try:
        data = json.loads(Path(args.profile).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PlanError(f"{args.profile}: cannot read a JSON profile ({error})") from None
    mode = PlanMode(args.mode)
    pools = load_pools(data, args.profile, args.devices)
    lengths = read_lengths(args.lengths) if args.lengths else data.get("lengths")
    if not lengths:
        raise PlanError(f"{args.profile} has no \"lengths\": give --lengths FILE")
    best = plan(pools, step_workload(data, list(lengths), mode, args), mode)
    return {"mode": best.mode.value, "generation": best.generation, "training": best.training,
            "devices": {k: list(v) for k, v in best.devices.items()}, "step_s": best.step_s,
            "samples_per_s": best.samples_per_s, "generation_idle": best.generation_idle,
            "training_idle": best.training_idle, "simulated": True, "describe": best.describe()}
