"""Stage 1 of MegaScale's two-stage checkpoint: a trainer rank's state copied into host memory
that outlives the rank, at the end of the update that produced it.

Each rank owns two slot files in tmpfs (``/dev/shm``), mapped once as byte tensors. A snapshot
copies every local parameter and buffer shard and every optimizer-state tensor into the slot the
newest snapshot did not use (a device-to-host copy on a GPU, a memcpy on CPU), then commits the
slot: a small file with its step, its layout, the lr scheduler's state and the RNG states,
written under a temporary name and renamed. The other slot stays valid meanwhile, so a rank that
dies mid-snapshot leaves the previous step restorable.

Why not verl's ``save_checkpoint`` at every step: it is a Ray call of its own with a barrier,
``torch.save`` pickles every (sharded) tensor, and rank 0 re-exports the HF config and tokenizer
each time. On this rig's tiny model that fixed cost was 27 ms of a 2.4 s step, on the step's
path; on a large model the pickling is the cost. verl's format stays the format of stage 2 (the
persisted checkpoint, at ``save_freq``).

Restore, into a rebuilt rank of the same model and world size: the optimizer's state is created
by one step with zero gradients (the values it writes are then overwritten), every tensor is
copied back from the slot that holds the requested step, and the scheduler and RNG states are
loaded.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

ALIGN = 64  # every tensor starts at a multiple of this many bytes, so its dtype can view it


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of ``tensor`` (a view: copying into it writes the parameter)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def state_tensors(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a step changes, named, in an order that is the same in every process built
    from the same configuration: parameters, buffers, then each parameter's optimizer state."""
    params = list(module.named_parameters())
    tensors = [(f"param:{n}", _local(p)) for n, p in params]
    tensors += [(f"buffer:{n}", _local(b)) for n, b in module.named_buffers()]
    if optimizer is not None:
        names = {id(p): n for n, p in params}
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                for key, value in sorted(optimizer.state.get(p, {}).items()):
                    if torch.is_tensor(value):
                        tensors.append((f"optim:{names.get(id(p), f'{g}.{i}')}:{key}", _local(value)))
    return tensors


def _layout(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(name, dtype, shape, byte offset) of each tensor in a slot."""
    layout, offset = [], 0
    for name, t in tensors:
        layout.append((name, str(t.dtype), tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return layout


def _size(layout: list[tuple[str, str, tuple[int, ...], int]], tensors: list[tuple[str, torch.Tensor]]) -> int:
    if not layout:
        return ALIGN
    last = tensors[-1][1]
    return max(layout[-1][3] + last.numel() * last.element_size(), ALIGN)


def _optimizer_record(optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """What of the optimizer is not a state tensor: each group's settings (the scheduler writes
    the learning rate there) and any non-tensor state."""
    if optimizer is None:
        return {"groups": [], "state": {}}
    return {"groups": [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups],
            "state": {f"{g}.{i}.{k}": v for g, group in enumerate(optimizer.param_groups)
                      for i, p in enumerate(group["params"]) for k, v in optimizer.state.get(p, {}).items()
                      if not torch.is_tensor(v)}}


class HostSnapshots:
    """One rank's two slots under ``folder`` (one folder per model: actor, critic)."""

    def __init__(self, folder: str | os.PathLike, rank: int) -> None:
        self.folder, self.rank = Path(folder), rank
        self.folder.mkdir(parents=True, exist_ok=True)
        self._maps: dict[int, torch.Tensor] = {}  # slot -> its mapped bytes
        self._views: dict[int, tuple[list[Any], list[torch.Tensor]]] = {}  # slot -> (layout, a view per tensor)
        self._newest: int | None = None  # the slot of this process's newest commit

    def _data(self, slot: int) -> Path:
        return self.folder / f"rank{self.rank}.slot{slot}.bin"

    def _commit(self, slot: int) -> Path:
        return self.folder / f"rank{self.rank}.slot{slot}.meta"

    def committed(self) -> dict[int, dict[str, Any]]:
        """slot -> its commit record, for the slots that hold a whole snapshot."""
        found = {}
        for slot in (0, 1):
            try:
                found[slot] = pickle.loads(self._commit(slot).read_bytes())
            except (OSError, pickle.UnpicklingError, EOFError):
                continue
        return found

    def _slot_views(self, slot: int, layout: list[Any], tensors: list[tuple[str, torch.Tensor]],
                    create: bool) -> list[torch.Tensor]:
        """A view of the slot's bytes per tensor, typed and shaped like it (made once per layout)."""
        cached = self._views.get(slot)
        if cached is not None and cached[0] == layout:
            return cached[1]
        nbytes = _size(layout, tensors)
        mapped = self._maps.get(slot)
        if mapped is None or mapped.numel() < nbytes:
            if create:
                self._data(slot).unlink(missing_ok=True)  # a new size: a new file, never a resized mapping
            mapped = torch.from_file(str(self._data(slot)), shared=True, size=nbytes, dtype=torch.uint8)
            self._maps[slot] = mapped
        views = [mapped[offset:offset + t.numel() * t.element_size()].view(t.dtype).view(shape)
                 for (_, t), (_, _, shape, offset) in zip(tensors, layout, strict=True)]
        self._views[slot] = (layout, views)
        return views

    def save(self, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             lr_scheduler: Any, rng: dict[str, Any]) -> None:
        """Copy the rank's state into the slot not holding the newest snapshot, then commit it."""
        if self._newest is None:
            committed = self.committed()
            self._newest = max(committed, key=lambda s: committed[s]["step"], default=1)
        slot = 1 - self._newest
        self._commit(slot).unlink(missing_ok=True)  # the slot is being overwritten: not restorable
        tensors = state_tensors(module, optimizer)
        layout = _layout(tensors)
        with torch.no_grad():
            torch._foreach_copy_(self._slot_views(slot, layout, tensors, create=True), [t for _, t in tensors])
        record = {"step": step, "layout": [entry[:3] for entry in layout],
                  "optimizer": _optimizer_record(optimizer),
                  "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None, "rng": rng}
        temporary = self._commit(slot).with_suffix(".tmp")
        temporary.write_bytes(pickle.dumps(record))
        os.replace(temporary, self._commit(slot))
        self._newest = slot

    def steps(self) -> list[int]:
        return sorted(r["step"] for r in self.committed().values())

    def restore(self, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                lr_scheduler: Any) -> dict[str, Any]:
        """Load the snapshot of ``step`` into the rank's model, optimizer and scheduler; returns
        the RNG states it was taken with (the caller's framework knows how to set them)."""
        found = {r["step"]: (slot, r) for slot, r in self.committed().items()}
        if step not in found:
            raise RuntimeError(f"rlweave resilience: rank {self.rank} holds no host snapshot of step {step} "
                               f"in {self.folder} (it holds {sorted(found) or 'none'})")
        slot, record = found[step]
        if optimizer is not None and any(p not in optimizer.state for g in optimizer.param_groups for p in g["params"]):
            _create_optimizer_state(optimizer)
        tensors = state_tensors(module, optimizer)
        layout = _layout(tensors)
        if [entry[:3] for entry in layout] != record["layout"]:
            raise RuntimeError(f"rlweave resilience: rank {self.rank}'s model or optimizer does not match the host "
                               f"snapshot of step {step} (another model, world size or optimizer); restore it "
                               f"from a persisted checkpoint instead")
        with torch.no_grad():
            torch._foreach_copy_([t for _, t in tensors], self._slot_views(slot, layout, tensors, create=False))
        if optimizer is not None:
            saved = record["optimizer"]
            for g, group in enumerate(optimizer.param_groups):
                group.update(saved["groups"][g])
                for i, p in enumerate(group["params"]):
                    for key in optimizer.state[p]:
                        if f"{g}.{i}.{key}" in saved["state"]:
                            optimizer.state[p][key] = saved["state"][f"{g}.{i}.{key}"]
        if lr_scheduler is not None and record["lr_scheduler"] is not None:
            lr_scheduler.load_state_dict(record["lr_scheduler"])
        return record["rng"]


def _create_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """A fresh optimizer has no state until its first step: take one with zero gradients (what
    it writes into the parameters and the state is overwritten by the restore)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [p.grad for p in params]
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    for p, grad in zip(params, saved, strict=True):
        p.grad = grad
