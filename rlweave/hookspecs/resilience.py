"""Fault tolerance and diagnosis: heartbeats, stragglers, hangs, checkpoints."""

from __future__ import annotations

from rlweave.hookspecs import hookspec
from rlweave.types import Heartbeat, WorkerIncident


@hookspec
def rlweave_heartbeat(beat: Heartbeat) -> None:
    """A worker reported liveness and progress (called by the adapter in the driver)."""


@hookspec(firstresult=True)
def rlweave_incident(incident: WorkerIncident) -> str | None:
    """A worker is late, hung or failed. Return the action: "wait", "restart" or "evict".

    ``None`` keeps the framework's behaviour (usually: wait, then time out).
    """
