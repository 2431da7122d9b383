"""What ``rlweave doctor`` says about the overlap backends in a Megatron environment (run as
``python -m rlweave.adapters.megatron.overlap.report``; prints one JSON object).

It probes this machine's device as a TP8 group would see it (NCCL on CUDA, gloo on CPU) and asks
the overlap plugin, enabled with this environment's ``RLWEAVE__OVERLAP__*`` settings, how it
would run the first MLP linear of a 70B-class layer (hidden 8192, ffn 28672, gated) at 4096
tokens.
"""

from __future__ import annotations

import json

import torch

from rlweave.adapters.megatron.overlap.probe import _probe
from rlweave.config import Setting
from rlweave.host import activate
from rlweave.types import LinearInfo


def report() -> dict:
    if torch.cuda.is_available():
        device = _probe("cuda", "nccl", min(8, torch.cuda.device_count()))
    else:
        device = _probe("cpu", "gloo", 8)
    host = activate([Setting("overlap.enable", True, "rlweave doctor")], export_env=False)
    linear = LinearInfo("column", 8192, 2 * 28672, 8, 0, True, 4096, 2, device)
    try:
        plan = host.hook.rlweave_tp_linear_impl(linear=linear)
        chosen = (f"{plan.backend} ({plan.forward.chunks_per_rank} piece(s) per rank; model "
                  f"{plan.forward.predicted_s * 1e3:.3f} ms vs {plan.forward.sequential_s * 1e3:.3f} ms "
                  f"sequential)") if plan else "Megatron's own (no backend beats the collective + GEMM here)"
    except ValueError as error:
        chosen = f"error: {error}"
    return {"device": f"{device.name} ({device.comm_backend})", "backends": list(device.backends),
            "missing": list(device.missing), "chosen": chosen}


if __name__ == "__main__":
    print(json.dumps(report()))
