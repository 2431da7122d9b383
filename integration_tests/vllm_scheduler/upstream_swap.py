"""A pytest plugin (``-p upstream_swap``) for the pytest run that
``test_vllm_own_scheduler_tests.py`` starts on vLLM's own scheduler tests
(``vllm_upstream_tests/<version>``), in a process of its own.

Always: the harness's stand-in architecture is registered, so the stand-in model folders the
run's working directory holds (``facebook/opt-125m``, ...) pass vLLM's model check with no
download, and vLLM's device defaults to the CPU. With ``RLWEAVE_UPSTREAM_SCHEDULER=rlweave``: rlweave's subclasses take the place of
vLLM's ``Scheduler`` and ``AsyncScheduler`` in vLLM's own modules, before the upstream tests
import them, so every scheduler those tests build is rlweave's; the plugins are the ones the
``RLWEAVE__*`` variables enable. The schedulers built are counted through
``rlweave_engine_started`` and written to ``RLWEAVE_UPSTREAM_REPORT``, so the caller can tell a
swap that took effect from one that did not.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from rlweave.hookspecs import hookimpl

MODE_ENV = "RLWEAVE_UPSTREAM_SCHEDULER"
REPORT_ENV = "RLWEAVE_UPSTREAM_REPORT"


class EngineCounter:
    """Counts the rlweave schedulers the upstream tests built."""

    def __init__(self) -> None:
        self.started = 0

    @hookimpl
    def rlweave_engine_started(self, engine: Any) -> None:
        self.started += 1


_counter = EngineCounter()


def pytest_configure(config: pytest.Config) -> None:
    from harness import STAND_IN_ARCH, SchedulerOnlyModel
    from vllm import ModelRegistry
    from vllm.config import DeviceConfig

    ModelRegistry.register_model(STAND_IN_ARCH, SchedulerOnlyModel)
    _default_device_cpu(DeviceConfig)
    mode = os.environ.get(MODE_ENV, "vllm")
    if mode == "vllm":
        return
    if mode != "rlweave":
        raise pytest.UsageError(f"{MODE_ENV}={mode!r}: use 'vllm' (vLLM's scheduler) or 'rlweave'")
    import vllm.v1.core.sched.async_scheduler as async_module
    import vllm.v1.core.sched.scheduler as sync_module

    from rlweave import host
    from rlweave.adapters.vllm.scheduler import rlweave_scheduler_for

    host.reset()
    host.get_host().pm.register(_counter)
    ours = {cls: rlweave_scheduler_for(cls)
            for cls in (sync_module.Scheduler, async_module.AsyncScheduler)}
    sync_module.Scheduler = ours[sync_module.Scheduler]
    async_module.AsyncScheduler = ours[async_module.AsyncScheduler]


def _default_device_cpu(device_config: type) -> None:
    """``DeviceConfig()`` means ``device="cpu"``, as the harness passes it: the upstream tests
    leave the device to vLLM, and the CUDA builds (0.33, 0.34) find no platform here, while
    choosing vLLM's CPU platform instead would refuse 0.34 without triton-cpu."""
    resolve = device_config.__post_init__

    def post_init(self: Any) -> None:
        if self.device == "auto":
            self.device = "cpu"
        resolve(self)

    device_config.__post_init__ = post_init


def pytest_unconfigure(config: pytest.Config) -> None:
    if report := os.environ.get(REPORT_ENV):
        with open(report, "w") as f:
            json.dump({"rlweave_schedulers_built": _counter.started}, f)
