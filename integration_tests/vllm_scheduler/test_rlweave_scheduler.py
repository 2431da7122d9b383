"""rlweave's scheduler against the real scheduler of each supported vLLM release, with no
engine: arrivals, iterations, preemption by parking and by recompute, resume, finish and abort,
plain, with preemptive_serving and with a priority-deciding plugin. Every request finishes once
with all its tokens, the KV blocks come back, and a parked request resumes with no recompute.
(The model runner is a stand-in: see harness.py.)"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from harness import Run, build_scheduler, drain, make_request, step

from rlweave.hookspecs import hookimpl
from rlweave.types import ScheduleDecision

# Mixed lengths, more requests than slots (what makes a policy reorder and preempt).
PROMPTS = [40, 8, 24, 16, 56, 8, 32, 12]
MAX_TOKENS = [24, 6, 16, 4, 20, 10, 8, 14]


class Recorder:
    """Counts the engine hooks rlweave's scheduler fires."""

    def __init__(self) -> None:
        self.arrived: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.steps = 0
        self.preempted: dict[str, int] = {}

    @hookimpl
    def rlweave_request_arrived(self, request):  # type: ignore[no-untyped-def]
        self.arrived[request.request_id] += 1

    @hookimpl
    def rlweave_engine_step(self, step):  # type: ignore[no-untyped-def]
        self.steps += 1

    @hookimpl
    def rlweave_request_finished(self, request):  # type: ignore[no-untyped-def]
        self.finished[request.request_id] += 1
        self.preempted[request.request_id] = request.num_preemptions


class PriorityFirst:
    """A priority-deciding plugin: the waiting queue by (priority, arrival), and a running
    request whose priority is worse than the best waiting one's is preempted."""

    @hookimpl
    def rlweave_schedule(self, waiting, running, engine):  # type: ignore[no-untyped-def]
        order = sorted(waiting, key=lambda r: (r.priority, r.arrival_s))
        best = order[0].priority if order else None
        worse = tuple(r.request_id for r in running if best is not None and r.priority > best)
        return ScheduleDecision(waiting_order=tuple(r.request_id for r in order),
                                preempt=worse if engine.can_preempt else ())


def rlweave_class(asynchronous: bool = False) -> type:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from rlweave.adapters.vllm.scheduler import rlweave_scheduler_for

    cls = rlweave_scheduler_for(AsyncScheduler if asynchronous else Scheduler)
    assert cls.__module__ == "rlweave.adapters.vllm.scheduler", "no rlweave plugin listens"
    return cls


def submit(scheduler: Any, ids: range, priority: int = 0) -> None:
    for i in ids:
        scheduler.add_request(make_request(f"r{i}", PROMPTS[i % 8], MAX_TOKENS[i % 8], priority))


def check_invariants(scheduler: Any, run: Run, free_at_start: int, expect: dict[str, int]) -> None:
    """Every request finished once with its tokens; nothing left; every KV block back."""
    assert Counter(run.finished) == Counter(expect.keys()), "a request finished twice or never"
    for rid, n in expect.items():
        assert len(run.tokens[rid]) == n, f"{rid}: {len(run.tokens[rid])} tokens, not {n}"
    assert not scheduler.requests and not scheduler.running and not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free_at_start, "KV blocks leaked"


def expected(ids: range) -> dict[str, int]:
    return {f"r{i}": MAX_TOKENS[i % 8] for i in ids}


@pytest.mark.timeout(120)
def test_harness_runs_vllms_own_scheduler_which_preempts_when_kv_is_short(vllm_version, model):
    # The harness first, with vLLM alone: 7 blocks of 16 tokens for 2 slots (the longest request
    # needs 5) make vLLM preempt by itself.
    from vllm.v1.core.sched.scheduler import Scheduler

    scheduler = build_scheduler(Scheduler, model, num_blocks=7, max_num_seqs=2)
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    submit(scheduler, range(8))
    drain(scheduler, run)
    check_invariants(scheduler, run, free, expected(range(8)))
    assert run.runner.resumed, "vLLM never preempted: the case is not tight"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["Scheduler", "AsyncScheduler"])
def test_plain_rlweave_scheduler_fires_each_hook_once_per_request(vllm_version, model, host, asynchronous):
    recorder = Recorder()
    host.get_host().pm.register(recorder)
    scheduler = build_scheduler(rlweave_class(asynchronous), model, num_blocks=9, max_num_seqs=2)
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    submit(scheduler, range(8))
    drain(scheduler, run)
    check_invariants(scheduler, run, free, expected(range(8)))
    assert recorder.arrived == Counter(expected(range(8)).keys())
    assert recorder.finished == Counter(expected(range(8)).keys())
    assert 0 < recorder.steps <= run.iterations


@pytest.mark.timeout(180)
def test_preemptive_serving_parks_where_kv_has_room_and_resumes_without_recompute(
        vllm_version, model, host, monkeypatch):
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__ENABLE", "true")
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__POLICY", "skip_join_mlfq")
    recorder = Recorder()
    host.get_host().pm.register(recorder)
    scheduler = build_scheduler(rlweave_class(), model, num_blocks=128, max_num_seqs=2)
    assert scheduler._rlweave_engine.keeps_preempted_kv
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    submit(scheduler, range(8))
    drain(scheduler, run, compute_s_per_token=2e-4)
    check_invariants(scheduler, run, free, expected(range(8)))
    assert run.runner.resumed, "MLFQ never preempted"
    assert all(had == resumed_with and had > 0 for _, had, resumed_with in run.runner.resumed), \
        f"a parked request was recomputed: {run.runner.resumed}"
    assert sum(recorder.preempted.values()) >= len(run.runner.resumed)


@pytest.mark.timeout(180)
def test_preemptive_serving_recomputes_where_kv_is_short(vllm_version, model, host, monkeypatch):
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__ENABLE", "true")
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__POLICY", "skip_join_mlfq")
    scheduler = build_scheduler(rlweave_class(), model, num_blocks=10, max_num_seqs=2)
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    submit(scheduler, range(8))
    drain(scheduler, run, compute_s_per_token=2e-4)
    check_invariants(scheduler, run, free, expected(range(8)))
    recomputed = [r for r in run.runner.resumed if r[2] < r[1]]
    assert recomputed, f"no request was recomputed on resume: {run.runner.resumed}"
    assert all(resumed_with == 0 for _, _, resumed_with in recomputed)


def _background_then_urgent(scheduler: Any, run: Run) -> None:
    """Four long background requests (priority 10) run three iterations, then four short
    urgent ones (priority 0) arrive."""
    for i in range(4):
        scheduler.add_request(make_request(f"bg{i}", 24, 30, priority=10))
    for _ in range(3):
        step(scheduler, run)
    for i in range(4):
        scheduler.add_request(make_request(f"urgent{i}", 8, 4, priority=0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_priority_plugin_parks_background_requests_for_urgent_ones(vllm_version, model, host, policy):
    host.get_host().pm.register(PriorityFirst())
    scheduler = build_scheduler(rlweave_class(), model, num_blocks=128, max_num_seqs=2, policy=policy)
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    _background_then_urgent(scheduler, run)
    drain(scheduler, run)
    check_invariants(scheduler, run, free, {f"bg{i}": 30 for i in range(4)} | {f"urgent{i}": 4 for i in range(4)})
    assert set(run.finished[:4]) == {f"urgent{i}" for i in range(4)}, run.finished
    parked = [r for r in run.runner.resumed if r[0].startswith("bg")]
    assert parked and all(had == resumed_with for _, had, resumed_with in parked), run.runner.resumed


@pytest.mark.timeout(120)
def test_abort_of_parked_running_and_waiting_requests_frees_every_block(vllm_version, model, host):
    from vllm.v1.request import RequestStatus

    recorder = Recorder()
    plugin = host.get_host().pm
    plugin.register(recorder)
    plugin.register(PriorityFirst())
    scheduler = build_scheduler(rlweave_class(), model, num_blocks=128, max_num_seqs=2, policy="priority")
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    _background_then_urgent(scheduler, run)
    step(scheduler, run)  # the urgent ones preempt (park) the running background requests
    parked = sorted(scheduler._rlweave_parked)
    running = [r.request_id for r in scheduler.running]
    waiting = [r.request_id for r in scheduler.waiting if r.request_id not in parked]
    assert parked and running and waiting, (parked, running, waiting)
    aborted = [parked[0], running[0], waiting[-1]]
    scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
    drain(scheduler, run)
    everyone = {f"bg{i}" for i in range(4)} | {f"urgent{i}" for i in range(4)}
    assert recorder.finished == Counter(everyone), "a request left without its finish hook, or twice"
    assert Counter(run.finished) == Counter(everyone - set(aborted))
    assert not scheduler.requests and not scheduler._rlweave_parked
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free, "KV blocks leaked"


@pytest.mark.timeout(120)
def test_async_scheduler_with_preemptive_serving_orders_but_never_preempts(vllm_version, model, host, monkeypatch):
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__ENABLE", "true")
    scheduler = build_scheduler(rlweave_class(asynchronous=True), model, num_blocks=128, max_num_seqs=2)
    assert not scheduler._rlweave_engine.can_preempt
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run = Run()
    submit(scheduler, range(8))
    drain(scheduler, run, compute_s_per_token=2e-4)
    check_invariants(scheduler, run, free, expected(range(8)))
    assert not run.runner.resumed


# What each release's scheduler looks like to rlweave (rlweave.adapters.vllm.shape).
SHAPES = {
    "0.24": (False, "new request data with model runner V2, else resumed cached data", ("skipped_waiting",)),
    # 0.25-0.30 (read from their scheduler.py): reset_preempted_req_ids arrives in 0.25, the
    # skipped_waiting queue goes in 0.31.
    **{f"0.{minor}": (True, "new request data with model runner V2, else resumed cached data", ("skipped_waiting",))
       for minor in range(25, 31)},
    "0.31": (True, "new request data with model runner V2, else resumed cached data", ()),
    "0.32": (True, "new request data with model runner V2, else resumed cached data", ()),
    "0.33": (True, "new request data with model runner V2, else resumed cached data", ()),
    "0.34": (True, "new request data", ("async_kv_waiting",)),
}


def test_scheduler_shape_is_found_once_and_logged(vllm_version, series, model, host, caplog):
    from rlweave.adapters.vllm import scheduler as module

    module.scheduler_shape.cache_clear()
    host.get_host().pm.register(Recorder())
    with caplog.at_level(logging.INFO, logger="rlweave.adapters.vllm"):
        scheduler = build_scheduler(rlweave_class(), model, num_blocks=16, max_num_seqs=2)
        build_scheduler(rlweave_class(), model, num_blocks=16, max_num_seqs=2)
    shape = scheduler._rlweave_shape
    assert shape.parks_by_upstream
    assert (shape.persistent_preempted_ids, shape.resume_sent_as, shape.other_queues) == SHAPES[series]
    lines = [r.getMessage() for r in caplog.records if "scheduler shape" in r.getMessage()]
    assert lines == [f"rlweave: vLLM scheduler shape: {shape.describe()}"]
