"""One rank of verl's training-engine build with ReLibra's layers: Megatron's DDP and distributed
optimizer as verl's Megatron engine builds them, at EP 2 x expert-data-parallel 2 (four gloo
processes), against upstream's model built and trained the same way.

``import verl`` applies rlweave's layer-spec patch (``rlweave.replay_balance`` enabled). Both
models come from verl's ``make_megatron_module`` on the vanilla-mbridge path with the wrapper
config of verl's actor engine (``wrap_with_ddp=True``, ``use_distributed_optimizer=True``; fp32
so that they compare within fp32 tolerance): ReLibra's through the patched function, upstream's
through the unpatched one. Upstream's weights are loaded into ReLibra's model, as verl loads the
HF checkpoint after the build, and each optimizer is built by verl's own
``MegatronEngine._build_optimizer`` (verl's ``McoreOptimizerConfig`` through
``init_megatron_optim_config`` and ``get_megatron_optimizer``, then its training hooks), which
the patch follows with the spare slots' release. Then two training steps as Megatron's schedule
runs them (``zero_grad_buffer``, forward and backward through DDP, ``finalize_model_grads``, the
optimizer's step), every expert of ReLibra's model moved to another home slot between them
(weights, ``main_grad`` and the distributed optimizer's main-parameter and Adam shards), the
second step's micro-batch replicas filling spare slots. Records the logits, gradient norms and
weights after each step, which parameters DDP and the optimizer hold; then what verl's build
says to settings the layer cannot run under (``override_ddp_config.overlap_grad_reduce``, the
layer-wise optimizer). Writes ``<out>/rank<r>.pt``.

Usage: verl_ddp_worker.py WORLD_SIZE OUT PORT   (WORLD_SIZE 4; EP 2)
"""

from __future__ import annotations

import sys
import types

import torch
import torch.distributed as dist

from rlweave.adapters.megatron.cpu import ddp_without_cuda
from verl_expert_export_worker import move_every_expert
from verl_layer_spec_worker import build_with_bridge, start_rank
from ranks import start_ranks

EP = 2
TOKENS = 24


def engine_build(function, override_ddp_config: dict | None = None, **wrap: bool) -> torch.nn.Module:
    """verl's actor-engine build (``_build_megatron_module``'s wrapper config: DDP and the
    distributed optimizer; ``wrap`` sets more of its fields) through ``function``, patched or
    not ``make_megatron_module``: the DDP-wrapped model chunk."""
    from verl.utils.megatron_utils import McoreModuleWrapperConfig

    config = McoreModuleWrapperConfig(wrap_with_ddp=True, use_distributed_optimizer=True, **wrap)
    return build_with_bridge(function, config, override_ddp_config=override_ddp_config)[0]


def build_optimizer(model: torch.nn.Module):
    """verl's ``MegatronEngine._build_optimizer`` on an engine holding ``model`` (fp32, the
    distributed optimizer, Adam at lr 1e-2 with gradient clipping, no weight decay)."""
    from verl.workers.config.optimizer import McoreOptimizerConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    engine = types.SimpleNamespace(
        optimizer_config=McoreOptimizerConfig(lr=1e-2, clip_grad=1.0, weight_decay=0.0),
        engine_config=types.SimpleNamespace(use_distributed_optimizer=True), param_dtype=torch.float32,
        module=[model])
    return MegatronEngine._build_optimizer(engine)


def train_step(model: torch.nn.Module, optimizer, seed: int) -> dict:
    """One step of Megatron's schedule on this rank's tokens (``seed``): the logits, the
    gradient norm the optimizer's step reports."""
    from megatron.core.distributed import finalize_model_grads

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.module.vocab_size, (2, TOKENS // 2), generator=gen)
    weights = torch.randn(2, TOKENS // 2, model.module.vocab_size, generator=gen)
    positions = torch.arange(tokens.shape[1])[None].expand_as(tokens)
    logits = model(tokens, positions, attention_mask=None)
    (logits * weights).sum().backward()
    finalize_model_grads([model])
    _, grad_norm, _ = optimizer.step()
    return {"logits": logits.detach(), "grad_norm": grad_norm}


def owned_experts(model: torch.nn.Module) -> list[dict]:
    """Each MoE layer's experts held by this rank, by logical id (upstream's layer: its
    positional ones; ReLibra's: its home slots)."""
    from rlweave.adapters.megatron.balanced_moe import ReplayBalancedMoELayer

    out = []
    for layer in model.module.decoder.layers:
        if isinstance(layer.mlp, ReplayBalancedMoELayer):
            out.append({e: [t.clone() for t in ts] for e, ts in layer.mlp.logical_expert_state().items()})
        else:
            out.append({e: [p.detach().clone() for p in layer.mlp.experts.local_experts[i].parameters()]
                        for i, e in enumerate(layer.mlp.local_expert_indices)})
    return out


def dense_weights(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.module.named_parameters() if ".experts." not in n}


def refusals(patched) -> list[str]:
    """What verl's build says to the settings ReLibra's layer cannot run under."""
    errors = []
    for settings in ({"override_ddp_config": {"overlap_grad_reduce": True}},
                     {"use_layer_wise_distributed_optimizer": True}):
        try:
            build_optimizer(engine_build(patched, **settings))
        except NotImplementedError as error:
            errors.append(str(error))
    return errors


def run(rank: int, world_size: int, out: str, port: int) -> None:
    patched = start_rank(rank, world_size, port, ep=EP)
    from rlweave.adapters.megatron.balanced_moe import balanced_layers

    torch.manual_seed(0)
    with ddp_without_cuda():
        ours = engine_build(patched)
        reference = engine_build(patched.__wrapped__)
        ours.module.load_state_dict(reference.module.state_dict(), strict=False)  # spare slots: nothing to load
        layers = balanced_layers(ours)
        held_out = [layer.ddp_state for layer in layers]
        optimizers = {"rlweave": build_optimizer(ours), "reference": build_optimizer(reference)}
        record = {
            "classes": [type(layer.mlp).__name__ for layer in ours.module.decoder.layers],
            "ddp_states": {"built": held_out, "optimizer_built": [layer.ddp_state for layer in layers]},
            "spares_outside_ddp": not any(hasattr(p, "main_grad") for layer in layers for p in layer.spare_params()),
            "spares_train": all(p.requires_grad for layer in layers for p in layer.spare_params()),
            "optimizer_params": {name: sum(len(g["params"]) for g in opt.param_groups)
                                 for name, opt in optimizers.items()},
            "steps": [],
        }
        models = {"rlweave": ours, "reference": reference}
        for step, seed in enumerate((100 + rank, 200 + rank)):
            for name, model in models.items():  # verl's optimizer_zero_grad
                model.zero_grad_buffer()
                optimizers[name].zero_grad()
            if step == 1:
                record["moved"] = move_every_expert(layers, optimizers["rlweave"])
            record["steps"].append({name: train_step(model, optimizers[name], seed) | {
                "experts": owned_experts(model), "dense": dense_weights(model)} for name, model in models.items()})
        record["replica_slots"] = sum(int((layer.last_physical_to_logical >= 0).sum())
                                      - layer.topology.num_logical_experts for layer in layers)
        record["refusals"] = refusals(patched)
    torch.save(record, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
