"""verl's Megatron engine builds rlweave's layers (ReLibra's MoE layer, FLUX's overlapped linears).

verl 0.9 builds its Megatron model through a bridge in
``verl.utils.megatron_utils.make_megatron_module``, from a layer spec the bridge chooses, and
has no way to supply another. This wraps that function (the engine imports it when it builds,
so the module attribute is what it calls); for the duration of the call it puts
:func:`rlweave.adapters.megatron.layer_swap.with_rlweave_layers` around the bridge's spec:

- Megatron-Bridge (verl's default; ``provider`` given): ``provider.transformer_layer_spec``, a
  ``ModuleSpec`` or a function of the provider (and ``vp_stage``), as verl's own QAT swaps it;
- mbridge (``vanilla_mbridge=True``; ``bridge`` given, no ``provider``):
  ``bridge._get_transformer_layer_spec(vp_stage)`` on the bridge instance. mbridge builds it
  with TransformerEngine; where TE is not installed (a CPU machine) the same Megatron builder
  runs with the local backend instead, which is what TE's absence leaves. mbridge 0.15.1 also
  compares against a ``ModelType`` member megatron-core 0.18 removed; it gets a stand-in for
  the call.

Both are restored when the call returns. An mbridge bridge keeps one change past the call: its
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
        import verl.utils.megatron_utils as utils
    except ImportError:  # no megatron-core here, so verl cannot build a Megatron model in this process
        return lambda: None

    original = utils.make_megatron_module

    @functools.wraps(original)
    def make_megatron_module(*args: Any, **kwargs: Any) -> Any:
        call = inspect.signature(original).bind(*args, **kwargs)
        bridge, provider = call.arguments.get("bridge"), call.arguments.get("provider")
        if provider is not None:
            restore = _wrap_provider_spec(provider)
        elif bridge is not None:
            restore = _wrap_mbridge_spec(bridge)
        else:  # verl's bridge-less path (its engine asserts a bridge): nothing to wrap
            return original(*args, **kwargs)
        try:
            built = original(*args, **kwargs)
        finally:
            restore()
        if provider is None:
            export_logical_experts(bridge)
        return built

    utils.make_megatron_module = make_megatron_module

    def revert() -> None:
        utils.make_megatron_module = original

    return revert


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
