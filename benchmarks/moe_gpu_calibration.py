"""GPU calibration of ``bench moe``'s cost model, for a lent NVIDIA machine (call
:func:`calibrate_token_s` from ``scripts/gpu_check.py``; CPU runs never import it).

The modelled comparison rests on ``CostModel.token_s``, the time one token takes through one
expert (forward and backward), against weight copies of ``expert_bytes`` over NVLink or the
network. Its default (2 us) is a guess; this measures it for the default expert shape
(hidden 4096, ffn 1408, SwiGLU, bf16), so the model's trade-off between copies and compute can
be checked. Link speeds need two GPUs and are not measured here.
"""

from __future__ import annotations


def calibrate_token_s(hidden: int = 4096, ffn: int = 1408, tokens: int = 4096, iters: int = 20) -> dict:
    """Median CUDA-event time of one expert's forward+backward over ``tokens`` tokens, per token,
    and the byte size of that expert: {"token_s": ..., "expert_bytes": ..., "tokens": ...}."""
    import statistics

    import torch

    gate_up = torch.randn(2 * ffn, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    down = torch.randn(hidden, ffn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        gate, up = (x @ gate_up.t()).chunk(2, dim=-1)
        (torch.nn.functional.silu(gate) * up @ down.t()).sum().backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return {"token_s": statistics.median(times) / tokens, "expert_bytes": 3 * hidden * ffn * 2, "tokens": tokens}
