"""Megatron-core MoE layers in CPU processes on gloo: tests, benchmarks and CPU development.

Megatron allocates some buffers on ``torch.cuda.current_device()`` (router.py, mappings.py);
on a CPU-only machine that device is the CPU. With the ``allgather`` dispatcher and
``SequentialMLP`` experts nothing else needs a GPU; the ``alltoall`` dispatcher also needs
:func:`alltoall_without_cuda_streams` (see the megatron EP spike notes).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init_expert_parallel(rank: int, world_size: int, port: int, ep: int | None = None) -> None:
    """One CPU process of ``world_size`` gloo ranks: one thread, Megatron's parallel state with
    expert parallelism ``ep`` (default: every rank), so ``world_size / ep`` expert-data-parallel
    replicas."""
    torch.cuda.current_device = lambda: "cpu"
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep or world_size)


def alltoall_without_cuda_streams() -> None:
    """Let Megatron's ``alltoall`` dispatcher run on CPU: it creates a CUDA stream in its
    constructor and moves the split sizes to the host on it (token_dispatcher.py:468, :913).
    On CPU there is no stream; the splits only need to become the Python lists gloo's
    ``all_to_all_single`` takes. Stands in for the GPU, nothing else (CPU processes only)."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    def host_splits(self: Any, point: str, tokens_per_expert: torch.Tensor | None = None) -> Any:
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            for name in ("input_splits", "output_splits", "output_splits_tp"):
                value = getattr(self, name)
                if torch.is_tensor(value):
                    setattr(self, name, value.tolist())
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = object()
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = host_splits


def moe_config(experts: int, top_k: int, hidden: int, ffn: int, ep: int, **overrides: Any) -> Any:
    """A one-layer fp32 ``TransformerConfig`` for a MoE layer on CPU with replayable routing."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    options = dict(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=4,
        num_moe_experts=experts, moe_router_topk=top_k, moe_ffn_hidden_size=ffn,
        moe_token_dispatcher_type="allgather", moe_grouped_gemm=False, add_bias_linear=False,
        use_cpu_initialization=True, params_dtype=torch.float32, gradient_accumulation_fusion=False,
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_enable_routing_replay=True,
        expert_model_parallel_size=ep,
    )
    return TransformerConfig(**(options | overrides))


class _CudaDevicesOnCpu(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "type" and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)  # the names Megatron checks
        if "cuda" in str(kwargs.get("device", "")):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def ddp_without_cuda() -> torch.overrides.TorchFunctionMode:
    """Let Megatron's DistributedDataParallel and its non-distributed optimizers run on CPU:
    tensors they create with a literal ``device="cuda"`` (optimizer.py's loss scale, clip_grads)
    are made on the CPU, ``Tensor.type()`` answers the CUDA type names their checks expect
    (clip_grads.py, optimizer.py), and the gradient sync's ``torch.cuda.current_stream()``
    (param_and_grad_buffer.py, waited on only for CUDA-graph events) is a stand-in. Returns the
    device mode, to enter on the thread that trains (a ``TorchFunctionMode`` is thread-local).
    Stands in for the GPU, nothing else (CPU processes only)."""
    torch.cuda.current_stream = lambda *args, **kwargs: object()
    return _CudaDevicesOnCpu()
