"""Start a worker script's gloo ranks as forks of one process that imported Megatron-core once.

Spawned, every rank imports torch and Megatron-core itself: about 9 CPU-seconds a process on
this machine, most of a small test's time (a four-rank world spent 36 CPU-s importing a layer
that then runs in seconds). Forked from a parent that imported them, the ranks start at once.
Nothing but modules is shared: the parent starts no thread, process group or RNG use before it
forks, and each rank seeds itself and joins gloo itself, as a spawned rank does. What a worker
imports inside its rank (rlweave's adapters, verl, whose imports apply rlweave's patches) is
still imported there, in the order the worker asks for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

# Megatron-core's own modules only: importing them changes nothing that rlweave patches or that
# depends on a rank's environment (parallel_state stays uninitialised until a rank sets it up).
PRELOADED = ("megatron.core.transformer.moe.moe_layer", "megatron.core.distributed",
             "megatron.core.optimizer")


def start_ranks(run: Callable[..., None], world_size: int, *args: Any) -> None:
    """``run(rank, world_size, *args)`` in ``world_size`` processes; raises if any rank failed."""
    for name in PRELOADED:
        importlib.import_module(name)
    mp.start_processes(run, args=(world_size, *args), nprocs=world_size, start_method="fork")
