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

Both are restored when the call returns. Applied only while a plugin places experts or decides
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
            return original(*args, **kwargs)
        finally:
            restore()

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
