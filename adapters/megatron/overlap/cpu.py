"""Megatron tensor parallelism in CPU processes on gloo (tests, ``rlweave bench overlap``)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init_tensor_parallel(rank: int, world_size: int, port: int) -> None:
    """One CPU process of a TP=world_size group: one thread, gloo, Megatron's parallel state.
    Megatron allocates its gather buffers on ``torch.cuda.current_device()``, the CPU here."""
    torch.cuda.current_device = lambda: "cpu"
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)


def tp_config(world_size: int, hidden: int, ffn: int, heads: int, dtype: torch.dtype = torch.float32,
              **overrides: Any) -> Any:
    """A one-layer ``TransformerConfig`` with sequence parallelism on, initialised on CPU."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    options = dict(num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
                   tensor_model_parallel_size=world_size, sequence_parallel=True, use_cpu_initialization=True,
                   params_dtype=dtype, gradient_accumulation_fusion=False, hidden_dropout=0.0,
                   attention_dropout=0.0, bf16=dtype == torch.bfloat16, add_bias_linear=True)
    return TransformerConfig(**(options | overrides))
