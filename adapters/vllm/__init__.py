"""vLLM adapter, loaded by vLLM's ``vllm.general_plugins`` entry point in every vLLM process
(frontend, EngineCore, workers).

With no rlweave plugin enabled and verl's CPU platform not selected it returns at once.
Otherwise it checks vLLM's version and applies what is asked for: the CPU-support patches
when verl runs on its CPU platform (``VERL_PLATFORM=cpu``), and, when a plugin is enabled, the
patch that makes the EngineCore build rlweave's scheduler, then fires
``rlweave_framework_loaded``.

Rollout routing capture for MoE models (``rlweave_routing_recorded``) is
:func:`rlweave.adapters.vllm.routing_capture.capture_routing`, called on an ``LLM``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from rlweave.adapters import refusals_exit
from rlweave.frameworks import verl_cpu_platform_selected
from rlweave.host import get_host
from rlweave.types import FrameworkInfo

_registered = False


def register() -> None:
    """vLLM calls this once per process (``load_general_plugins``); safe to call again. vLLM
    runs it unguarded, so rlweave's refusals leave as one message (:func:`refusals_exit`)."""
    with refusals_exit():
        _register()


def _register() -> None:
    global _registered
    host = get_host()
    on_verl_cpu = verl_cpu_platform_selected()
    if _registered or not (host.active or on_verl_cpu):
        return
    from rlweave.frameworks import require_supported
    from rlweave.patches import PLUGINS, VERL_CPU, apply_patches

    version = require_supported("vllm")
    if on_verl_cpu:
        from rlweave.adapters.verl.cpu.cores import pin_engine

        apply_patches("vllm", version, VERL_CPU)
        pin_engine()  # RLWEAVE_CPU_PIN_DEVICES=1: the replica's logical GPUs are its cores
    if host.active:
        _log_like_vllm()
        apply_patches("vllm", version, PLUGINS)
        role = multiprocessing.current_process().name
        host.hook.rlweave_framework_loaded(framework=FrameworkInfo("vllm", version, role))
        if role.startswith("EngineCore"):
            _start_engine_heartbeat(host)
    _registered = True


def _start_engine_heartbeat(host) -> None:
    """A rollout replica's engine beats as ``<replica>/engine`` (resilience): the process that
    launched it (verl's rollout server) exported where the monitor is and which replica it is."""
    from rlweave.adapters import heartbeat

    address, worker = os.environ.get(heartbeat.MONITOR_ENV), os.environ.get(heartbeat.WORKER_ENV)
    settings = host.hook.rlweave_resilience_settings()
    if settings is not None and address and worker and "/" not in worker:
        heartbeat.start(address, f"{worker}/engine", settings.heartbeat_s)


def _log_like_vllm() -> None:
    """rlweave's log lines (a plugin's regime, where preempted KV goes) appear in the engine's
    log, formatted and filtered as vLLM's own, instead of being dropped below WARNING."""
    ours, vllm_logger = logging.getLogger("rlweave"), logging.getLogger("vllm")
    if ours.handlers or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        ours.addHandler(handler)
    ours.setLevel(vllm_logger.level or logging.INFO)
    ours.propagate = False
