"""Start a gloo world of CPU processes, one per pipeline rank, and collect what each returns.

Each process runs with one torch thread and, when ``cores`` is given, pinned to one core
(rank ``r`` on ``cores[r % len(cores)]``), so that a rank stands for one device.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
from collections.abc import Callable, Sequence
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bootstrap(rank: int, world: int, port: int, cores: Sequence[int] | None,
               fn: Callable[..., Any], args: tuple, results: Any) -> None:
    import torch
    import torch.distributed as dist

    try:
        if cores:
            os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        # pickled here, by value: a tensor put on a queue as is travels as a shared-memory handle
        # that dies with this process
        results.put((rank, "ok", pickle.dumps(fn(rank, world, *args))))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as err:  # reported to the parent, which raises it
        results.put((rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def run_world(world: int, fn: Callable[..., Any], *args: Any, cores: Sequence[int] | None = None,
              timeout_s: float = 240.0) -> list[Any]:
    """``fn(rank, world, *args)`` in ``world`` gloo processes; their results by rank. ``fn``
    must be importable (module level). Raises ``RuntimeError`` with a rank's traceback if one
    failed, ``TimeoutError`` if the world did not finish in ``timeout_s``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_bootstrap, args=(r, world, port, cores, fn, args, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < world:
            rank, status, value = results.get(timeout=timeout_s)
            if status == "error":
                raise RuntimeError(f"pipeline rank {rank} failed: {value}")
            out[rank] = pickle.loads(value)
    except queue.Empty:
        raise TimeoutError(f"the {world}-rank pipeline did not finish within {timeout_s:.0f} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]
