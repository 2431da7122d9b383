"""The chaos tool inside a verl job: a plugin that tests and ``rlweave bench resilience`` register
(:func:`chaos_env`), never a production job. Registered, it gives the job's resilience monitor a
:class:`FaultInjector` (the monitor's ``monitor_extension``), which fires the faults of
``RLWEAVE_CHAOS_FAULTS`` (:mod:`rlweave.chaos`'s grammar) at the step and section each names and
answers ``rlweave chaos inject|status`` (:mod:`rlweave.adapters.verl.chaos`) over the job's
channel; and each trainer rank a :class:`SlowSections` (its ``worker_extension``), which runs
the rank's timed sections as many times slower as the monitor's answers to its beats say: the
``slow`` fault, all of it here, so that no production code path knows it.

Every process of the job registers it (its environment is inherited), so importing it must not
import the verl adapter: that adapter builds the host whose plugin manager is importing this.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rlweave.chaos import parse_faults
from rlweave.hookspecs import hookimpl
from rlweave.types import FaultSpec, WorkerIncident

if TYPE_CHECKING:
    from rlweave.adapters.heartbeat import HeartbeatSender, Received
    from rlweave.adapters.verl.resilience_monitor import ResilienceMonitor
    from rlweave.config import RlweaveConfig

CONTROLLER = "controller:0"
REQUEST = "chaos"  # the requests rlweave chaos sends (rlweave.adapters.verl.chaos.REQUEST)
FAULTS_ENV = "RLWEAVE_CHAOS_FAULTS"


def chaos_env(faults: str) -> dict[str, str]:
    """The environment that gives a verl job (started with resilience enabled) the chaos tool
    and ``faults`` to fire: what tests and ``rlweave bench resilience`` add to a faulty run."""
    return {"RLWEAVE_PLUGIN_MODULES": __name__, FAULTS_ENV: faults}


def job_faults(text: str) -> list[FaultSpec]:
    """The faults of a job's schedule; ``ValueError`` naming the fix for one that does not
    parse, or for a ``corrupt`` one (checkpoints are corrupted offline, between runs)."""
    try:
        faults = list(parse_faults(text))
    except ValueError as error:
        raise ValueError(f"bad value for {FAULTS_ENV}: {error}") from None
    if any(f.action == "corrupt" for f in faults):
        raise ValueError(f"{FAULTS_ENV}: a checkpoint is corrupted between runs, not in one: drop the corrupt "
                         "fault and run 'rlweave chaos corrupt FOLDER [--step N]' after the job")
    return faults


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    """A bad fault schedule fails the job as it starts, with the fix, not when the monitor does."""
    job_faults(os.environ.get(FAULTS_ENV, ""))


def monitor_extension(monitor: ResilienceMonitor) -> FaultInjector:
    """What the monitor of a job with this plugin registered extends itself with."""
    return FaultInjector(monitor, job_faults(os.environ.get(FAULTS_ENV, "")))


def worker_extension(sender: HeartbeatSender) -> SlowSections:
    """What a trainer rank of a job with this plugin registered holds its timed sections with."""
    return SlowSections(sender)


class SlowSections:
    """The ``slow`` fault in a worker: the factor the monitor's :class:`FaultInjector` sends in
    its answers to the worker's beats (1 until a fault names the worker), and how long a section
    that took ``duration_s`` is then held open, so that it takes ``factor`` times as long."""

    def __init__(self, sender: HeartbeatSender) -> None:
        self.factor = 1.0
        sender.answer_listeners.append(self.on_answer)

    def on_answer(self, answer: dict[str, Any]) -> None:
        self.factor = float(answer.get("slow", self.factor))

    def hold_s(self, section: str, duration_s: float) -> float:
        return (self.factor - 1.0) * duration_s


class FaultInjector:
    """The chaos tool inside a job's monitor (only where a test or benchmark registered it): at
    the step and section a fault names, SIGKILL or SIGSTOP its worker's process (through the
    monitor, which signals only the job's own processes), or tell the worker (in the reply to
    its beat) to run ``factor`` times slower; and ``rlweave chaos`` requests (``inject``,
    ``status``) answered over the channel."""

    name = REQUEST

    def __init__(self, monitor: ResilienceMonitor, faults: list[FaultSpec]) -> None:
        self.monitor = monitor
        self.lock = threading.Lock()
        self.faults = list(faults)
        self.fired: list[dict[str, Any]] = []
        self.firing: set[int] = set()  # fault indexes fired or being fired (two threads fire)
        self.armed: dict[int, float] = {}  # fault index -> when it fires
        self.slow: dict[str, float] = {}  # worker -> factor

    def inject(self, fault: dict[str, Any]) -> None:
        """Add a fault (``rlweave chaos inject`` on a running job)."""
        with self.lock:
            self.faults.append(FaultSpec(**fault))

    def fired_list(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.fired)

    def status(self) -> dict[str, Any]:
        return {"faults": self.fired_list()}

    def on_request(self, got: Received) -> None:
        """``rlweave chaos`` on a running job: ``inject`` a fault, or the monitor's ``status``."""
        m = got.message
        if m["chaos"] == "inject":
            self.inject(m["fault"])
            self.monitor.receiver.reply(got, {"injected": m["fault"]})
        elif m["chaos"] == "status":
            status = self.monitor.status()
            status["incidents"] = status["incidents"][-20:]  # a datagram's worth
            self.monitor.receiver.reply(got, status)

    def after_beat(self, got: Received, now: float) -> None:
        """A worker beat: tell it its ``slow`` factor, arm the faults whose moment came, fire
        those due (a fault without a delay fires on the beat that arms it)."""
        with self.lock:
            factor = self.slow.get(got.message["worker"])
        if factor is not None:
            self.monitor.receiver.reply(got, {"slow": factor})
        self._arm(now)
        self.on_check(now)

    def _target_in(self, fault: FaultSpec, workers: dict[str, dict[str, Any]]) -> bool:
        """Whether the fault's section is running: a rollout worker's is its replica server's
        (``generate``: requests in flight on that replica); a trainer rank's is its own; another
        worker's is its own or the controller's stage."""
        if not fault.section:
            return True
        if fault.worker.startswith("rollout:"):
            names = [fault.worker.split("/", 1)[0]]
        elif fault.worker.startswith("trainer:"):
            names = [fault.worker]  # a trainer rank times its own sections: fire inside one
        else:
            names = [fault.worker, CONTROLLER]
        return any(workers.get(n, {}).get("section") == fault.section for n in names)

    def _arm(self, now: float) -> None:
        with self.monitor.lock:
            workers, step = dict(self.monitor.workers), self.monitor.job_step
        with self.lock:
            for index, fault in enumerate(self.faults):
                if index in self.armed or fault.action == "corrupt":
                    continue
                if fault.worker in workers and step >= fault.step and self._target_in(fault, workers):
                    self.armed[index] = now + fault.delay_s

    def on_check(self, now: float) -> None:
        """Fire the armed faults whose time has come."""
        with self.lock:
            due = [(i, self.faults[i]) for i, at in self.armed.items() if at <= now and i not in self.firing]
            self.firing.update(i for i, _ in due)
        for index, fault in due:
            if fault.action == "slow":
                with self.lock:
                    self.slow[fault.worker] = fault.factor
                ok = True
            else:
                ok = self.monitor.signal_worker(fault.worker,
                                                signal.SIGKILL if fault.action == "kill" else signal.SIGSTOP)
            with self.monitor.lock:
                pid, step = self.monitor.workers.get(fault.worker, {}).get("pid", 0), self.monitor.job_step
            record = {"index": index, "fault": asdict(fault), "time_s": time.time(), "ok": ok, "pid": pid, "step": step}
            print(f"rlweave chaos: {fault.action} {fault.worker} at step {step} ({'done' if ok else 'failed'})")
            with self.lock:
                self.fired.append(record)

    def cause_s(self, incident: WorkerIncident) -> float:
        """When the newest fault fired before the incident was detected (0 when none had): the
        start of the detection span in the trace."""
        with self.lock:
            times = [f["time_s"] for f in self.fired if f["time_s"] <= incident.detected_s]
        return max(times, default=0.0)
