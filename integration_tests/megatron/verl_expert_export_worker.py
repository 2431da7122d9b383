"""One rank of verl's weight sync (mbridge ``export_weights``, what verl's Megatron engine calls
with ``vanilla_mbridge=True`` in ``get_per_tensor_param``) after ReLibra moved experts, on gloo.

``import verl`` applies rlweave's layer-spec patch (``rlweave.replay_balance`` enabled). The
worker builds verl's model through the patched ``make_megatron_module`` (ReLibra's layers) and
upstream's through the unpatched one (Megatron's ``MoELayer``), with the same weights, and trains
both with Adam on the same tokens: a step, then every ReLibra layer moves every expert to another
home slot (weights and Adam state travel), then a second step (its micro-batch replicas fill
spare slots). Then both export: ReLibra's through the bridge's patched ``export_weights``, the
upstream model's through the same logical export (mbridge maps no ``SequentialMLP`` experts of
its own). Records both exports, this rank's logical experts, the HF checkpoint's tensor names,
the layouts and the moves; then writes ReLibra's model as a Megatron distributed checkpoint and
loads it (strict) into a fresh upstream and a fresh ReLibra model; last, loads the HF checkpoint
into the moved model through the bridge's ``load_weights``. Writes ``<out>/rank<r>.pt``.

TransformerEngine stands in as the local backend (``te_stand_in``): its spec fuses the input
norm into ``linear_qkv.layer_norm_weight``, which mbridge maps; the local spec's separate
``input_layernorm`` gets the same HF name here (``local_norm_name``).

Usage: verl_expert_export_worker.py WORLD_SIZE OUT PORT   (EP = WORLD_SIZE)
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from rlweave.adapters.megatron.cpu import ddp_without_cuda
from rlweave.patches.verl_megatron_layer_spec import export_logical_weights
from verl_layer_spec_worker import build_with_bridge, start_rank
from ranks import start_ranks

TOKENS = 24


def build(function) -> tuple[torch.nn.Module, object]:
    """verl's model build (patched or not ``make_megatron_module``) and its bridge, which maps
    the local spec's input norm as TE's spec names it (``linear_qkv.layer_norm_weight``)."""
    model, bridge = build_with_bridge(function)
    bridge._OTHER_MAPPING = {"input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}
    return model, bridge


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """Forward, backward and an Adam step on tokens that every rank shares: without DDP that
    keeps the dense weights equal across ranks, as a checkpoint (written by one rank) needs."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (2, TOKENS // 2), generator=gen)
    weights = torch.randn(2, TOKENS // 2, model.vocab_size, generator=gen)
    positions = torch.arange(tokens.shape[1])[None].expand_as(tokens)
    optimizer.zero_grad()
    with ddp_without_cuda():  # Megatron's default causal mask is made on device="cuda"
        logits = model(tokens, positions, attention_mask=None)
    (logits * weights).sum().backward()
    optimizer.step()


def move_every_expert(layers, optimizer) -> int:
    """Each layer's logical experts rotated by one home slot (across EP ranks too)."""
    moved = 0
    for layer in layers:
        homes = layer._home_slot_ids()
        layout = np.full_like(layer.physical_to_logical, -1)
        layout[homes] = np.roll(layer.physical_to_logical[homes], 1)
        moved += layer.begin_step(layout, (layout >= 0).astype(float), micro_batches=0, optimizer=optimizer)
    return moved


def hf_names() -> list[str]:
    from safetensors import safe_open

    from rlweave.tiny_models import ensure_tiny_model

    names = []
    for path in sorted(ensure_tiny_model("tiny-qwen2moe").glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names += list(f.keys())
    return names


def checkpoint_round_trip(ours: torch.nn.Module, patched, directory: str) -> dict:
    """Megatron's distributed checkpoint of the moved ReLibra model, loaded (strict, as verl's
    checkpoint manager loads) into a fresh upstream model and a fresh ReLibra model."""
    import os

    from megatron.core import dist_checkpointing

    from rlweave.adapters.megatron.balanced_moe import balanced_layers

    if dist.get_rank() == 0:
        os.makedirs(directory)
    dist.barrier()
    torch.cuda.synchronize = lambda *args, **kwargs: None  # the checkpoint writer waits for the GPU (none here)
    dist_checkpointing.save(ours.sharded_state_dict(), directory)
    loaded = {}
    for name, function in (("upstream", patched.__wrapped__), ("rlweave", patched)):
        model, _ = build(function)
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), directory), strict=True)
        loaded[name] = model
    return {"checkpoint_upstream": {k: v.clone() for k, v in loaded["upstream"].state_dict().items() if torch.is_tensor(v)},
            "checkpoint_rlweave": [{e: [t.clone() for t in ts] for e, ts in layer.logical_expert_state().items()}
                                   for layer in balanced_layers(loaded["rlweave"])],
            "checkpoint_rlweave_layouts": [layer.physical_to_logical.tolist() for layer in balanced_layers(loaded["rlweave"])]}


def hf_load(ours: torch.nn.Module, bridge, layers) -> dict:
    """mbridge's ``load_weights`` (verl's engine loads the HF checkpoint with it) into the moved
    model, and the HF checkpoint's experts by logical id."""
    from safetensors import safe_open

    from rlweave.tiny_models import ensure_tiny_model

    path = ensure_tiny_model("tiny-qwen2moe")
    bridge.load_weights([ours], str(path))
    hf = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            hf |= {name: f.get_tensor(name) for name in f.keys() if ".mlp.experts." in name}
    return {"hf_loaded": [{e: [t.clone() for t in ts] for e, ts in layer.logical_expert_state().items()}
                          for layer in layers], "hf_experts": hf}


def run(rank: int, world_size: int, out: str, port: int) -> None:
    patched = start_rank(rank, world_size, port)
    from rlweave.adapters.megatron.balanced_moe import balanced_layers

    torch.manual_seed(0)
    ours, bridge = build(patched)
    reference, reference_bridge = build(patched.__wrapped__)
    ours.load_state_dict(reference.state_dict(), strict=False)
    layers = balanced_layers(ours)
    opt_ours = torch.optim.Adam(ours.parameters(), lr=1e-2)
    opt_reference = torch.optim.Adam(reference.parameters(), lr=1e-2)
    train_step(ours, opt_ours, 100)
    train_step(reference, opt_reference, 100)
    moved = move_every_expert(layers, opt_ours)
    train_step(ours, opt_ours, 200)
    train_step(reference, opt_reference, 200)
    record = {
        "moved": moved, "layouts": [layer.physical_to_logical.tolist() for layer in layers],
        "last_layouts": [layer.last_physical_to_logical.tolist() for layer in layers],
        "logical": [{e: [t.clone() for t in ts] for e, ts in layer.logical_expert_state().items()} for layer in layers],
        "export": [(n, t.clone()) for n, t in bridge.export_weights([ours])],
        "export_reference": [(n, t.clone()) for n, t in export_logical_weights(
            reference_bridge, reference_bridge.export_weights, [reference])],
        "hf_names": hf_names(),
        "reference_state": {k: v.clone() for k, v in reference.state_dict().items() if torch.is_tensor(v)},
    }
    record |= checkpoint_round_trip(ours, patched, f"{out}/checkpoint")
    record |= hf_load(ours, bridge, layers)
    torch.save(record, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, out, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start_ranks(run, world_size, out, port)
