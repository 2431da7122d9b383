"""rlweave's layers put into a Megatron spec that someone else built (a bridge's, verl's).

:func:`rlweave.adapters.megatron.layer_spec` builds a spec with rlweave's layers in it; a
framework that builds its own spec (verl through Megatron-Bridge or mbridge) gets them from
:func:`with_rlweave_layers` instead, applied to the spec it built
(``rlweave.patches.verl_megatron_layer_spec``). The swap is by class, wherever a class appears
in the spec (``ModuleSpec``\\s, submodule dataclasses such as a block's ``layer_specs``, and
``functools.partial`` builders such as Megatron's MoE layer), so layer and block specs alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from rlweave.host import get_host


def swap_classes(spec: Any, swaps: dict[type, type]) -> Any:
    """``spec`` with every class that is a key of ``swaps`` replaced by its value (exact class,
    not subclasses: a subclass is someone's deliberate choice)."""
    return _map_classes(spec, lambda cls: swaps.get(cls, cls))


def contains_class(spec: Any, wanted: type) -> bool:
    """Whether ``wanted`` appears anywhere in ``spec`` (the walk of :func:`swap_classes`)."""
    seen: set[type] = set()
    _map_classes(spec, lambda cls: seen.add(cls) or cls)
    return wanted in seen


def _map_classes(spec: Any, on_class: Callable[[type], type]) -> Any:
    from megatron.core.transformer.spec_utils import ModuleSpec

    def walk(item: Any) -> Any:
        if isinstance(item, type):
            return on_class(item)
        if isinstance(item, ModuleSpec):
            return dataclasses.replace(item, module=walk(item.module), submodules=walk(item.submodules))
        if isinstance(item, functools.partial):
            return functools.partial(walk(item.func), *map(walk, item.args),
                                     **{k: walk(v) for k, v in item.keywords.items()})
        if isinstance(item, list | tuple):
            return type(item)(map(walk, item))
        if dataclasses.is_dataclass(item):
            return dataclasses.replace(item, **{f.name: walk(getattr(item, f.name))
                                                for f in dataclasses.fields(item) if f.init})
        return item

    return walk(spec)


def places_experts(host: Any) -> bool:
    return host.implements("rlweave_expert_step_placement") or host.implements("rlweave_expert_microbatch_placement")


def decides_tp_linears(host: Any) -> bool:
    return host.implements("rlweave_tp_linear_impl")


def rlweave_swaps() -> dict[type, type]:
    """Megatron's classes and rlweave's in their place, for the plugins enabled here: the
    ReLibra MoE layer while a plugin places experts, the overlapped TP linears while a plugin
    decides how TP linears run (rlweave.overlap); empty when neither."""
    host = get_host()
    swaps: dict[type, type] = {}
    if host.active and places_experts(host):
        from megatron.core.transformer.moe.moe_layer import MoELayer

        from rlweave.adapters.megatron.balanced_moe import ReplayBalancedMoELayer

        swaps[MoELayer] = ReplayBalancedMoELayer
    if host.active and decides_tp_linears(host):
        from rlweave.adapters.megatron.overlap.spec import SWAPS

        swaps |= SWAPS
    return swaps


def with_rlweave_layers(spec: Any, where: str) -> Any:
    """``spec`` (a layer or block spec) with rlweave's layers in place of Megatron's, for the
    enabled plugins. A plugin whose Megatron class is not in ``spec`` is refused, naming
    ``where`` the spec came from: it would otherwise run as if enabled and change nothing."""
    swaps = rlweave_swaps()
    for megatron_cls, ours in swaps.items():
        if not contains_class(spec, megatron_cls):
            raise NotImplementedError(
                f"rlweave: {where} has no {megatron_cls.__name__} for {ours.__name__} to replace "
                f"({_why(megatron_cls)}); {_fix(megatron_cls)}")
    return swap_classes(spec, swaps)


def _why(megatron_cls: type) -> str:
    if megatron_cls.__name__ == "MoELayer":
        return "rlweave.replay_balance balances the experts of Megatron's MoE layers; the model has none"
    return ("rlweave.overlap replaces Megatron's local tensor-parallel linears; a TransformerEngine spec "
            "fuses them into TE modules")


def _fix(megatron_cls: type) -> str:
    if megatron_cls.__name__ == "MoELayer":
        return "use a MoE model or disable rlweave.replay_balance"
    return "disable rlweave.overlap (docs/overlap.md says where it runs)"
