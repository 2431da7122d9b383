"""What lets verl's own Megatron engine (``actor.strategy=megatron``, vanilla mbridge) train on this
CPU machine: stand-ins for a GPU and for the GPU-only packages verl's spec and bridge assume. Test
harness only: never shipped, never imported by rlweave.

verl imports this module in each of its processes (``VERL_USE_EXTERNAL_MODULES=cpu_stand_ins``,
verl's own switch, read at ``import verl``); it changes nothing until verl's Megatron engine module
(``verl.workers.engine.megatron.transformer_impl``) is imported, which only the trainer's workers
and the driver's task runner do, so the rollout engines (vLLM) never see it. Then, in that process:

- **CUDA calls** (there is no GPU): ``torch.cuda.current_device()`` is the CPU, where Megatron
  allocates its router, DDP buffers and optimizer state; the CUDA RNG that verl seeds through
  Megatron's model-parallel tracker (``verl/workers/engine/megatron/utils.py``) is the CPU
  generator; Megatron's ``alltoall`` dispatcher and DDP's gradient sync get no CUDA stream
  (:func:`rlweave.adapters.megatron.cpu.alltoall_without_cuda_streams`,
  :func:`~rlweave.adapters.megatron.cpu.ddp_without_cuda`); literal ``device="cuda"`` tensors
  (the optimizers' loss scale, ``clip_grads``, the schedule's token count) are made on the CPU,
  ``Tensor.type()`` answers the CUDA names Megatron's optimizers check, and ``Tensor.cuda()``
  (mbridge's ``get_model``) keeps a tensor where it is. That device mode is a
  ``TorchFunctionMode``, which is per thread, so every method of verl's ``MegatronEngine`` enters
  it on the thread that calls it (and leaves it entered there).
- **TransformerEngine** (not installable without CUDA): mbridge builds its layer spec with TE;
  here the same Megatron builder runs with the local backend, as rlweave's layer-spec patch does
  where TE is absent. The local spec keeps each layer's input norm apart, which TE fuses into the
  QKV linear: mbridge's HF names get the fused name's mapping for it. Megatron's local attention
  takes a ``[b, 1, s, s]`` mask where TE and flash-attention take the ``[b, s]`` padding mask that
  verl's bshd path (``use_remove_padding=False``, the local attention cannot take packed
  sequences) passes; verl right-pads each sequence, so the causal mask alone gives every real
  token the same attention, and the padding mask is dropped there.
- **mbridge 0.15.1 on megatron-core 0.18** (verl's pairing): mbridge compares against a
  ``ModelType`` member 0.18 removed (rlweave's patch's stand-in for it, for upstream's build too),
  and names ``SequentialMLP`` experts (``moe_grouped_gemm=False``, which ReLibra needs and the
  comparison run keeps) not at all: upstream's experts get mbridge's grouped names by position
  (``E / ep * ep_rank + local``), what mbridge does for grouped experts, so the run without
  rlweave loads the checkpoint's experts and syncs them to vLLM as a grouped model would.
- ``RLWEAVE_TEST_MEGATRON_FP32=1``: the engine computes in fp32 (verl's engine config accepts
  bf16 and fp16 only; this is set after its check), so that two runs compare at fp32 tolerance.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import re
import sys
import threading
from typing import Any

ENGINE_MODULE = "verl.workers.engine.megatron.transformer_impl"
FP32_ENV = "RLWEAVE_TEST_MEGATRON_FP32"

_thread = threading.local()
_mode: Any = None


def _device_mode() -> Any:
    """rlweave's CPU device mode for Megatron's DDP and optimizers, with ``Tensor.cuda()`` kept
    where the tensor is."""
    from rlweave.adapters.megatron.cpu import _CudaDevicesOnCpu, ddp_without_cuda

    class CudaOnCpu(_CudaDevicesOnCpu):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if getattr(func, "__name__", "") == "cuda":  # Tensor.cuda(device)
                return args[0]
            return super().__torch_function__(func, types, args, kwargs)

    ddp_without_cuda()
    return CudaOnCpu()


def _enter_device_mode() -> None:
    global _mode
    if getattr(_thread, "entered", False):
        return
    if _mode is None:
        _mode = _device_mode()
    _mode.__enter__()  # left entered: the thread runs the engine from now on
    _thread.entered = True


def _cuda_rng_on_cpu() -> None:
    import torch
    from megatron.core.tensor_parallel import random

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)


def _local_spec_in_mbridge() -> None:
    from mbridge.core.bridge import Bridge
    from mbridge.core.llm_bridge import LLMBridge
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from rlweave.patches.verl_megatron_layer_spec import mbridge_model_type_compat

    LLMBridge._get_transformer_layer_spec = lambda self, vp_stage=None: get_gpt_decoder_block_spec(
        self.config, use_transformer_engine=False, vp_stage=vp_stage)
    mbridge_model_type_compat()

    to_hf = Bridge._weight_name_mapping_mcore_to_hf

    def mcore_to_hf(self: Any, name: str) -> list[str]:
        return to_hf(self, name.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"))

    Bridge._weight_name_mapping_mcore_to_hf = mcore_to_hf

    local_to_global = Bridge._weight_name_mapping_mcore_local_to_global
    sequential = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")

    def mcore_local_to_global(self: Any, model: Any, consider_ep: bool = True) -> dict[str, str]:
        names = local_to_global(self, model, consider_ep=False)
        experts = self.config.num_moe_experts or 0
        first = experts // self.mpu.ep_size * self.mpu.ep_rank if consider_ep else 0
        for key, value in names.items():
            if match := sequential.search(value):
                names[key] = f"{value[:match.start()]}.mlp.experts.{match.group(2)}.weight{first + int(match.group(1))}"
            elif ".mlp.experts.linear_fc" in value:  # grouped: mbridge's own EP numbering
                prefix, local = value.split(".weight")
                names[key] = f"{prefix}.weight{first + int(local)}"
        return names

    Bridge._weight_name_mapping_mcore_local_to_global = mcore_local_to_global


def _no_padding_mask_in_local_attention() -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    attend = DotProductAttention.forward

    def forward(self: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if attention_mask is not None and attention_mask.dim() == 2:  # verl's [b, s] padding mask
            attention_mask = None
        return attend(self, query, key, value, attention_mask, *args, **kwargs)

    DotProductAttention.forward = forward


def _engine_on_cpu(engine_cls: type) -> None:
    for name, method in list(vars(engine_cls).items()):
        if inspect.isfunction(method) and (name == "__init__" or not name.startswith("__")):
            setattr(engine_cls, name, _in_device_mode(method))
    if os.environ.get(FP32_ENV) == "1":
        init = engine_cls.__init__

        @functools.wraps(init)
        def fp32_init(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            object.__setattr__(self.engine_config, "dtype", "float32")  # read when the model is built

        engine_cls.__init__ = fp32_init


def _in_device_mode(method: Any) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        _enter_device_mode()
        return method(*args, **kwargs)

    return call


def apply(engine_module: Any) -> None:
    from rlweave.adapters.megatron.cpu import alltoall_without_cuda_streams

    _cuda_rng_on_cpu()
    alltoall_without_cuda_streams()
    _local_spec_in_mbridge()
    _no_padding_mask_in_local_attention()
    _engine_on_cpu(engine_module.MegatronEngine)


class _WhenEngineImported(importlib.abc.MetaPathFinder):
    """Runs :func:`apply` on verl's Megatron engine module right after it is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != ENGINE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_apply(module: Any) -> None:
            exec_module(module)
            apply(module)
            for hook in AFTER_APPLY:
                hook(module)

        spec.loader.exec_module = exec_and_apply
        return spec


AFTER_APPLY: list[Any] = []  # what else runs on the engine module once the stand-ins are in (the test's probe)

if ENGINE_MODULE in sys.modules:
    apply(sys.modules[ENGINE_MODULE])
else:
    sys.meta_path.insert(0, _WhenEngineImported())
