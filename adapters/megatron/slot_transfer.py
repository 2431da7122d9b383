"""Copying the contents of physical expert slots between expert-parallel ranks.

Slot ``s`` lives on EP rank ``s // slots_per_rank``. A transfer is a list of ``(source, target)``
slot pairs that every rank of the EP group knows alike (they come from the same placement). Each
pair is one point-to-point message (a local copy when both slots are on the same rank), tagged
with the target slot. Every source is read before any target is written, so a transfer may
permute slots (a home-slot reorder) or fan one slot out to several (replicas).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

Read = Callable[[int], torch.Tensor]  # slot -> flat tensor of what moves
Write = Callable[[int, torch.Tensor], None]  # slot, flat tensor received


def transfer(moves: Sequence[tuple[int, int]], slots_per_rank: int, group: dist.ProcessGroup,
             read: Read, write: Write) -> int:
    """Send ``read(source)`` to the rank of ``target`` and ``write(target, ...)`` it there.

    ``read(slot)`` must have the same size for every slot (the receiver sizes its buffer with
    ``read(target)``). Returns the number of bytes this rank sent to other ranks.
    """
    me = dist.get_rank(group)
    requests, received, sent = [], [], 0
    for source, target in moves:
        src_rank, dst_rank = source // slots_per_rank, target // slots_per_rank
        if src_rank == me and dst_rank == me:
            received.append((target, read(source).clone()))
        elif src_rank == me:
            flat = read(source).contiguous()
            requests.append(dist.isend(flat, dist.get_global_rank(group, dst_rank), group=group, tag=target))
            sent += flat.numel() * flat.element_size()
        elif dst_rank == me:
            buffer = torch.empty_like(read(target))
            requests.append(dist.irecv(buffer, dist.get_global_rank(group, src_rank), group=group, tag=target))
            received.append((target, buffer))
    for request in requests:
        request.wait()
    for target, flat in received:
        write(target, flat)
    return sent


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor], add: bool = False) -> None:
    """Copy (or add) consecutive pieces of ``flat`` into ``tensors``."""
    offset = 0
    for t in tensors:
        piece = flat[offset : offset + t.numel()].view_as(t)
        t.add_(piece) if add else t.copy_(piece)
        offset += t.numel()
