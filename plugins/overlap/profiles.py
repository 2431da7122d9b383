"""Device profiles for the timeline model: built-in ones, and JSON files that measurements write.

The built-in GPU profiles are estimates (datasheet link speeds, the bf16 GEMM rate measured on
this workplace's H200 through PyTorch, guessed latencies) until ``scripts/gpu_check_overlap.sh``
measures one on the device; ``cpu-gloo`` is what ``rlweave bench overlap`` measured here. A
measured profile is a JSON object with :class:`~.model.DeviceProfile`'s fields, passed as
``+rlweave.overlap.profile=<file>``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rlweave.plugins.overlap.model import DeviceProfile

_ESTIMATE = "estimate (datasheet link, GEMM rate from one PyTorch run); measure with scripts/gpu_check_overlap.sh"

BUILTIN: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile("h200-nvlink", _ESTIMATE, gemm_flops=788e12, gemm_half_rows=16, launch_s=5e-6,
                      link_bps=450e9, link_latency_s=10e-6, collective_bps=360e9, memory_bps=4.0e12,
                      overlap_slowdown=0.05, tile_efficiency=0.9, min_chunk_rows=128, sm_count=132),
        DeviceProfile("h100-nvlink", _ESTIMATE, gemm_flops=750e12, gemm_half_rows=16, launch_s=5e-6,
                      link_bps=450e9, link_latency_s=10e-6, collective_bps=360e9, memory_bps=3.0e12,
                      overlap_slowdown=0.05, tile_efficiency=0.9, min_chunk_rows=128, sm_count=132),
        DeviceProfile("a100-nvlink", _ESTIMATE, gemm_flops=280e12, gemm_half_rows=16, launch_s=5e-6,
                      link_bps=300e9, link_latency_s=10e-6, collective_bps=240e9, memory_bps=1.8e12,
                      overlap_slowdown=0.05, tile_efficiency=0.9, min_chunk_rows=128, sm_count=108),
        DeviceProfile("a100-pcie", _ESTIMATE, gemm_flops=280e12, gemm_half_rows=16, launch_s=5e-6,
                      link_bps=24e9, link_latency_s=15e-6, collective_bps=20e9, memory_bps=1.8e12,
                      overlap_slowdown=0.02, tile_efficiency=0.9, min_chunk_rows=128, sm_count=108),
        # Measured by `rlweave bench overlap` on the 2-core CPU machine (gloo over loopback).
        DeviceProfile("cpu-gloo", "rlweave bench overlap on the 2-core dev machine (gloo loopback)",
                      gemm_flops=60e9, gemm_half_rows=8, launch_s=20e-6, link_bps=1.5e9,
                      link_latency_s=60e-6, collective_bps=1.5e9, memory_bps=5e9,
                      overlap_slowdown=1.0, tile_efficiency=1.0, min_chunk_rows=1),
    )
}

# Device-name fragments -> built-in profile, first match wins.
BY_DEVICE = (("H200", "h200-nvlink"), ("H100", "h100-nvlink"), ("H800", "h100-nvlink"),
             ("A100", "a100-nvlink"), ("A800", "a100-nvlink"), ("cpu", "cpu-gloo"))
CUDA_FALLBACK = "a100-nvlink"


class ProfileError(ValueError):
    """A profile name or file the model cannot use."""


def for_device(device_name: str) -> DeviceProfile:
    for fragment, name in BY_DEVICE:
        if fragment.lower() in device_name.lower():
            return BUILTIN[name]
    return BUILTIN[CUDA_FALLBACK]


def load(spec: str, device_name: str) -> DeviceProfile:
    """``auto`` (by device name), a built-in name, or a JSON file of the profile's fields."""
    if spec == "auto":
        return for_device(device_name)
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file():
        raise ProfileError(f"rlweave.overlap.profile={spec!r} is neither a built-in profile "
                           f"({', '.join(BUILTIN)}), nor auto, nor an existing JSON file")
    data = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(DeviceProfile)}
    missing = sorted(f.name for f in dataclasses.fields(DeviceProfile)
                     if f.name not in data and f.default is dataclasses.MISSING)
    if missing:
        raise ProfileError(f"profile {path} lacks {', '.join(missing)}")
    return DeviceProfile(**{k: v for k, v in data.items() if k in fields})


def dump(profile: DeviceProfile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(profile), indent=2))
    return path
