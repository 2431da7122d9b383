"""Megatron-core adapter, reached through a spec provider rather than a patch.

``layer_spec(...)`` returns Megatron's own GPT layer spec with the MoE layer class swapped for
:class:`rlweave.adapters.megatron.moe_layer.RlweaveMoELayer` when an rlweave plugin is enabled
(:class:`rlweave.adapters.megatron.balanced_moe.ReplayBalancedMoELayer` when a plugin decides
expert placement, e.g. ``rlweave.replay_balance``), and Megatron's spec unchanged when none is
(disabled means absent). While a plugin decides how TP linears run (``rlweave.overlap``), its
column- and row-parallel linears are :mod:`rlweave.adapters.megatron.overlap`'s. Use it wherever
Megatron takes a layer spec::

    from rlweave.adapters.megatron import layer_spec
    spec = layer_spec(num_experts=8, moe_grouped_gemm=False)
    model = GPTModel(config, transformer_layer_spec=spec, ...)
"""

from __future__ import annotations

import functools
from typing import Any

from rlweave.host import get_host
from rlweave.types import FrameworkInfo

_announced = False


def layer_spec(num_experts: int | None = None, moe_grouped_gemm: bool = False, **kwargs: Any) -> Any:
    """Megatron's ``get_gpt_layer_local_spec(num_experts, moe_grouped_gemm, **kwargs)`` with
    rlweave's MoE layer in it while a plugin is enabled."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm, **kwargs)
    host = get_host()
    if host.active and host.implements("rlweave_tp_linear_impl"):
        _announce(host)
        from rlweave.adapters.megatron.overlap.spec import with_overlap_linears

        spec = with_overlap_linears(spec)  # TP linears that overlap their collective (rlweave.overlap)
    if not host.active or num_experts is None:
        return spec
    _announce(host)
    from rlweave.adapters.megatron.moe_layer import RlweaveMoELayer

    layer_cls = RlweaveMoELayer
    if host.implements("rlweave_expert_step_placement") or host.implements("rlweave_expert_microbatch_placement"):
        from rlweave.adapters.megatron.balanced_moe import ReplayBalancedMoELayer

        layer_cls = ReplayBalancedMoELayer
    mlp = spec.submodules.mlp
    spec.submodules.mlp = functools.partial(layer_cls, *mlp.args, **mlp.keywords)
    return spec


def moe_submodules(num_experts: int, moe_grouped_gemm: bool = False) -> Any:
    """The ``MoESubmodules`` (router, experts) of Megatron's local spec, for building a MoE
    layer on its own."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm)
    return spec.submodules.mlp.keywords["submodules"]


def _announce(host: Any) -> None:
    global _announced
    if _announced:
        return
    from rlweave.frameworks import require_supported

    version = require_supported("megatron-core")
    _announced = True
    host.hook.rlweave_framework_loaded(framework=FrameworkInfo("megatron-core", version, "trainer"))
