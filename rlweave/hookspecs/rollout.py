"""Rollout: prompts dispatched to engines, agent-loop trajectories, finished samples.

Called by the verl adapter (agent loop, request load balancer, rollout manager). verl runs its
agent loops in several worker processes and routes every turn through one request balancer
actor; with rlweave's balancer the agent loops send their trajectory hooks to that actor, so
that one process sees every trajectory under one id (verl's request id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    Called by the verl adapter before every turn's generate call, right after the turn's
    ``TURN_START`` event: in the request balancer actor on the agent loop's behalf (rlweave's
    balancer), else in the agent-loop worker. ``None``: the framework's own priority.
    """


@hookspec(firstresult=True)
def rlweave_choose_instance(
    trajectory: TrajectoryInfo, instances: Sequence[InstanceLoad]
) -> str | None:
    """Engine instance that serves a trajectory's next turn (replaces verl's load balancer).

    Called by rlweave's verl request balancer at every turn's acquire. Return one
    ``InstanceLoad.instance_id``, or ``None`` for verl's sticky least-loaded choice.
    """


@hookspec
def rlweave_trajectory_event(event: TrajectoryEvent) -> None:
    """The agent loop saw a trajectory start, a turn start or end, or the trajectory finish.

    Called by rlweave's verl agent loops: in the request balancer actor (rlweave's balancer),
    else in the agent-loop worker. The time between a turn's end and the next one's start is
    spent outside the engine (tool calls).
    """


@hookspec
def rlweave_rollout_state() -> dict[str, Any] | None:
    """What a rollout plugin learned that should outlive a restart: JSON-serialisable, keyed by
    the plugin's config section (Heddle: its remaining-time predictor's history).

    Called in the request balancer actor when verl saves a checkpoint; the verl adapter writes
    the answers beside it (``global_step_N/rlweave_rollout_state.json``).
    """


@hookspec
def rlweave_restore_rollout_state(state: dict[str, Any]) -> None:
    """What :func:`rlweave_rollout_state` returned (every plugin's answer, merged), after the
    framework loaded the checkpoint it was saved with. A plugin takes its own key.

    Called in the request balancer actor after verl resumes from a checkpoint.
    """


@hookspec
def rlweave_sample_finished(sample: SampleRecord) -> None:
    """One rollout sample completed generation (streaming consumers start from here)."""
