"""verl's Megatron engine builds rlweave's layers (ReLibra's MoE layer, FLUX's overlapped linears).

verl 0.9 builds its Megatron model through a bridge in
``verl.utils.megatron_utils.make_megatron_module``, from a layer spec the bridge chooses, and
has no way to supply another. This wraps that function (the engine imports it when it builds,
so the module attribute is what it calls); for the duration of the call it puts
:func:`rlweave.adapters.megatron.layer_swap.with_rlweave_layers` around the bridge's spec:

- Megatron-Bridge (verl's default; ``provider`` given): ``provider.transformer_layer_spec``, a
  ``ModuleSpec`` or a function of the provider (and ``vp_stage``), as verl's own QAT swaps it.
  While a plugin places experts (ReLibra) this path is refused at the build: Megatron-Bridge
  names experts by position when it loads and syncs weights, and is not patched here;
- mbridge (``vanilla_mbridge=True``; ``bridge`` given, no ``provider``):
  ``bridge._get_transformer_layer_spec(vp_stage)`` on the bridge instance. mbridge builds it
  with TransformerEngine; where TE is not installed (a CPU machine) the same Megatron builder
  runs with the local backend instead, which is what TE's absence leaves. mbridge 0.15.1 also
  compares against a ``ModelType`` member megatron-core 0.18 removed; it gets a stand-in for
  the call.

Both are restored when the call returns. A model that mbridge wraps in Megatron's DDP (a
training engine: ``wrap_config.wrap_with_ddp``) gets ReLibra's spare (replica) slots held out of
DDP and the optimizer (:mod:`rlweave.adapters.megatron.balanced_ddp`): before DDP wraps it (one
more ``post_model_creation_callbacks`` entry of ``bridge.get_model`` for the call), and released
once ``verl.utils.megatron.optimizer.get_megatron_optimizer`` (the engine's ``_build_optimizer``
imports it when it builds) has built the optimizer over the owners. The DDP settings the layer
cannot run under are refused there, naming verl's key, before the first step; so is the
layer-wise (Muon) optimizer. An mbridge bridge keeps one change past the call: its
``export_weights`` (verl's per-step weight sync to the rollout engine, ``get_per_tensor_param``)
and ``load_weights`` (the HF checkpoint at the start) name ``SequentialMLP`` experts by logical
id (:func:`export_logical_experts`): mbridge maps only grouped experts, by position, and after a
ReLibra move position is not identity.

Applied only while a plugin places experts or decides
TP linears (``rlweave.replay_balance``, ``rlweave.overlap``), and only where verl's Megatron
utilities import (megatron-core installed).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from rlweave.patches import Revert


def apply() -> Revert:
    try:
        import verl.utils.megatron.optimizer as optimizers
        import verl.utils.megatron_utils as utils
    except ImportError:  # no megatron-core here, so verl cannot build a Megatron model in this process
        return lambda: None

    original = utils.make_megatron_module
    original_optimizer = optimizers.get_megatron_optimizer

    @functools.wraps(original)
    def make_megatron_module(*args: Any, **kwargs: Any) -> Any:
        call = inspect.signature(original).bind(*args, **kwargs)
        bridge, provider = call.arguments.get("bridge"), call.arguments.get("provider")
        wrap_config = call.arguments["wrap_config"]
        if provider is not None:
            _refuse_expert_moves_on_megatron_bridge()
            restores = [_wrap_provider_spec(provider)]
        elif bridge is not None:
            restores = [_wrap_mbridge_spec(bridge)]
            if wrap_config.wrap_with_ddp:
                restores.append(_hold_out_in_mbridge(bridge, _spare_slots_hold_out(wrap_config)))
        else:  # verl's bridge-less path (its engine asserts a bridge): nothing to wrap
            return original(*args, **kwargs)
        try:
            built = original(*args, **kwargs)
        finally:
            for restore in reversed(restores):
                restore()
        if provider is None:
            export_logical_experts(bridge)
        return built

    @functools.wraps(original_optimizer)
    def get_megatron_optimizer(model: Any, config: Any) -> Any:
        optimizer = original_optimizer(model, config)
        release_held_out_slots(model)
        return optimizer

    utils.make_megatron_module = make_megatron_module
    optimizers.get_megatron_optimizer = get_megatron_optimizer

    def revert() -> None:
        utils.make_megatron_module = original
        optimizers.get_megatron_optimizer = original_optimizer

    return revert


# verl's key for a Megatron DDP setting (``override_ddp_config``, merged into the DDP config of the
# actor's or critic's engine), for balanced_ddp's refusals.
VERL_DDP_FIX = "set actor_rollout_ref.actor.megatron.override_ddp_config.{setting}=False (critic.megatron.… for a critic)"


def _spare_slots_hold_out(wrap_config: Any) -> Any:
    """What runs on each built model chunk before DDP wraps it: ReLibra's spare slots out of
    DDP's buffers (and so out of the optimizer verl builds next). The layer-wise (Muon)
    optimizer shards and steps experts in ways the layer's moves do not follow: refused here,
    before anything is wrapped."""
    from rlweave.adapters.megatron.balanced_ddp import hold_out_spare_slots
    from rlweave.adapters.megatron.balanced_moe import balanced_layers

    def hold_out(chunk: Any, **_: Any) -> None:  # mbridge also passes pre_process, post_process, configs
        if not balanced_layers(chunk):
            return
        if wrap_config.use_layer_wise_distributed_optimizer:
            raise NotImplementedError(
                "rlweave.replay_balance runs under Megatron's DistributedDataParallel with its Adam optimizer "
                "(distributed or not); verl's engine asked for use_layer_wise_distributed_optimizer=True (Muon), "
                "which it does not support yet: set actor_rollout_ref.actor.optim.use_layer_wise_distributed_optimizer"
                "=False, or disable rlweave.replay_balance")
        hold_out_spare_slots(chunk)

    return hold_out


def _hold_out_in_mbridge(bridge: Any, hold_out: Any) -> Any:
    """mbridge runs each of ``get_model``'s ``post_model_creation_callbacks`` on each chunk
    before it wraps DDP; verl builds that list itself, so ``hold_out`` joins it on the bridge
    instance, for the call. Returns what undoes it."""
    base = bridge.get_model
    had_own = "get_model" in vars(bridge)

    def get_model(*args: Any, post_model_creation_callbacks: Any = (), **kwargs: Any) -> Any:
        return base(*args, post_model_creation_callbacks=[*post_model_creation_callbacks, hold_out], **kwargs)

    bridge.get_model = get_model

    def restore() -> None:
        if had_own:
            bridge.get_model = base
        else:
            del bridge.get_model

    return restore


def release_held_out_slots(model: Any) -> None:
    """After verl's optimizer is built over ``model`` (its DDP chunks): the spare slots held out
    at the build compute gradients again, and DDP settings the layer cannot run under are
    refused, naming verl's key. A model without held-out layers (upstream's, a forward-only
    one, overlap's) is left alone."""
    from rlweave.adapters.megatron.balanced_ddp import release_spare_slots
    from rlweave.adapters.megatron.balanced_moe import balanced_layers

    chunks = model if isinstance(model, list | tuple) else [model]
    held = [chunk for chunk in chunks if any(layer.ddp_state == "held out" for layer in balanced_layers(chunk))]
    if held:
        release_spare_slots(held, VERL_DDP_FIX)


MEGATRON_BRIDGE_NAMES = (
    "rlweave.replay_balance cannot run on verl's Megatron-Bridge path (its default bridge) yet: Megatron-Bridge "
    "names each expert by its position (E / ep * ep_rank + local slot) when it loads the HF checkpoint and syncs "
    "weights to the rollout engine, and ReLibra moves experts between slots, so after a move the rollout engine "
    "would get other experts' weights; set actor_rollout_ref.actor.megatron.vanilla_mbridge=True (mbridge, whose "
    "export rlweave names by logical expert) with override_transformer_config.moe_grouped_gemm=False, or disable "
    "rlweave.replay_balance")


def _refuse_expert_moves_on_megatron_bridge() -> None:
    """While a plugin places experts, refuse Megatron-Bridge's build: its expert names are
    positional (``export_logical_experts`` covers mbridge only), and a wrong weight sync would
    train on as if nothing were wrong. Raised at the model build, before the first step, whichever
    door enabled the plugin."""
    from rlweave.adapters.megatron.layer_swap import places_experts
    from rlweave.host import get_host

    host = get_host()
    if host.active and places_experts(host):
        raise NotImplementedError(MEGATRON_BRIDGE_NAMES)


def _wrap_provider_spec(provider: Any) -> Any:
    """Megatron-Bridge: the provider resolves ``transformer_layer_spec`` lazily in ``provide()``
    (and for MTP), calling it with ``vp_stage`` when its signature takes one."""
    from rlweave.adapters.megatron.layer_swap import with_rlweave_layers

    base = provider.transformer_layer_spec

    def rlweave_layer_spec(config: Any, vp_stage: int | None = None) -> Any:
        spec = base
        if callable(base) and not hasattr(base, "submodules"):  # a function, not a ModuleSpec
            takes_stage = "vp_stage" in inspect.signature(base).parameters
            spec = base(config, vp_stage=vp_stage) if takes_stage else base(config)
        return with_rlweave_layers(spec, "Megatron-Bridge's layer spec (provider.transformer_layer_spec)")

    provider.transformer_layer_spec = rlweave_layer_spec

    def restore() -> None:
        provider.transformer_layer_spec = base

    return restore


def _wrap_mbridge_spec(bridge: Any) -> Any:
    """mbridge: its per-chunk model provider calls ``self._get_transformer_layer_spec(vp_stage)``."""
    from rlweave.adapters.megatron.layer_swap import with_rlweave_layers

    base = bridge._get_transformer_layer_spec
    had_own = "_get_transformer_layer_spec" in vars(bridge)
    restore_model_type = mbridge_model_type_compat()

    def rlweave_layer_spec(vp_stage: int | None = None) -> Any:
        spec = base(vp_stage) if _have_transformer_engine() else _local_block_spec(bridge.config, vp_stage)
        return with_rlweave_layers(spec, "mbridge's layer spec (_get_transformer_layer_spec)")

    bridge._get_transformer_layer_spec = rlweave_layer_spec

    def restore() -> None:
        restore_model_type()
        if had_own:
            bridge._get_transformer_layer_spec = base
        else:
            del bridge._get_transformer_layer_spec

    return restore


def mbridge_model_type_compat() -> Any:
    """mbridge 0.15.1's ``get_model`` compares against ``ModelType.encoder_and_decoder``, which
    megatron-core 0.18 removed (mbridge's main branch no longer does): it gets a stand-in
    member that no model has. Returns what undoes it (nothing where the member exists)."""
    import mbridge.core.util as mbridge_util

    model_type = mbridge_util.ModelType
    if hasattr(model_type, "encoder_and_decoder"):
        return lambda: None
    mbridge_util.ModelType = types.SimpleNamespace(encoder_or_decoder=model_type.encoder_or_decoder,
                                                   encoder_and_decoder=object())

    def restore() -> None:
        mbridge_util.ModelType = model_type

    return restore


def _have_transformer_engine() -> bool:
    from megatron.core.extensions.transformer_engine import HAVE_TE

    return HAVE_TE


def _local_block_spec(config: Any, vp_stage: int | None) -> Any:
    """The block spec mbridge asks Megatron for, with the local backend (TE absent)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage)


def export_logical_experts(bridge: Any) -> None:
    """Give ``bridge`` (mbridge) an ``export_weights`` that yields each ``SequentialMLP`` expert
    under its logical HF name, from its home slot (replicas skipped), and everything else as
    mbridge does; and a ``load_weights`` that reads each home slot's logical expert from the HF
    checkpoint. mbridge's own maps grouped experts only (``linear_fc1.weight<k>``, global id
    ``E / ep * rank + k``) and raises on ``local_experts``; the experts go through its own
    grouped-name conversion under the logical id instead. The instance keeps both: the bridge
    serves the model built with rlweave's layers."""
    original = bridge.export_weights
    if getattr(original, "rlweave_logical_experts", False):
        return

    def export_weights(models: Any) -> Any:
        return export_logical_weights(bridge, original, models)

    export_weights.rlweave_logical_experts = True  # type: ignore[attr-defined]
    bridge.export_weights = export_weights
    names = bridge._weight_name_mapping_mcore_local_to_global
    bridge._weight_name_mapping_mcore_local_to_global = lambda model, consider_ep=True: _logical_expert_names(
        names(model, consider_ep), model)


def _logical_expert_names(names: dict[str, str], model: Any) -> dict[str, str]:
    """mbridge's local -> global parameter names (what ``load_weights`` reads the HF checkpoint
    by) with each ``SequentialMLP`` home slot under its logical expert's grouped name and spare
    slots left out (replicas: refilled from their owners before use)."""
    from mbridge.core.util import unwrap_model

    from rlweave.adapters.megatron.logical_experts import home_layout

    for index, layer in enumerate(unwrap_model(model).decoder.layers):
        if not _has_sequential_experts(layer):
            continue
        layout, per_rank = home_layout(layer.mlp)
        first = layer.mlp.experts.ep_group.rank() * per_rank
        prefix = f"decoder.layers.{index}.mlp.experts.local_experts."
        for key in [key for key in names if key.startswith(prefix)]:
            local, rest = key[len(prefix):].split(".", 1)
            if int(local) < per_rank:
                expert = layout[first + int(local)]
                names[key] = f"decoder.layers.{layer.layer_number - 1}.mlp.experts.{rest}{expert}"
            else:
                del names[key]
    return names


def export_logical_weights(bridge: Any, original: Any, models: Any) -> Any:
    """mbridge's ``export_weights`` (``original``) over ``models`` without their
    ``SequentialMLP`` experts, then every logical expert under its grouped HF name."""
    from mbridge.core.util import unwrap_model

    models = unwrap_model(models if isinstance(models, list) else [models])
    layers = [[layer for layer in model.decoder.layers if _has_sequential_experts(layer)] for model in models]
    if not any(layers):
        yield from original(models)
        return
    if bridge.mpu.pp_size > 1 or bridge.mpu.etp_size > 1:
        raise NotImplementedError(
            "rlweave: exporting SequentialMLP experts by logical id (rlweave's layers in verl) needs pipeline and "
            "expert tensor parallel size 1 (an expert's weights would have to be gathered over those groups "
            "too); set pipeline_model_parallel_size=1 and expert_tensor_parallel_size=1, or disable the plugin")
    yield from original([_WithoutExperts(model, tuple(f"decoder.layers.{index}.mlp.experts.local_experts."
                                                      for index, layer in enumerate(model.decoder.layers)
                                                      if layer in chunk))
                         for model, chunk in zip(models, layers, strict=True)])
    yield from _logical_expert_weights(bridge, [layer for chunk in layers for layer in chunk])


def _has_sequential_experts(layer: Any) -> bool:
    from megatron.core.transformer.moe.experts import SequentialMLP

    return isinstance(getattr(getattr(layer, "mlp", None), "experts", None), SequentialMLP)


def _logical_expert_weights(bridge: Any, layers: list[Any]) -> Any:
    from rlweave.adapters.megatron.logical_experts import logical_experts

    for layer in layers:
        for expert, tensors in logical_experts(layer.mlp):
            for name, tensor in tensors.items():  # linear_fc1.weight, linear_fc2.weight
                grouped = f"decoder.layers.{layer.layer_number - 1}.mlp.experts.{name}{expert}"
                yield from zip(*bridge._weight_to_hf_format(grouped, tensor), strict=True)


class _WithoutExperts:
    """What mbridge's exporter reads of a model (``named_parameters``, ``state_dict``,
    ``decoder``), minus the parameters under ``hidden`` prefixes."""

    def __init__(self, model: Any, hidden: tuple[str, ...]) -> None:
        self._model, self._hidden = model, hidden
        self.decoder = model.decoder

    def named_parameters(self) -> Any:
        return ((n, p) for n, p in self._model.named_parameters() if not n.startswith(self._hidden))

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self._model.state_dict().items() if not k.startswith(self._hidden)}
