"""The one place a verl job decides what to do about an incident, and the actions that apply it.

An incident comes from one of two places: the monitor found it (a process exited, a worker went
silent or stuck, a straggler), and queued it typed (:class:`~rlweave.types.WorkerIncident`); or
a call of the trainer's failed with a worker's error, and :func:`trainer_incident` made one of
the error. Both go through :meth:`IncidentDesk.handle`: ``rlweave_incident`` is asked once (the
policy counts recoveries, so a second question would count one twice), the answer is logged, and
its first half applied at once by the :class:`RecoveryExecutor`: ``kill`` ends a hung worker;
``rebuild`` and ``replace`` stop the trainer ranks or the replica's processes, so that the
trainer, blocked in a call to them, gets an error now instead of at a collective's timeout. The
second half (``replace``, ``rebuild``, ``abort``) is the trainer's, at its next safe point
(:mod:`.resilient_trainer`).

The desk drains the monitor's queue from a thread of its own: the trainer's thread may be
blocked in a call to a hung worker, and only the kill decided here ends that call.

One trainer death is one incident. The monitor sees a death on its node the moment the kernel
ends the process, while the trainer meets it as a failed call (Ray's ``ActorDiedError``, or a
surviving rank's broken gloo pair, which names the wrong rank): the trainer waits up to
:data:`MONITOR_GRACE_S` for the monitor's incident before it makes one of its own, and while a
rebuild of the trainer group is decided and not yet done, a further trainer death (the same
failure, reported twice) is logged as part of it and not asked again, nor is a report, arriving
late, of a death that began before the new group was built; so the policy counts one recovery
(``max_recoveries``) per failure.
"""

from __future__ import annotations

import queue
import signal
import threading
from dataclasses import asdict
from typing import Any

import ray

from rlweave.adapters.verl.resilience_monitor import ResilienceMonitor
from rlweave.types import Health, RecoveryAction, RecoveryKind, WorkerIncident

# What a worker's death looks like from the trainer's side of a failed call (gloo's and Ray's words).
FAILURE_MARKS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo",
                 "ActorDiedError", "ActorUnavailableError")
# How long a failed trainer call waits for the monitor's incident before it makes its own: a
# death on the monitor's node reaches the desk within milliseconds (a pidfd, then the desk's
# 0.1-s poll); 2 s leaves room for a loaded machine. A death on another node is seen by its
# heartbeats, later: the trainer then asks with its own incident and the desk folds the
# monitor's later report into the rebuild already decided.
MONITOR_GRACE_S = 2.0


class TrainerGroupLost(RuntimeError):
    """The monitor found a trainer rank dead while no worker call was running."""


def trainer_incident(error: BaseException, rank: str, step: int, now_s: float) -> WorkerIncident | None:
    """The incident a failed trainer call stands for: a trainer rank ``rank`` dead, when the
    error is Ray's word for a dead actor or carries a worker's dying words; else ``None`` (an
    error of the job's own, which recovery must not hide)."""
    text = f"{type(error).__name__}: {error}"
    direct = isinstance(error, (ray.exceptions.RayActorError, TrainerGroupLost))
    if not direct and not any(mark in text for mark in FAILURE_MARKS):
        return None
    return WorkerIncident(worker=f"trainer:{rank}", kind=Health.DEAD, step=step, detected_s=now_s, since_s=now_s,
                          detail=text[:300])


class RecoveryExecutor:
    """The actions a decision names, applied through the monitor (the one that knows which
    process is the job's). It holds no policy: it does what it is told."""

    def __init__(self, monitor: ResilienceMonitor) -> None:
        self.monitor = monitor

    def kill(self, worker: str) -> str:
        return "killed" if self.monitor.signal_worker(worker, signal.SIGKILL) else "kill failed"

    def stop_trainers(self) -> str:
        group = [n for n in self.monitor.names() if n.startswith("trainer:")]
        return f"stopped {', '.join(self.monitor.kill_workers(group))}"

    def stop_replica(self, worker: str) -> str:
        replica = worker.split("/", 1)[0]
        names = [n for n in self.monitor.names() if n.split("/")[0] == replica]
        return f"stopped {', '.join(self.monitor.kill_workers(names))}"

    def first_half(self, incident: WorkerIncident, action: RecoveryAction | None) -> str:
        """What can be done at once, from any thread; what was done, for the log."""
        kind = action.kind if action is not None else None
        if kind is RecoveryKind.KILL:
            return self.kill(incident.worker)
        if kind is RecoveryKind.REBUILD:
            return self.stop_trainers()
        if kind is RecoveryKind.REPLACE:
            return self.stop_replica(incident.worker)
        return ""


class IncidentDesk:
    """See the module docstring. ``hook``: the host's hooks; :meth:`take` hands the trainer the
    monitor's incidents with their decisions, each once."""

    def __init__(self, hook: Any, monitor: ResilienceMonitor, executor: RecoveryExecutor) -> None:
        self.hook, self.monitor, self.executor = hook, monitor, executor
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []  # every incident decided, with what was done
        self.decided: list[tuple[WorkerIncident, RecoveryAction | None]] = []  # the monitor's, for the trainer
        self.rebuilding: WorkerIncident | None = None  # a trainer rebuild decided and not yet done
        self.group_built_s = 0.0  # when the trainer group now running was built (wall clock)
        self.running = True
        self.thread = threading.Thread(target=self._drain, daemon=True, name="rlweave-incidents")
        self.thread.start()

    def handle(self, incident: WorkerIncident) -> RecoveryAction | None:
        """Ask ``rlweave_incident`` once, apply the first half of the answer, log both; a
        trainer death while a rebuild is decided is that rebuild's (module docstring)."""
        return self._decide(incident)[0]

    def _decide(self, incident: WorkerIncident) -> tuple[RecoveryAction | None, bool]:
        """The decision, and whether the incident was folded into a rebuild already decided."""
        folded = self._same_failure(incident)
        if folded:
            action = RecoveryAction(RecoveryKind.REBUILD, folded)
            self._log(incident, action, "not asked again")
            return action, True
        action = self.hook.rlweave_incident(incident=incident)
        if incident.role == "trainer" and action is not None and action.kind is RecoveryKind.REBUILD:
            with self.lock:
                self.rebuilding = self.rebuilding or incident
        self._log(incident, action, self.executor.first_half(incident, action))
        return action, False

    def _same_failure(self, incident: WorkerIncident) -> str:
        """Why a trainer death is a failure already decided, or "" when it is a new one."""
        if incident.role != "trainer" or incident.kind is not Health.DEAD:
            return ""
        with self.lock:
            if self.rebuilding is not None:
                return f"part of the rebuild decided for {self.rebuilding.worker}"
            if incident.since_s < self.group_built_s:
                return "began before the trainer group was rebuilt"
        return ""

    def rebuilt(self, now_s: float) -> None:
        """The trainer group was built anew at ``now_s``: a trainer death that began after it
        is a new failure; one that began before is the old group's, and so the rebuild's."""
        with self.lock:
            self.rebuilding, self.group_built_s = None, now_s

    def _log(self, incident: WorkerIncident, action: RecoveryAction | None, done: str) -> None:
        entry = {"incident": {**asdict(incident), "kind": incident.kind.value},
                 "action": action.kind.value if action else None, "reason": action.reason if action else "",
                 "done": done}
        print(f"rlweave resilience: {incident.kind.value} {incident.worker} (step {incident.step}, "
              f"{incident.section or 'no section'}): {incident.detail} -> {entry['action']} {done}".rstrip())
        with self.lock:
            self.log.append(entry)

    def take(self) -> list[tuple[WorkerIncident, RecoveryAction | None]]:
        """The monitor's incidents decided since the last call, with their decisions."""
        with self.lock:
            new, self.decided = self.decided, []
        return new

    def stop(self) -> None:
        self.running = False
        self.thread.join(timeout=5)

    def _drain(self) -> None:
        while self.running:
            try:
                incident = self.monitor.incidents.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                action, folded = self._decide(incident)
            except Exception as error:  # a failing plugin must not stop the job's recovery thread
                print(f"rlweave resilience: deciding {incident.worker} failed ({type(error).__name__}: {error})")
                action, folded = None, False
            if not folded:  # a folded one's rebuild is already the trainer's
                with self.lock:
                    self.decided.append((incident, action))
