"""``rlweave chaos``: inject faults into a verl job, to see what it survives. A tool of tests and
benchmarks: no production code path knows it.

Two ways in:

- into a job that runs with ``+rlweave.resilience.enable=true`` and the chaos plugin registered
  (:mod:`rlweave.benchmarks.resilience_chaos`, which tests and benchmarks register through the
  job's environment): its monitor has a fault injector, which fires each fault at the step and
  section it names; :func:`inject` and :func:`status` reach it over the monitor's authenticated
  channel (its address and key are in the job's Ray internal KV, which only a process able to run code
  in the job can read). A job without the plugin has no injector: its monitor drops such
  requests, and this tool refuses before sending one;
- into any verl job on this machine, resilience on or off (the baseline: verl's own path), at
  once: find the worker's process (a trainer rank is ``ray::WorkerDict`` with ``RANK``; a
  replica's engine is the vLLM engine process with ``VERL_REPLICA_RANK``, its server that
  engine's parent) and signal it. Every job started by ``main_ppo`` has a Ray cluster of its
  own, whose raylet is the parent of its workers: where several jobs run, the tool refuses
  unless told which (the pid of the job's driver, or of any process above it).

And offline: corrupt the newest persisted checkpoint (or a chosen step's) of a checkpoint folder
(:func:`corrupt_newest`; a ``corrupt`` fault is refused in a job's schedule).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from rlweave.adapters.heartbeat_channel import MAX_DATAGRAM, MONITOR, Channel, Rejected, ReplayGuard
from rlweave.adapters.verl import checkpoints as ckpt
from rlweave.types import FaultSpec

REQUEST = "chaos"  # what the monitor's chaos extension answers (rlweave.benchmarks.resilience_chaos)


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


def _within(process: psutil.Process, job: int) -> bool:
    try:
        return job in {p.pid for p in process.parents()}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def find_processes(worker: str, job: int | None = None) -> list[psutil.Process]:
    """This machine's processes of ``worker`` (``trainer:1``, ``rollout:0``, ``rollout:0/engine``),
    in the job under process ``job``; without ``job``, refused where they belong to several jobs."""
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
    found = [p for p in found if p is not None and (job is None or _within(p, job))]
    from rlweave.adapters.verl.resilience_monitor import raylet_above

    clusters = {raylet_above(p.pid) for p in found}
    if job is None and len(clusters) > 1:
        raise SystemExit(f"rlweave chaos: {worker} is in {len(clusters)} jobs on this machine (processes "
                         f"{', '.join(str(p.pid) for p in found)}); name the job with --job PID (its driver, "
                         f"such as verl's main_ppo)")
    return found


def signal_now(worker: str, action: str, job: int | None = None) -> list[int]:
    """SIGKILL (``kill``) or SIGSTOP (``stop``) ``worker``'s processes now (in the job under process
    ``job``, if given); returns their pids."""
    sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[action]
    pids = []
    for process in find_processes(worker, job):
        os.kill(process.pid, sig)
        pids.append(process.pid)
    return pids


def _monitor(address: str) -> tuple[tuple[str, int], Channel]:
    """The UDP address of the one running job's monitor on the Ray cluster at ``address``, and
    an end of its channel; refused for a job started without ``rlweave.resilience.chaos=true``."""
    import json

    import ray
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    from rlweave.adapters.heartbeat import parse_address
    from rlweave.adapters.verl.resilience_monitor import KV_PREFIX

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    keys = _internal_kv_list(KV_PREFIX)
    if len(keys) != 1:
        jobs = ", ".join(k.decode()[len(KV_PREFIX):] for k in keys)
        raise SystemExit(f"rlweave chaos: {'no running job' if not keys else 'several jobs (' + jobs + ')'} with "
                         f"rlweave.resilience enabled on this Ray cluster ({address}); without it, use "
                         "'rlweave chaos kill|stop WORKER' (now)")
    job = keys[0].decode()[len(KV_PREFIX):]
    contact = json.loads(_internal_kv_get(keys[0]))
    if REQUEST not in contact.get("extensions", ()):
        raise SystemExit(f"rlweave chaos: job {job} was started without the chaos tool, so its monitor takes no "
                         "faults from the network; start it with "
                         "RLWEAVE_PLUGIN_MODULES=rlweave.benchmarks.resilience_chaos in its "
                         "environment (tests and benchmarks only) to inject faults (or use 'rlweave chaos "
                         "kill|stop WORKER' now, from this machine)")
    return parse_address(contact["address"]), Channel(job, bytes.fromhex(contact["key"]))


def ask(monitor: tuple[str, int], channel: Channel, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send the monitor one request (``{"request": REQUEST, ...}``), sealed on ``channel``, and
    return its answer: the first
    datagram from the monitor's address sealed by the monitor for this end."""
    guard = ReplayGuard(max_senders=1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(channel.seal(message), monitor)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data, origin = sock.recvfrom(MAX_DATAGRAM + 1)
            except TimeoutError:
                break
            try:
                opened = channel.open(data)
                if origin[:2] != monitor or opened.sender != MONITOR:
                    continue
                guard.check(opened, time.time())
                return opened.body
            except Rejected:
                continue
    raise SystemExit(f"rlweave chaos: the job's monitor at {monitor[0]}:{monitor[1]} did not answer in "
                     f"{timeout_s:.0f} s (is the job still running, with +rlweave.resilience.chaos=true?)")


def inject(faults: tuple[FaultSpec, ...], address: str = "auto") -> None:
    monitor, channel = _monitor(address)
    for fault in faults:
        ask(monitor, channel, {"request": REQUEST, "chaos": "inject", "fault": asdict(fault)})


def status(address: str = "auto") -> dict[str, Any]:
    return ask(*_monitor(address), {"request": REQUEST, "chaos": "status"})


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
