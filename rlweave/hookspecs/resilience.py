"""Fault tolerance and diagnosis (MegaScale): heartbeats, stragglers, hangs, recovery, checkpoints.

Called by ``rlweave.adapters.verl.resilience`` (the trainer and its monitor) and by the
heartbeat senders that the verl and vLLM adapters start in their workers' processes.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.hookspecs import hookspec
from rlweave.types import (
    CheckpointCandidate,
    Heartbeat,
    RecoveryAction,
    RecoveryRecord,
    ResilienceSettings,
    WorkerIncident,
)


@hookspec(firstresult=True)
def rlweave_resilience_settings() -> ResilienceSettings | None:
    """Whether to run heartbeats, snapshots and recovery, and how often.

    Called by the verl and vLLM adapters in every process they load in (a worker starts its
    heartbeat sender only when an answer comes back) and by the verl trainer. ``None``: no
    resilience, the framework's own behaviour.
    """


@hookspec
def rlweave_heartbeat(beat: Heartbeat) -> None:
    """A worker's heartbeat or progress reached the monitor, or the monitor saw its process exit
    (``beat.alive`` False). Called by the monitor once per datagram received."""


@hookspec
def rlweave_health_check(now_s: float) -> Sequence[WorkerIncident]:
    """The monitor's periodic check, every ``ResilienceSettings.check_s`` on its monotonic
    clock: return the incidents first detected since the previous call (each incident once),
    localised (the worker that stopped first is the culprit). Called by the monitor."""


@hookspec(firstresult=True)
def rlweave_incident(incident: WorkerIncident) -> RecoveryAction | None:
    """What to do about an incident: kill, replace, rebuild, report or abort.

    Called once per incident, in one place (the verl trainer's), for what the monitor's health
    check found and for a worker failure the trainer met alike; the adapter applies the answer.
    ``None``: the framework's own behaviour (the job fails).
    """


@hookspec
def rlweave_recovery_done(record: RecoveryRecord) -> None:
    """A recovery finished (or failed): called by the verl trainer after it applied a decision."""


@hookspec(firstresult=True)
def rlweave_resume_checkpoint(candidates: Sequence[CheckpointCandidate]) -> CheckpointCandidate | None:
    """Which persisted checkpoint a resuming job loads, given every one found (newest first) and
    what verifying each found. Called by the verl trainer when verl resumes (``resume_mode``).
    ``None``: verl's own choice (its tracker file, unverified).
    """
