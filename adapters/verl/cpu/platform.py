"""verl's hardware platform for CPU-only machines (gloo, shared-memory weight sync).

verl 0.9 dispatches every device call through ``verl.plugin.platform.get_platform()`` and
ships no CPU platform. This one is registered under the name ``cpu`` and selected the way verl
selects any platform: ``VERL_PLATFORM=cpu``. Nothing changes unless it is selected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


class CpuDeviceId(str):
    """The CPU's "device index".

    verl uses ``get_device_id()`` both as a torch device (``model.to(device=get_device_id())``)
    and as an index in f-strings (``f"{get_device_name()}:{get_device_id()}"``). This value is
    ``"cpu"`` to torch and formats as ``"0"``. The upstream fix is for ``get_device_id()`` to
    return a ``torch.device``; see patches/verl_cpu_support/upstream.md.
    """

    def __new__(cls) -> CpuDeviceId:
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __index__(self) -> int:
        return 0


class _NullStream:
    """Stands in for a CUDA stream/event: CPU work is synchronous, so every wait is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _NullStream:
        return self

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


@contextlib.contextmanager
def _stream(stream: Any = None) -> Iterator[None]:
    yield


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _none(*args: Any, **kwargs: Any) -> None:
    return None


# What verl calls through ``get_torch_device().<name>``; torch.cpu has few of them.
CPU_DEVICE_MODULE = SimpleNamespace(
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=CpuDeviceId,
    set_device=_none,
    synchronize=_none,
    empty_cache=_none,
    ipc_collect=_none,
    reset_peak_memory_stats=_none,
    set_per_process_memory_fraction=_none,
    memory_allocated=_zero,
    max_memory_allocated=_zero,
    memory_reserved=_zero,
    max_memory_reserved=_zero,
    mem_get_info=_mem_get_info,
    get_rng_state=lambda *a, **k: torch.get_rng_state(),
    set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda *a, **k: "cpu",
    Stream=_NullStream,
    Event=_NullStream,
    current_stream=lambda *a, **k: _NullStream(),
    stream=_stream,
    amp=torch.amp,
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """CPU tensors, gloo collectives; Ray's logical ``GPU`` resource stands in for a device slot
    so verl's placement code (which counts accelerators) works unchanged."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Only chosen explicitly (VERL_PLATFORM=cpu): auto-detection must never prefer it.
        return False

    def current_device(self) -> Any:
        return CpuDeviceId()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False  # verl then moves weights to vLLM through shared memory

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def cudart(self) -> Any:
        return None
