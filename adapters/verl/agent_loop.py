"""rlweave's verl agent loops: verl's own loops, with rlweave's trajectory reports around each turn.

- ``rlweave_single_turn`` (verl's ``SingleTurnAgentLoop``) and
- ``rlweave_tool_agent`` (verl's multi-turn ``ToolAgentLoop``).

Select one with ``actor_rollout_ref.rollout.agent.default_agent_loop=<name>``. A dataset row
whose ``extra_info`` has ``rlweave_output_len`` gets exactly that many tokens in a single-turn
response (``max_tokens`` with ``ignore_eos``), or with ``rlweave_output_lens`` one length per
GRPO sibling (:func:`forced_length`): benchmarks use them to replay an output-length
distribution with a random-weight model.

Every turn goes through verl's ``LLMServerClient.generate(request_id=...)``; the wrapper around
it names the trajectory by that request id, the one verl's request balancer routes by, so both
sides speak of one trajectory. Around each call it reports ``TURN_START`` (with the context the
turn is sent) and ``TURN_END`` (with the tokens generated); the gap between two turns is the
trajectory's tool time. It also reports ``START`` and ``FINISH``, and gives each turn the
priority a plugin decides, which verl forwards to vLLM (and to SGLang with rlweave's
``verl_sglang_priority`` patch; ``rollout.scheduling_policy=priority``). The agent loop knows
what verl's request balancer cannot: the prompt's group (the same prompt, in this step and in
later epochs), the task (``data_source``), turn boundaries and tool time.

verl runs agent loops in several worker processes and every turn through one balancer actor.
When that actor is rlweave's (:class:`rlweave.adapters.verl.router.RlweaveLoadBalancer`), the
reports and the priority question go to it, so that one process (the one that also places the
turns) sees the whole rollout; with any other balancer they go to this process's hooks.

The priority question costs the turn no round trip of its own: its answer goes to verl's
``generate`` as a Ray object reference, not awaited. verl asks the same balancer for the turn's
server next (Ray runs one caller's calls to an actor in order, so the answer is decided first)
and hands the reference to the engine actor as a top-level argument, which Ray resolves before
the engine sees it. Awaiting it cost about 7 ms a turn on the CPU rig, 0.13 s on a 20-turn
trajectory with nothing to gain when no turn queues.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from rlweave.host import get_host
from rlweave.types import TrajectoryEvent, TrajectoryEventKind, TrajectoryInfo


def group_key(kwargs: dict[str, Any]) -> str:
    """The samples of one prompt share a key, in this step (its GRPO group) and in every later
    epoch (verl's ``uid`` is new each step), so that the predictor learns per prompt."""
    prompt = kwargs.get("raw_prompt")
    if prompt is None:
        return str(kwargs.get("uid", ""))
    text = json.dumps(list(prompt), sort_keys=True, default=str)
    return hashlib.sha1(f"{kwargs.get('data_source', '')}\0{text}".encode()).hexdigest()[:16]


def forced_length(kwargs: dict[str, Any]) -> int | None:
    """The response length a dataset row forces on this sample, or ``None``.

    ``extra_info.rlweave_output_len`` forces one length on every sibling;
    ``extra_info.rlweave_output_lens`` one per sibling, told apart by the ``session_id`` that
    verl's TransferQueue agent loop gives the samples of a prompt (0 .. rollout.n - 1; the list
    is cycled if shorter). Without a ``session_id`` every sibling would get the first length,
    which is a different workload, so that is refused."""
    extra = kwargs.get("extra_info") or {}
    per_sibling = extra.get("rlweave_output_lens")
    if per_sibling is not None and len(per_sibling):
        session = kwargs.get("session_id")
        if session is None:
            raise ValueError("extra_info.rlweave_output_lens forces one length per GRPO sibling, but verl "
                             "gave the agent loop no session_id to tell the siblings apart (its legacy "
                             "agent loop); give one extra_info.rlweave_output_len per prompt instead, or "
                             "run verl's TransferQueue trainer, which numbers them")
        return int(per_sibling[int(session) % len(per_sibling)])
    forced = extra.get("rlweave_output_len")
    return None if forced is None else int(forced)


class _Reports:
    """Where a trajectory's reports go: the rlweave balancer actor, or this process's hooks."""

    def __init__(self, client: Any) -> None:
        balancer = getattr(client, "_load_balancer", None)
        self._remote = balancer if hasattr(balancer, "rlweave_turn_started") else None
        self._host = get_host()

    def event(self, kind: TrajectoryEventKind, info: TrajectoryInfo) -> None:
        event = TrajectoryEvent(kind, info, time.time())
        if self._remote is not None:
            self._remote.rlweave_trajectory_event.remote(event)  # ordered after this caller's earlier calls
        else:
            self._host.hook.rlweave_trajectory_event(event=event)

    def turn_started(self, info: TrajectoryInfo, caller_priority: int) -> Any:
        """Report the turn's start; return the priority a plugin decides for it (``None``: the
        caller's), or from the balancer a reference to it, the caller's if no plugin decides."""
        event = TrajectoryEvent(TrajectoryEventKind.TURN_START, info, time.time())
        if self._remote is not None:
            return self._remote.rlweave_turn_started.remote(event, caller_priority)
        self._host.hook.rlweave_trajectory_event(event=event)
        return self._host.hook.rlweave_request_priority(trajectory=info)


class _Trajectory:
    """One trajectory as the agent loop sees it, named by verl's request id at its first turn."""

    def __init__(self, kwargs: dict[str, Any], client: Any) -> None:
        self.group, self.task = group_key(kwargs), str(kwargs.get("data_source", ""))
        self.reports = _Reports(client)
        self.info: TrajectoryInfo | None = None

    def turn_starting(self, request_id: str, prompt_ids: Any, caller_priority: int) -> Any:
        context = len(prompt_ids)
        if self.info is None:
            self.info = TrajectoryInfo(str(request_id), self.group, 0, 0, task=self.task,
                                       prompt_len=context, context_len=context)
            self.reports.event(TrajectoryEventKind.START, self.info)
        self.info = replace(self.info, context_len=context)
        return self.reports.turn_started(self.info, caller_priority)

    def turn_ended(self, generated: int) -> None:
        assert self.info is not None
        self.info = replace(self.info, turns_done=self.info.turns_done + 1,
                            tokens_so_far=self.info.tokens_so_far + generated)
        self.reports.event(TrajectoryEventKind.TURN_END, self.info)

    def finished(self) -> None:
        if self.info is not None:
            self.reports.event(TrajectoryEventKind.FINISH, self.info)


class _ReportingClient:
    """verl's ``LLMServerClient`` seen through one trajectory: each ``generate`` is a turn,
    reported to rlweave, with the plugin's priority (the caller's when no plugin decides)."""

    def __init__(self, client: Any, trajectory: _Trajectory) -> None:
        self._client, self._trajectory = client, trajectory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def generate(self, request_id: str, *, prompt_ids: Any, **kwargs: Any) -> Any:
        decided = self._trajectory.turn_starting(request_id, prompt_ids, kwargs.get("priority", 0))
        if decided is not None:
            kwargs["priority"] = decided
        output = await self._client.generate(request_id, prompt_ids=prompt_ids, **kwargs)
        self._trajectory.turn_ended(len(output.token_ids))
        return output


class _Reported:
    """Mixed in front of a verl agent loop: its run is one reported trajectory."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        trajectory = _Trajectory(kwargs, self.server_manager)
        self.server_manager = _ReportingClient(self.server_manager, trajectory)
        try:
            return await super().run(sampling_params, priority=priority, **kwargs)
        finally:
            self.server_manager = self.server_manager._client
            trajectory.finished()


@register("rlweave_single_turn")
class RlweaveSingleTurnAgentLoop(_Reported, SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        forced = forced_length(kwargs)
        if forced is not None:
            sampling_params = {**sampling_params, "max_tokens": forced, "ignore_eos": True}
        return await super().run(sampling_params, priority=priority, **kwargs)


@register("rlweave_tool_agent")
class RlweaveToolAgentLoop(_Reported, ToolAgentLoop):
    pass
