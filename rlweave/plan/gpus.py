"""Default GPU profiles for the planner: published peak figures, each with its source.

Tags follow ``shared/research/planner_anchors.md`` §3: [P] published, [R] recalled or third
party only (check before relying on it), [A] assumed (nothing public supplies it). The planner
uses these as *ratios* between the device a trace was recorded on and the target (decode by HBM
bandwidth, prefill and training by dense FLOP/s); a measured profile in the cluster file
overrides a default, and should, where the user has one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator's peak figures. ``bf16_tflops``: dense (no 2:4 sparsity) BF16 TFLOP/s;
    ``hbm_tbs``: HBM bandwidth in TB/s; ``nvlink_gbs``: NVLink per GPU in GB/s, both directions
    together; ``network_gbs``: scale-out per GPU in GB/s (400 Gb/s = 50 GB/s); ``source``: where
    each figure comes from, with its tag."""

    name: str
    bf16_tflops: float
    hbm_tbs: float
    nvlink_gbs: float
    network_gbs: float
    memory_gb: float
    source: str


# the figures a measured profile may give (each overrides the default's)
FIGURES = ("bf16_tflops", "hbm_tbs", "nvlink_gbs", "network_gbs")


DEFAULTS: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("H100_SXM", 989.0, 3.35, 900.0, 50.0, 80.0,
               "[P] NVIDIA H100 datasheet (BF16 1,979 TFLOPS with sparsity, half without; HBM3 3.35 TB/s; "
               "NVLink 900 GB/s); glennklockwood.com/garden/processors/h100 (BF16 matrix 989.4); "
               "[P] Llama 3 report (400 Gb/s per GPU)"),
    GpuProfile("H800_SXM", 989.0, 3.35, 400.0, 50.0, 80.0,
               "[R] same GH100 configuration as H100 (third party); [R] NVLink 400 GB/s from trade press "
               "(philisun.com, aiwiki), ~160 GB/s achievable per deepseek-ai/DeepEP README; [P] DeepEP: CX7 "
               "400 Gb/s per GPU (~50 GB/s)"),
    GpuProfile("H200_SXM", 989.0, 4.8, 900.0, 50.0, 141.0,
               "[P] NVIDIA H200 launch (SC23) restated by aiwiki.ai and lzwjava (same die as H100, 141 GB HBM3e, "
               "4.8 TB/s); [P] mlcommons inference_results_v4.1 H200-SXM-141GBx8 (18x NVLink4, 900 GB/s); "
               "400 Gb/s per GPU"),
    GpuProfile("H20", 148.0, 4.0, 900.0, 25.0, 96.0,
               "[R] third party only (willitrunai.com, Geekbench-based press; no public NVIDIA datasheet): "
               "148 dense BF16 TFLOP/s, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s; [A] 200 Gb/s per GPU "
               "(SimAI's H20 example topologies)"),
    GpuProfile("A100_80GB", 312.0, 2.039, 600.0, 25.0, 80.0,
               "[P] NVIDIA A100 datasheet, restated in Calculon systems/a100_80g.json (312 TFLOP/s, NVLink "
               "300 GB/s per direction); [P] DGX A100 and MegaScale: 200 Gb/s HDR per GPU"),
)}


def profile(name: str) -> GpuProfile:
    """The default profile ``name``; a KeyError names the known ones."""
    if name not in DEFAULTS:
        raise KeyError(f"no default GPU profile {name!r}; known: {', '.join(DEFAULTS)}")
    return DEFAULTS[name]
