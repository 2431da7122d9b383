"""RLWEAVE_CPU_PIN_DEVICES: a logical device is a core (rlweave.adapters.verl.cpu.cores).

The affinity and torch-thread calls are recorded, not made, so the test process stays as it was."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from rlweave.adapters.verl.cpu import cores as cpu_cores


@pytest.fixture
def affinity(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[int]]:
    calls: dict[int, list[int]] = {}
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cores: calls.__setitem__(tid, sorted(cores)))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(set_num_threads=lambda n: calls.__setitem__(-1, [n])))
    monkeypatch.delenv(cpu_cores.VLLM_BIND_ENV, raising=False)
    return calls


def test_device_ids_wrap_around_the_cores() -> None:
    assert cpu_cores.device_cores(["1"], 2) == [1]
    assert cpu_cores.device_cores(["0", "2", "3"], 2) == [0, 1]
    with pytest.raises(ValueError, match="integer GPU ids"):
        cpu_cores.device_cores(["GPU-3f2a"], 2)


def test_engine_is_pinned_with_every_thread_and_binds_vllm_to_its_cores(
        monkeypatch: pytest.MonkeyPatch, affinity: dict[int, list[int]]) -> None:
    monkeypatch.setenv(cpu_cores.PIN_ENV, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cpu_cores.pin_engine()
    assert os.environ[cpu_cores.VLLM_BIND_ENV] == "1"
    threads = affinity.pop(-1)
    assert set(affinity) == {int(t) for t in os.listdir("/proc/self/task")}
    assert all(cores == [1] for cores in affinity.values()) and threads == [1]


def test_an_explicit_vllm_binding_is_kept(monkeypatch: pytest.MonkeyPatch, affinity: dict[int, list[int]]) -> None:
    monkeypatch.setenv(cpu_cores.PIN_ENV, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv(cpu_cores.VLLM_BIND_ENV, "0-1")
    cpu_cores.pin_engine()
    assert os.environ[cpu_cores.VLLM_BIND_ENV] == "0-1"


def test_without_the_switch_or_without_devices_nothing_is_pinned(
        monkeypatch: pytest.MonkeyPatch, affinity: dict[int, list[int]]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv(cpu_cores.PIN_ENV, raising=False)
    cpu_cores.pin_engine()
    monkeypatch.setenv(cpu_cores.PIN_ENV, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cpu_cores.pin_engine()
    assert affinity == {} and cpu_cores.VLLM_BIND_ENV not in os.environ
