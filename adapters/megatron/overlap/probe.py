"""Which overlap backends a TP group's device can run, and why not the others."""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.distributed as dist

from rlweave.types import TPDevice


def has_symm_mem_ops() -> bool:
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (registers torch.ops.symm_mem)
    except ImportError:
        return False
    return hasattr(torch.ops.symm_mem, "fused_all_gather_matmul") and hasattr(
        torch.ops.symm_mem, "fused_matmul_reduce_scatter")


def peers_reachable(world: int) -> tuple[bool, str]:
    """Whether ``world`` ranks on this node's GPUs can reach each other over P2P (NVLink or
    PCIe peer access): symmetric memory and the tile kernels need it."""
    count = torch.cuda.device_count()
    if world > count:
        return False, f"the TP group ({world} ranks) spans more GPUs than this node has ({count})"
    blocked = [(a, b) for a in range(world) for b in range(world)
               if a != b and not torch.cuda.can_device_access_peer(a, b)]
    if blocked:
        return False, f"GPUs {blocked[0][0]} and {blocked[0][1]} have no peer access"
    return True, ""


@functools.cache
def _probe(device_type: str, comm_backend: str, world: int) -> TPDevice:
    missing = []
    if device_type != "cuda":
        missing.append("symm_mem: torch's fused symmetric-memory ops have CUDA kernels only")
        missing.append("tile: rlweave's Triton kernels need CUDA GPUs with peer access")
        return TPDevice("cpu", comm_backend, ("ring",), tuple(missing))
    name = torch.cuda.get_device_name()
    backends = ["ring"]
    reachable, why = peers_reachable(world)
    if comm_backend != "nccl":
        why = why or f"the TP group's backend is {comm_backend}, not nccl"
        reachable = False
    if not has_symm_mem_ops():
        missing.append(f"symm_mem: torch {torch.__version__} has no torch.ops.symm_mem fused ops")
    elif not reachable:
        missing.append(f"symm_mem: {why}")
    else:
        backends.append("symm_mem")
    if importlib.util.find_spec("triton") is None:
        missing.append("tile: triton is not installed")
    elif torch.cuda.get_device_capability() < (8, 0):
        missing.append("tile: the kernels need compute capability 8.0 or newer")
    elif not reachable or not has_symm_mem_ops():
        missing.append(f"tile: peer buffers come from torch symmetric memory: {why or 'missing'}")
    else:
        backends.append("tile")
    return TPDevice(name, comm_backend, tuple(backends), tuple(missing))


def probe(group: dist.ProcessGroup, device: torch.device) -> TPDevice:
    return _probe(device.type, dist.get_backend(group), group.size())
