"""One rank of verl's own Megatron model build (``make_megatron_module``, the vanilla-mbridge
path) on gloo, with rlweave's layer-spec patch when ``import verl`` applied it.

``import verl`` loads rlweave through verl's entry point; with ``rlweave.replay_balance`` or
``rlweave.overlap`` enabled it applies ``rlweave.patches.verl_megatron_layer_spec``. The worker
then does what verl's engine does with ``vanilla_mbridge=True`` (``transformer_impl.py``):
``AutoBridge.from_config`` on the tiny Qwen2-MoE, ``set_extra_args`` with the CPU overrides,
``make_megatron_module`` (no DDP: verl's forward-only engines). It records the classes of the
built model's MoE layers and linears.

Upstream's spec needs TransformerEngine, which cannot be installed on CPU, so wherever mbridge's
own spec is built here (the unpatched function), :func:`te_stand_in` gives it the same Megatron
builder with the local backend; it stands in for TE, nothing else. mbridge 0.15.1 cannot build on
megatron-core 0.18 at all (a removed ``ModelType`` member); the unpatched build gets the patch's
stand-in for it too. With the patch applied it
also builds upstream's model through the unpatched function, gives rlweave's the same weights
and runs one forward and backward through both (no expert moves: no step plan). Writes
``<out>/rank<r>.pt``.

Usage: [TINY_MODEL=tiny-llama] verl_layer_spec_worker.py WORLD_SIZE OUT PORT   (EP = WORLD_SIZE)
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

import torch
import torch.distributed as dist

from rlweave.adapters.megatron.cpu import alltoall_without_cuda_streams, ddp_without_cuda, init_expert_parallel
from rlweave.patches.verl_megatron_layer_spec import mbridge_model_type_compat
from ranks import start_ranks

# verl's CPU overrides for the vanilla-mbridge path (no TE, apex or fused kernels; fp32 so that
# upstream's and rlweave's models compare within fp32 tolerance; no dropout).
CPU_OVERRIDES = dict(
    attention_backend="local", masked_softmax_fusion=False, persist_layer_norm=False,
    bias_activation_fusion=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    apply_rope_fusion=False, moe_grouped_gemm=False, moe_permute_fusion=False, moe_shared_expert_overlap=False,
    use_cpu_initialization=True, moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
    hidden_dropout=0.0, attention_dropout=0.0,
)
TOKENS = 24


def te_stand_in(bridge) -> None:
    """mbridge's spec builder with the local backend in place of TransformerEngine (CPU only)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    bridge._get_transformer_layer_spec = lambda vp_stage=None: get_gpt_decoder_block_spec(
        bridge.config, use_transformer_engine=False, vp_stage=vp_stage)


def make_bridge():
    """What verl's engine builds for ``vanilla_mbridge=True`` (transformer_impl.py), for the
    tiny model ``TINY_MODEL`` (default tiny-qwen2moe)."""
    from transformers import AutoConfig
    from verl.models.mcore.mbridge import AutoBridge

    from rlweave.tiny_models import ensure_tiny_model

    name = os.environ.get("TINY_MODEL", "tiny-qwen2moe")
    bridge = AutoBridge.from_config(AutoConfig.from_pretrained(ensure_tiny_model(name)), dtype=torch.float32)
    bridge.set_extra_args(**CPU_OVERRIDES)
    return bridge


def build(function) -> torch.nn.Module:
    """verl's model build: ``function`` is (patched or not) ``make_megatron_module``."""
    return build_with_bridge(function)[0]


def build_with_bridge(function, wrap_config=None, **options) -> tuple[torch.nn.Module, object]:
    """:func:`build`'s model and the bridge that built it; ``wrap_config`` (verl's
    ``McoreModuleWrapperConfig``, default: no DDP, as verl's forward-only engines) and
    ``options`` (``override_ddp_config``, ...) as verl's engine passes them."""
    from verl.utils.megatron_utils import McoreModuleWrapperConfig

    bridge = make_bridge()
    upstream = not hasattr(function, "__wrapped__")
    if upstream:  # mbridge's own spec: TE stands in as the local backend
        te_stand_in(bridge)
    undo = mbridge_model_type_compat() if upstream else lambda: None  # mbridge 0.15.1 on megatron-core 0.18
    try:
        model, _ = function(wrap_config or McoreModuleWrapperConfig(wrap_with_ddp=False), bridge.config,
                            bridge.hf_config, bridge=bridge, **options)
    finally:
        undo()
    if not upstream:  # the patch's changes to the bridge for the call are undone
        assert "_get_transformer_layer_spec" not in vars(bridge) and "get_model" not in vars(bridge)
    return model[0], bridge


def megatron_bridge_branch(config) -> dict:
    """The patch's Megatron-Bridge branch on a stand-in provider (Megatron-Bridge needs Python
    3.12 and CUDA packages): its ``transformer_layer_spec`` is a function of the provider and
    ``vp_stage``, as GPTModelProvider's may be; the local backend stands in for TE."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from rlweave.patches.verl_megatron_layer_spec import _wrap_provider_spec

    def bridge_spec(provider, vp_stage=None):
        return get_gpt_decoder_block_spec(provider, use_transformer_engine=False, vp_stage=vp_stage)

    provider = types.SimpleNamespace(transformer_layer_spec=bridge_spec)
    restore = _wrap_provider_spec(provider)
    spec = provider.transformer_layer_spec(config, vp_stage=None)  # as GPTModelProvider.provide calls it
    restore()
    return {"mlp": [layer.submodules.mlp.func.__name__ for layer in spec.layer_specs],
            "restored": provider.transformer_layer_spec is bridge_spec}


def megatron_bridge_build(patched) -> str:
    """The patched ``make_megatron_module`` on Megatron-Bridge's path (a stand-in provider, as
    above): what it raises. While a plugin places experts rlweave refuses it before anything is
    built; otherwise verl goes on to import Megatron-Bridge, which is not installed here."""
    from verl.utils.megatron_utils import McoreModuleWrapperConfig

    try:
        patched(McoreModuleWrapperConfig(), None, None, bridge=object(),
                provider=types.SimpleNamespace(transformer_layer_spec=None))
    except Exception as error:  # the refusal, or verl's import of Megatron-Bridge
        return f"{type(error).__name__}: {error}"
    raise AssertionError("a Megatron-Bridge build without Megatron-Bridge returned")


def classes(model: torch.nn.Module) -> dict:
    return {"mlp": [type(layer.mlp).__name__ for layer in model.decoder.layers],
            "linears": sorted({type(m).__name__ for m in model.modules() if "ParallelLinear" in type(m).__name__})}


def forward_backward(model: torch.nn.Module, tokens: torch.Tensor, weights: torch.Tensor) -> dict:
    positions = torch.arange(tokens.shape[1])[None].expand_as(tokens)
    with ddp_without_cuda():  # Megatron's default causal mask is made on device="cuda"
        logits = model(tokens, positions, attention_mask=None)
    (logits * weights).sum().backward()
    return {"logits": logits.detach(),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


def compare_with_upstream(rank: int, ours: torch.nn.Module, patched) -> dict:
    """Upstream's model (the unpatched function) and rlweave's, same weights, one step's
    forward and backward on this rank's tokens."""
    reference = build(patched.__wrapped__)
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    gen = torch.Generator().manual_seed(100 + rank)
    tokens = torch.randint(0, reference.vocab_size, (2, TOKENS // 2), generator=gen)
    weights = torch.randn(2, TOKENS // 2, ours.vocab_size, generator=gen)
    balanced = [layer.mlp for layer in ours.decoder.layers]
    return {"missing": missing, "unexpected": unexpected, "classes_reference": classes(reference),
            "reference": forward_backward(reference, tokens, weights), "rlweave": forward_backward(ours, tokens, weights),
            "replica_slots": sum(int((layer.last_physical_to_logical >= 0).sum()) - layer.topology.num_logical_experts
                                 for layer in balanced),
            "homes": [layer.physical_to_logical.tolist() for layer in balanced]}


def start_rank(rank: int, world_size: int, port: int, ep: int | None = None):
    """This rank of a gloo world of EP groups of ``ep`` ranks (default: one of every rank) with
    the CPU shims, and verl imported: returns verl's ``make_megatron_module`` as rlweave's entry
    point left it (patched or not)."""
    init_expert_parallel(rank, world_size, port, ep=ep)
    alltoall_without_cuda_streams()
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self  # mbridge's get_model moves chunks to the GPU
    from megatron.core import tensor_parallel

    # Attention's dropout forks the CUDA RNG state (dropout is 0 here)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    import verl  # noqa: F401  (rlweave's entry point applies its patches)
    import verl.utils.megatron_utils as utils

    return utils.make_megatron_module


def run(rank: int, world_size: int, out: str, port: int) -> None:
    patched = start_rank(rank, world_size, port)
    record: dict = {"patched": hasattr(patched, "__wrapped__")}
    if record["patched"]:
        record["megatron_bridge_build"] = megatron_bridge_build(patched)
    torch.manual_seed(0)
    try:
        model = build(patched)
    except Exception as error:  # a refusal (or a failure) is what this rank reports
        record["error"] = f"{type(error).__name__}: {error}"
    else:
        record["classes"] = classes(model)
        if record["patched"] and record["classes"]["mlp"][0] == "ReplayBalancedMoELayer":
            record |= compare_with_upstream(rank, model, patched)
            record["megatron_bridge"] = megatron_bridge_branch(model.config)
    torch.save(record, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
