"""Rollout: prompts dispatched to engines, agent-loop trajectories, finished samples.

Called by the verl adapter (agent loop, request load balancer, rollout manager).
"""

from __future__ import annotations

from collections.abc import Sequence

from rlweave.hookspecs import hookspec
from rlweave.types import InstanceLoad, PromptInfo, SampleRecord, TrajectoryEvent, TrajectoryInfo


@hookspec(firstresult=True)
def rlweave_dispatch_order(prompts: Sequence[PromptInfo]) -> list[str] | None:
    """Order in which a rollout batch's prompts start generating (ids, first = first).

    Return ``None`` to keep the framework's order. Skewness-aware dispatch puts the predicted
    long tail first.
    """


@hookspec(firstresult=True)
def rlweave_request_priority(trajectory: TrajectoryInfo) -> int | None:
    """Engine priority of a trajectory's next LLM call (lower runs earlier, as in vLLM).

    Called by the agent-loop adapter before every turn's generate call. ``None``: no priority.
    """


@hookspec(firstresult=True)
def rlweave_choose_instance(
    trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad]
) -> str | None:
    """Engine instance that serves a trajectory's next turn (replaces verl's load balancer).

    Return one ``InstanceLoad.instance_id``, or ``None`` for verl's sticky least-loaded choice.
    """


@hookspec
def rlweave_trajectory_event(event: TrajectoryEvent) -> None:
    """A trajectory started, began or ended a turn or a tool call, or finished."""


@hookspec
def rlweave_sample_finished(sample: SampleRecord) -> None:
    """One rollout sample completed generation (streaming consumers start from here)."""
