"""What to do about an incident, by the role of the worker (MegaScale's recovery, per RL role).

- A hung worker that is the culprit is killed: its hang becomes a crash that the framework and
  the rest of the recovery handle (nvidia-resiliency-ext kills hung ranks the same way). A hung
  worker that only waits on the culprit is left alone; the culprit's recovery takes it along.
  The controller is never killed: it is the job (and the monitor's own process), and a stage
  that it waits in for too long is its workers' to explain; it is reported.
- A dead rollout replica (its server or its engine) is replaced: a fresh replica, weights
  re-synced, its in-flight requests resubmitted.
- A dead trainer rank takes its worker group down: the group is rebuilt and restored from the
  newest host-memory snapshot, the step in flight redone.
- A straggler is reported; with ``evict`` it is replaced (rollout) or its group rebuilt (trainer).
- Other roles (agent-loop, reward workers, the controller) have no recovery: the job is aborted
  with a message, instead of waiting forever for samples that cannot come.
- After ``max_recoveries`` replacements and rebuilds, the job is aborted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.types import Health, RecoveryAction, RecoveryKind, WorkerIncident

RECOVERABLE = {"trainer": RecoveryKind.REBUILD, "rollout": RecoveryKind.REPLACE}


@dataclass
class RecoveryPolicy:
    max_recoveries: int = 5
    evict: bool = False
    recoveries: int = 0

    def decide(self, incident: WorkerIncident) -> RecoveryAction:
        recovery = RECOVERABLE.get(incident.role)
        if incident.kind is Health.STRAGGLER:
            if self.evict and recovery is not None:
                return self._recover(recovery, f"evict the straggler (score {incident.score:.2f})")
            return RecoveryAction(RecoveryKind.REPORT, f"straggler, score {incident.score:.2f}")
        if incident.kind is Health.HUNG:
            if incident.role == "controller":
                return RecoveryAction(RecoveryKind.REPORT, f"the controller waits in {incident.section or 'a stage'}; "
                                                           "ending it would end the job")
            if incident.culprit:
                return RecoveryAction(RecoveryKind.KILL, "hung: end it so that its recovery starts")
            return RecoveryAction(RecoveryKind.REPORT, "waits on a hung peer")
        if recovery is None:
            return RecoveryAction(RecoveryKind.ABORT, f"no recovery for a {incident.role} worker")
        return self._recover(recovery, f"{incident.worker} died")

    def _recover(self, kind: RecoveryKind, reason: str) -> RecoveryAction:
        if self.recoveries >= self.max_recoveries:
            return RecoveryAction(RecoveryKind.ABORT, f"{reason}, but {self.max_recoveries} recoveries "
                                                      "were made already (max_recoveries)")
        self.recoveries += 1
        return RecoveryAction(kind, reason)
