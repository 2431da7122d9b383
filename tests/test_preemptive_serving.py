"""Skip-join MLFQ (FastServe) as a pure algorithm: levels, skip-join, demotion, the starvation
bound, priority-first ordering, preemption decisions, the measured profile, and config errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import activate
from rlweave.plugins.preemptive_serving.mlfq import SkipJoinMLFQ
from rlweave.plugins.preemptive_serving.profile import IterationProfile
from rlweave.plugins.preemptive_serving.scheduler import PreemptiveScheduler
from rlweave.types import EngineInfo, EngineStep, RequestView

Q = 0.01  # base quantum in these tests


def mlfq(**kw) -> SkipJoinMLFQ:
    return SkipJoinMLFQ(base_quantum_s=Q, **{"ratio": 2.0, "num_levels": 4, "starvation_s": 1.0} | kw)


def test_quanta_grow_by_the_ratio_and_skip_join_picks_the_first_covering_level():
    q = mlfq()
    assert [q.quantum(p) for p in range(4)] == pytest.approx([0.01, 0.02, 0.04, 0.08])
    assert [q.join_level(t) for t in (0.0, 0.01, 0.011, 0.03, 0.05, 10.0)] == [0, 0, 1, 2, 3, 3]


def test_demotion_by_attained_service_resets_service_and_stops_at_the_last_level():
    q = mlfq()
    q.add("a", now=0.0)
    q.served(["a"], 0.006, now=1.0)
    assert q.jobs["a"].level == 0  # 6 ms < q0
    q.served(["a"], 0.006, now=2.0)
    assert (q.jobs["a"].level, q.jobs["a"].attained_s, q.jobs["a"].entered_s) == (1, 0.0, 2.0)
    for t in range(10):
        q.served(["a"], 1.0, now=3.0 + t)
    assert q.jobs["a"].level == 3


def test_running_request_keeps_its_place_ahead_of_newcomers_of_its_level():
    q = mlfq()
    q.add("old", now=0.0)
    q.served(["old"], 0.001, now=0.5)
    q.add("new", now=0.6)
    order, preempt = q.decide(["new"], ["old"], slots=1, now=0.7)
    assert (order, preempt) == (["new"], [])


def test_serving_a_request_every_iteration_costs_no_starvation_bookkeeping():
    q = mlfq()
    q.add("running", now=0.0)
    q.add("waiting", now=0.0)
    for k in range(1, 1000):  # 0.999 s of 1 ms iterations
        q.served(["running"], 0.001, now=k * 0.001)
        assert q.promote_starved(k * 0.001) == []
    assert len(q._unserved) == 2  # one entry per request, not one per iteration
    assert q.promote_starved(1.0) == ["waiting"]  # the running one moved its entry up instead
    assert q.promote_starved(1.5) == [] and q.promote_starved(1.999) == ["running"]


def test_the_best_waiting_requests_come_from_the_kept_ranking_as_from_a_full_sort():
    rng = np.random.default_rng(1)
    q = mlfq(starvation_s=0.05)
    for i in range(200):
        q.add(f"r{i}", now=i * 1e-3, prefill_s=float(rng.exponential(0.03)), priority=int(rng.integers(0, 2)))
    for k in range(300):  # levels move, requests leave and come back, some starve
        rid = f"r{int(rng.integers(0, 200))}"
        if rid not in q.jobs:
            q.add(rid, now=0.2 + k * 1e-3)
        elif k % 3:
            q.set_level(rid, int(rng.integers(0, 4)), now=0.2 + k * 1e-3)
        else:
            q.remove(rid)
        running = [r for r in list(q.jobs)[:4]]
        q.served(running, 0.004, now=0.2 + k * 1e-3)
        best, _ = q.decide(None, running, slots=4, now=0.2 + k * 1e-3)
        rest = sorted((j for j in q.jobs.values() if j.request_id not in running), key=lambda j: j.key)
        assert best == [j.request_id for j in rest[:4]]


def test_new_short_request_preempts_the_worst_ranked_running_one():
    q = mlfq()
    for rid in ("long1", "long2"):
        q.add(rid, now=0.0)
    q.served(["long1", "long2"], 0.05, now=0.05)  # both demoted to level 1
    q.served(["long2"], 0.05, now=0.1)  # long2 to level 2
    q.add("short", now=0.1)
    assert q.decide(["short"], ["long1", "long2"], slots=2, now=0.1) == (["short"], ["long2"])
    assert q.decide(["short"], ["long1", "long2"], slots=3, now=0.1) == (["short"], [])  # a slot is free
    assert q.decide(["short"], ["long1", "long2"], slots=2, now=0.1, can_preempt=False) == (["short"], [])


def test_explicit_priority_ranks_before_any_mlfq_level():
    q = mlfq()
    q.add("urgent", now=0.0, priority=-1, prefill_s=1.0)  # joins the last level
    q.add("fresh", now=0.1, priority=0)  # level 0
    assert q.jobs["urgent"].level == 3 and q.jobs["fresh"].level == 0
    assert q.decide(["fresh", "urgent"], [], slots=2, now=0.2)[0] == ["urgent", "fresh"]
    assert q.decide(["fresh", "urgent"], [], slots=1, now=0.2)[0] == ["urgent"]  # the slots' worth
    # ... and a running lower-priority request at level 0 is preempted for it.
    q.add("late_urgent", now=0.3, priority=-1, prefill_s=1.0)
    assert q.decide(["late_urgent"], ["fresh"], slots=1, now=0.3) == (["late_urgent"], ["fresh"])


def simulate(q: SkipJoinMLFQ, arrivals: dict[int, list[str]], iterations: int, slots: int,
             dt: float, work: dict[str, int]) -> dict[str, list[float]]:
    """An engine with ``slots`` batch slots applying every decision; a request leaves after
    ``work[id]`` iterations. Returns the end times of the iterations that computed each."""
    running: list[str] = []
    waiting: list[str] = []
    served: dict[str, list[float]] = {}
    for i in range(iterations):
        now = i * dt
        for rid in arrivals.get(i, []):
            q.add(rid, now=now)
            waiting.append(rid)
        order, preempt = q.decide(waiting, running, slots, now)
        running = [r for r in running if r not in preempt]
        admitted = order[: slots - len(running)]
        waiting = [r for r in waiting if r not in admitted] + preempt
        running += admitted
        q.served(running, dt, now + dt)
        for rid in running:
            served.setdefault(rid, []).append(now + dt)
        for rid in [r for r in running if len(served[r]) >= work[r]]:
            running.remove(rid)
            q.remove(rid)
    return served


# A long request, then for 1 s a one-iteration request every iteration: the short requests
# alone keep the one slot busy. (Longer, the backlog they build while the long one runs would
# make them starve too, and older starving requests rank first: no bound holds in overload.)
ARRIVALS = {0: ["long"]} | {i: [f"short{i}"] for i in range(5, 105)}
WORK = {"long": 10_000} | {f"short{i}": 1 for i in range(5, 105)}


def test_starvation_promotion_bounds_the_wait_of_a_demoted_request():
    # One slot, and the short requests alone would keep it busy: without promotion the
    # demoted long request would never run again.
    q = mlfq(starvation_s=0.2)
    served = simulate(q, ARRIVALS, iterations=150, slots=1, dt=Q, work=WORK)
    times = np.array(served["long"])
    gaps = np.diff(times)
    assert len(times) > 10 and q.promotions > 0
    assert gaps.max() <= 0.2 + 2 * Q + 1e-9  # the stated bound: starvation_s + 2 iterations


def test_without_promotion_the_same_workload_starves():
    q = mlfq(starvation_s=1e9)
    served = simulate(q, ARRIVALS, iterations=150, slots=1, dt=Q, work=WORK)
    assert np.diff(served["long"]).max() >= 1.0  # waits out the whole stream


def test_short_jobs_finish_before_a_long_one_under_mlfq():
    q = mlfq()
    served = simulate(q, {0: ["long"], 3: ["short"]}, iterations=20, slots=1, dt=Q,
                      work={"long": 15, "short": 2})
    assert served["short"][0] < served["long"][-1]


def test_profile_fits_the_engines_iterations_and_needs_two_token_buckets():
    p = IterationProfile(min_samples=4)
    for _ in range(6):
        p.observe(4, 0.002 + 4e-5 * 4)
    assert not p.ready  # decode-sized iterations only: the slope is unknown
    for n in (64, 128, 256):
        p.observe(n, 0.002 + 4e-5 * n)
    assert p.ready
    assert p.line() == pytest.approx((0.002, 4e-5), rel=1e-6)
    assert p.prefill_s(500) == pytest.approx(0.022)
    assert p.shortest_s == pytest.approx(0.00216)


def engine(can_preempt: bool = True) -> EngineInfo:
    return EngineInfo("vllm", "e", max_num_seqs=2, max_num_batched_tokens=2048,
                      can_preempt=can_preempt)


def view(rid: str, prompt_len: int = 8, priority: int = 0) -> RequestView:
    return RequestView(rid, 0.0, prompt_len, 0, 16, priority)


def warmed(policy: str = "skip_join_mlfq", **options) -> PreemptiveScheduler:
    config = build_config([Setting("preemptive_serving.policy", policy, "test"),
                           *(Setting(f"preemptive_serving.{k}", v, "test") for k, v in options.items())])
    s = PreemptiveScheduler(config.preemptive_serving, engine())
    for i, n in enumerate((2, 2, 2, 2, 100, 200, 300, 400)):  # 2 ms + 0.1 ms per token
        s.step(EngineStep("e", 1, 0, n, float(i), i + 0.002 + 1e-4 * n))
    return s


def test_scheduler_skip_joins_from_the_measured_profile_and_takes_the_shortest_iteration():
    s = warmed()
    assert s.mlfq.base_quantum_s == pytest.approx(0.0022)  # measured, not configured
    s.arrive(view("short", prompt_len=1), now=10.0)
    s.arrive(view("long", prompt_len=300), now=10.0)  # 32 ms prefill -> q_4 = 35.2 ms
    assert (s.mlfq.jobs["short"].level, s.mlfq.jobs["long"].level) == (0, 4)


def test_plain_mlfq_policy_and_a_fixed_quantum():
    s = warmed("mlfq", base_quantum_ms=5)
    s.arrive(view("long", prompt_len=300), now=10.0)
    assert s.mlfq.jobs["long"].level == 0 and s.mlfq.base_quantum_s == 0.005


def test_scheduler_decision_preempts_only_where_the_engine_can():
    for can in (True, False):
        config = build_config([Setting("preemptive_serving.policy", "skip_join_mlfq", "test")])
        s = PreemptiveScheduler(config.preemptive_serving, engine(can_preempt=can))
        for rid in ("a", "b"):
            s.arrive(view(rid), now=0.0)
        s.step(EngineStep("e", 0, 0, 1, 0.0, 0.001))  # measures the quantum: 1 ms
        s.step(EngineStep("e", 2, 0, 2, 0.0, 1.0, scheduled=("a", "b")))  # both demoted
        s.arrive(view("c"), now=1.0)
        decision = s.decide([view("c")], [view("a"), view("b")], now=1.0)
        assert decision.waiting_order == ("c",)
        assert decision.preempt == (("b",) if can else ())


@pytest.mark.parametrize("key, value, message", [
    ("base_quantum_ms", -1, "bad value -1.0 for 'rlweave.preemptive_serving.base_quantum_ms'; allowed: >= 0"),
    ("policy", "srpt", "unknown rlweave.preemptive_serving.policy 'srpt'; allowed: adaptive, skip_join_mlfq, mlfq"),
    ("quantum_ratio", 1, "allowed: > 1"),
    ("num_levels", 0, "allowed: >= 1"),
    ("starvation_s", 0, "allowed: > 0"),
])
def test_bad_config_names_the_option_and_what_is_allowed(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config([Setting("preemptive_serving.enable", True, "test"),
                      Setting(f"preemptive_serving.{key}", value, "test")])


def test_enabling_registers_the_plugin_and_disabled_leaves_it_absent(monkeypatch):
    assert not activate(export_env=False).implements("rlweave_schedule")
    monkeypatch.setenv("RLWEAVE__PREEMPTIVE_SERVING__ENABLE", "true")
    assert activate(export_env=False).implements("rlweave_schedule")
