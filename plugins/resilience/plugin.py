"""Hook implementations of the resilience plugin (MegaScale).

One process holds the state, verl's trainer: its monitor's threads feed one
:class:`~.monitor.HealthMonitor` through ``rlweave_heartbeat`` and ask ``rlweave_health_check``,
and the trainer asks ``rlweave_incident`` once per incident, the monitor's and those of its own
failed calls alike (:class:`~.policy.RecoveryPolicy` counts the recoveries).
"""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.config import RlweaveConfig
from rlweave.hookspecs import hookimpl
from rlweave.plugins.resilience.checkpoints import newest_good
from rlweave.plugins.resilience.monitor import HealthMonitor, MonitorPolicy
from rlweave.plugins.resilience.policy import RecoveryPolicy
from rlweave.types import (
    CheckpointCandidate,
    Heartbeat,
    Need,
    PluginNeed,
    RecoveryAction,
    RecoveryRecord,
    ResilienceSettings,
    WorkerIncident,
)

settings: ResilienceSettings | None = None
monitor: HealthMonitor | None = None
policy: RecoveryPolicy | None = None
records: list[RecoveryRecord] = []


@hookimpl
def rlweave_configure(config: RlweaveConfig) -> None:
    global settings, monitor, policy
    c = config.resilience
    settings = ResilienceSettings(heartbeat_s=c.heartbeat_s, check_s=c.check_s, snapshot_every=c.snapshot_every,
                                  snapshot_dir=c.snapshot_dir, max_recoveries=c.max_recoveries,
                                  recovery_timeout_s=c.recovery_timeout_s)
    monitor = HealthMonitor(MonitorPolicy(heartbeat_s=c.heartbeat_s, safety_factor=c.safety_factor,
                                          min_timeout_s=c.min_timeout_s, initial_timeout_s=c.initial_timeout_s,
                                          section_floor_s=c.section_floor_s,
                                          straggler_threshold=c.straggler_threshold))
    policy = RecoveryPolicy(max_recoveries=c.max_recoveries, evict=c.evict_stragglers)
    records.clear()


NEEDS = (
    PluginNeed(Need.STEP_REDO, "resilience", "recovery redoes the step in flight from the newest snapshot"),
    PluginNeed(Need.HOST_SNAPSHOT, "resilience",
               "the first checkpoint stage copies each rank's model and optimizer to host memory"),
)


@hookimpl
def rlweave_needs() -> Sequence[PluginNeed]:
    return NEEDS


@hookimpl
def rlweave_resilience_settings() -> ResilienceSettings | None:
    return settings


@hookimpl
def rlweave_heartbeat(beat: Heartbeat) -> None:
    _configured(monitor).observe(beat)


@hookimpl
def rlweave_health_check(now_s: float) -> Sequence[WorkerIncident]:
    return _configured(monitor).check(now_s)


@hookimpl
def rlweave_incident(incident: WorkerIncident) -> RecoveryAction:
    return _configured(policy).decide(incident)


@hookimpl
def rlweave_recovery_done(record: RecoveryRecord) -> None:
    records.append(record)


@hookimpl
def rlweave_resume_checkpoint(candidates: Sequence[CheckpointCandidate]) -> CheckpointCandidate | None:
    return newest_good(candidates)


def _configured(obj):
    if obj is None:
        raise RuntimeError("the resilience plugin was registered without rlweave_configure")
    return obj
