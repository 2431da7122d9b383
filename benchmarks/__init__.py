"""Benchmarks behind ``rlweave bench <name>``: each runs the framework's own default and rlweave
side by side in one run, on the same workload, and reports ratios with their lower bounds.

A benchmark module provides ``add_arguments(parser)``, ``run(args) -> BenchResult`` and
``plot(result, path) -> path``, importing its framework only inside them; it is listed here
with the frameworks it needs, so the CLI can re-launch itself in the environment that has them.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BenchResult:
    """``headline``: the figures ``--json`` prints; ``rows``: the table (first row = header);
    ``regime``: the conditions measured in, in words; ``details``: everything else for the
    JSON file; ``events``: trace events for the plot (not written to the JSON)."""

    headline: dict[str, Any]
    rows: list[list[str]]
    regime: str
    details: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str
    needs: tuple[str, ...]  # imports it needs
    env: str  # the rlweave environment that has them
    summary: str

    def load(self) -> Any:
        return importlib.import_module(self.module)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.load().add_arguments(parser)

    def run(self, args: argparse.Namespace) -> BenchResult:
        return self.load().run(args)

    def plot(self, result: BenchResult, path: Path) -> Path:
        return self.load().plot(result, path)


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("overhead", "rlweave.benchmarks.overhead", ("vllm",), ".venv-vllm",
                  "hook dispatch cost, and vLLM tokens/s with rlweave absent, disabled, enabled"),
        Benchmark("moe", "rlweave.benchmarks.moe", ("numpy",), ".venv",
                  "ReLibra expert balancing vs static and EPLB on routing traces (modelled)"),
        Benchmark("agentic", "rlweave.benchmarks.agentic", ("verl", "vllm"), ".venv-verl",
                  "Heddle critical-path priority + placement vs verl's agent loop and balancer, per workload shape, with an oracle"),
        Benchmark("agentic-regimes", "rlweave.benchmarks.agentic_regimes", ("numpy",), ".venv",
                  "how much any trajectory scheduler could win, per workload regime (simulated)"),
        Benchmark("serving", "rlweave.benchmarks.serving", ("vllm",), ".venv-vllm",
                  "FastServe skip-join MLFQ vs vLLM FCFS: normalised latency under Poisson load"),
        Benchmark("stream", "rlweave.benchmarks.stream", ("verl", "vllm"), ".venv-verl",
                  "StreamRL stream generation (on-policy, async) vs verl's sync and one-step-off loops"),
        Benchmark("fusion-schedule", "rlweave.benchmarks.fusion_schedule", ("numpy",), ".venv",
                  "RLHFuse fused actor-critic pipeline schedule vs separate 1F1B and greedy, with the lower bound (simulated)"),
        Benchmark("fusion-executor", "rlweave.benchmarks.fusion_executor", ("torch", "transformers"), ".venv",
                  "RLHFuse fused actor-critic schedule vs separate 1F1B on real gloo pipeline stages (measured)"),
        Benchmark("fusion-inter", "rlweave.benchmarks.fusion_inter", ("verl", "vllm"), ".venv-verl",
                  "RLHFuse generation->inference fusion with long-tail migration vs verl's sync loop (PPO)"),
        Benchmark("overlap", "rlweave.benchmarks.overlap", ("megatron", "torch"), ".venv-mcore",
                  "FLUX overlapped TP linears: equality with Megatron's on gloo, modelled E_overlap, GPU check"),
        Benchmark("verl-baseline", "rlweave.benchmarks.verl_baseline", ("verl", "vllm"), ".venv-verl",
                  "verl's own GRPO trainer on CPU: seconds per step, stage shares, resume"),
        Benchmark("resilience", "rlweave.benchmarks.resilience", ("verl", "vllm"), ".venv-verl",
                  "MegaScale resilience: detection, recovery, lost work, overhead and ETTR vs verl's resume path"),
        Benchmark("plan", "rlweave.benchmarks.plan", ("numpy",), ".venv",
                  "rlweave plan's predictions against the CPU rig's stored bench results (not rerun; simulated)"),
    )
}
