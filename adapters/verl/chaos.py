"""``rlweave chaos``: inject faults into a verl job, to see what it survives.

Two ways in:

- into a job that runs with ``+rlweave.resilience.enable=true``: hand faults to its monitor
  actor (:meth:`ResilienceMonitor.inject`), which fires each at the step and section it names
  (the same grammar as ``rlweave.resilience.faults``);
- into any verl job on this machine, resilience on or off (the baseline: verl's own path), at
  once: find the worker's process (a trainer rank is ``ray::WorkerDict`` with ``RANK``; a
  replica's engine is the vLLM engine process with ``VERL_REPLICA_RANK``, its server that
  engine's parent) and signal it.

And offline: corrupt the newest persisted checkpoint (or a chosen step's) of a checkpoint folder.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil

from rlweave.adapters.verl import checkpoints as ckpt
from rlweave.types import FaultSpec


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return {}


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""


def find_processes(worker: str) -> list[psutil.Process]:
    """This machine's processes of ``worker`` (``trainer:1``, ``rollout:0``, ``rollout:0/engine``)."""
    role, _, rest = worker.partition(":")
    rank, _, part = rest.partition("/")
    found = []
    for process in psutil.process_iter():
        title = _title(process)
        if role == "trainer" and title.startswith("ray::WorkerDict"):
            if _environ(process).get("RANK") == rank:
                found.append(process)
        elif role == "rollout" and "EngineCore" in title and _environ(process).get("VERL_REPLICA_RANK") == rank:
            found.append(process if part == "engine" else process.parent())
    return [p for p in found if p is not None]


def signal_now(worker: str, action: str) -> list[int]:
    """SIGKILL (``kill``) or SIGSTOP (``stop``) ``worker``'s processes now; returns their pids."""
    sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[action]
    pids = []
    for process in find_processes(worker):
        os.kill(process.pid, sig)
        pids.append(process.pid)
    return pids


def _monitor(address: str) -> Any:
    import ray

    from rlweave.adapters.verl.resilience_monitor import NAME, NAMESPACE

    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    try:
        return ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        raise SystemExit("rlweave chaos: no running job with rlweave.resilience enabled on this Ray cluster "
                         f"({address}); without it, use 'rlweave chaos kill|stop WORKER' (now)") from None


def inject(faults: tuple[FaultSpec, ...], address: str = "auto") -> None:
    import ray
    from dataclasses import asdict

    monitor = _monitor(address)
    ray.get([monitor.inject.remote(asdict(f)) for f in faults])


def status(address: str = "auto") -> dict[str, Any]:
    import ray

    return ray.get(_monitor(address).status.remote())


def corrupt_newest(root: str | os.PathLike, how: str = "flip", step: int | None = None) -> str:
    """Corrupt the newest persisted checkpoint under ``root`` (or ``step``'s)."""
    steps = ckpt.persisted_steps(root)
    if not steps:
        raise SystemExit(f"rlweave chaos: no global_step_N checkpoint under {root}")
    chosen = steps[-1] if step is None else step
    folder = ckpt.step_folder(root, chosen)
    if not folder.is_dir():
        raise SystemExit(f"rlweave chaos: no checkpoint of step {chosen} under {root} (steps: {steps})")
    return f"{Path(folder)}: {ckpt.corrupt(folder, how)}"
