"""Preemption only where it pays: the length model, the adaptive policy's regimes, the
recompute rule, the reused decision, and preemptive serving beside agentic_rollout."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rlweave.config import Setting, build_config
from rlweave.plugins.preemptive_serving.lengths import LengthModel
from rlweave.plugins.preemptive_serving.scheduler import PreemptiveScheduler
from rlweave.requirements import problems
from rlweave.types import EngineInfo, EngineStep, RequestView

RNG = np.random.default_rng(0)
HEAVY = np.clip(RNG.lognormal(np.log(24), 1.2, 256), 4, 400).astype(int)
UNIFORM = RNG.integers(86, 106, 256)


def model(lengths, caps=None, **kw) -> LengthModel:
    m = LengthModel(**kw)
    for n, cap in zip(lengths, caps if caps is not None else [1000] * len(lengths)):
        m.observe(int(n), int(cap))
    return m


def test_expected_remaining_grows_with_service_on_a_heavy_tail_and_shrinks_on_uniform_lengths():
    heavy, uniform = model(HEAVY), model(UNIFORM)
    assert heavy.expected_remaining(0, 1000) < heavy.expected_remaining(50, 1000) < heavy.expected_remaining(150, 1000)
    assert uniform.expected_remaining(0, 1000) > uniform.expected_remaining(50, 1000) > uniform.expected_remaining(90, 1000)
    assert heavy.regime().name == "heavy-tailed" and uniform.regime().name == "light-tailed"
    assert model(RNG.exponential(50, 256).astype(int) + 1).regime().name == "memoryless"
    assert "CV" in heavy.regime().detail


def test_caps_that_are_lengths_give_the_remaining_length_exactly():
    m = model(HEAVY, caps=HEAVY)  # every request ended at its max_tokens (ignore_eos clients)
    assert m.caps_are_lengths and m.regime().name == "caps are lengths"
    assert m.expected_remaining(10, 300) == 290


def test_cap_truncates_and_an_outlier_is_expected_to_run_as_long_again():
    m = model([10] * 20 + [100] * 20, refit_every=1)
    assert m.expected_remaining(0, 1000) == pytest.approx(55)
    assert m.expected_remaining(0, 50) == pytest.approx((10 * 20 + 50 * 20) / 40)  # 100s capped at 50
    assert m.expected_remaining(20, 1000) == pytest.approx(80)  # only the 100s are left
    assert m.expected_remaining(150, 1000) == 150 and m.expected_remaining(150, 160) == 10


def test_the_model_knows_nothing_until_enough_requests_finished():
    m = model([10] * 31)
    assert m.expected_remaining(0, 100) is None and m.regime().name == "warming up"
    m.observe(10, 100)
    assert m.expected_remaining(0, 100) == pytest.approx(10)


def engine(keeps_kv: bool = False) -> EngineInfo:
    return EngineInfo("vllm", "e", max_num_seqs=1, max_num_batched_tokens=2048, num_kv_blocks=1000,
                      block_size=16, can_preempt=True, keeps_preempted_kv=keeps_kv)


def view(rid: str, out: int = 0, cap: int = 1000, prompt: int = 8, priority: int = 0) -> RequestView:
    return RequestView(rid, 0.0, prompt, out, cap, priority, num_computed_tokens=prompt + out - (out > 0))


def adaptive(lengths, caps=None, keeps_kv: bool = False, policy: str = "adaptive") -> PreemptiveScheduler:
    """An adaptive scheduler with a measured 1 ms iteration and ``lengths`` already served."""
    s = PreemptiveScheduler(build_config([Setting("preemptive_serving.policy", policy, "test")])
                            .preemptive_serving, engine(keeps_kv))
    for i, n in enumerate((1, 1, 1, 1, 64, 128, 256, 512)):  # 1 ms + 10 µs per token
        s.step(EngineStep("e", 1, 0, n, float(i), i + 0.001 + 1e-5 * n, num_free_kv_blocks=900))
    for i, (n, cap) in enumerate(zip(lengths, caps if caps is not None else [1000] * len(lengths))):
        s.finish(view(f"done{i}", out=int(n), cap=int(cap)))
    return s


def newcomer_preempts(s: PreemptiveScheduler, running: RequestView, new: RequestView) -> bool:
    s.arrive(running, now=0.0)
    s.arrive(new, now=1.0)
    return s.decide([new], [running], now=1.0).preempt == (running.request_id,)


def test_adaptive_preempts_on_a_heavy_tail_and_never_on_near_uniform_lengths():
    assert newcomer_preempts(adaptive(HEAVY), view("old", out=150), view("new"))
    assert not newcomer_preempts(adaptive(UNIFORM), view("old", out=50), view("new"))
    # FastServe's own policy preempts the same near-uniform request once it has used its quanta.
    fastserve = adaptive(UNIFORM, policy="skip_join_mlfq")
    fastserve.arrive(view("old", out=50), now=0.0)
    fastserve.step(EngineStep("e", 1, 0, 1, 0.0, 0.003, scheduled=("old",)))
    fastserve.arrive(view("new"), now=1.0)
    assert fastserve.decide([view("new")], [view("old", out=50)], now=1.0).preempt == ("old",)


def test_caps_are_lengths_serve_the_shortest_remaining_first():
    s = adaptive(HEAVY, caps=HEAVY)
    assert newcomer_preempts(s, view("long", out=10, cap=400), view("short", cap=8))
    s = adaptive(HEAVY, caps=HEAVY)
    assert not newcomer_preempts(s, view("nearly", out=390, cap=400), view("short2", cap=40))


def test_warming_up_is_first_come_first_served(caplog):
    s = adaptive([])
    assert not newcomer_preempts(s, view("old", out=150), view("new"))
    with caplog.at_level(logging.INFO, logger="rlweave.preemptive_serving"):
        for i, n in enumerate(HEAVY[:40]):
            s.finish(view(f"f{i}", out=int(n)))
    assert "believes lengths are heavy-tailed" in caplog.text


def test_a_request_that_would_finish_before_its_recompute_is_not_preempted():
    # Recompute of 520 computed tokens (~6 ms) > 2 tokens left (2 ms): spared, unless its KV stays.
    for keeps_kv, preempted in ((False, False), (True, True)):
        s = adaptive(HEAVY, caps=HEAVY, keeps_kv=keeps_kv)
        assert newcomer_preempts(s, view("done-soon", out=20, cap=22, prompt=500), view("tiny", cap=1)) is preempted


def test_a_decision_is_reused_until_a_rank_or_the_running_set_changes():
    s = adaptive(UNIFORM)
    waiting = [view(f"w{i}") for i in range(64)]
    for w in waiting:
        s.arrive(w, now=0.0)
    first = s.decide(waiting, [view("r", out=5)], now=0.1)
    assert len(first.waiting_order) == 1  # one slot: only the request it admits is listed
    assert s.decide(waiting, [view("r", out=6)], now=0.1) is first
    s.arrive(view("late"), now=0.2)
    assert s.decide(waiting, [view("r", out=7)], now=0.2) is not first


def test_running_requests_get_the_level_a_full_relevel_gives_them():
    # Levels of decoding requests are looked up by (output length, max_tokens); requests that
    # pass through the same lengths, prefills, promotions and refits of the length model in
    # between must leave every running request where a full relevel would put it.
    rng = np.random.default_rng(1)
    s = adaptive(HEAVY)
    slots = []  # [request id, output length, max_tokens] of each running request
    for it in range(600):
        now = 0.05 * it
        if it == 300:  # a burst of short requests elsewhere in the batch: the model moves
            for i in range(128):
                s.finish(view(f"short{i}", out=2))
        for slot in list(slots):
            rid, out, cap = slot
            if out >= cap or rng.random() < 0.02:  # it finishes: a new request takes the slot
                s.finish(view(rid, out=out, cap=cap))
                slots.remove(slot)
        while len(slots) < 4:
            slot = [f"n{it}-{len(slots)}", 0, int(rng.choice([40, 400, 1000]))]
            s.arrive(view(slot[0], cap=slot[2]), now=now)
            slots.append(slot)
        views = [RequestView(rid, 0.0, 64, out, cap, num_computed_tokens=63 + out if out else 0)
                 for rid, out, cap in slots]  # a new one still has its prompt to prefill
        s.decide([], views, now=now)
        for v in views:
            job = s.mlfq.jobs[v.request_id]
            assert job.promoted or job.level == s.mlfq.join_level(s._work_s(v))
        for slot in slots:
            slot[1] += 1
        # The first slot goes unserved for 5 s of every 10 (promoted, then demoted when served).
        served = tuple(rid for i, (rid, _, _) in enumerate(slots) if i or it % 200 < 100)
        s.step(EngineStep("e", 4, 0, len(served), now, now + 0.002, scheduled=served))
    assert s.lengths.fits > 3 and s.mlfq.promotions > 0


def test_preemptive_serving_composes_with_agentic_rollouts_priority_policy(monkeypatch):
    # agentic_rollout needs vLLM's priority policy; preemptive serving orders within it and
    # declares no requirement of its own, so the settings agentic_rollout asks for suffice.
    from rlweave.host import activate
    from rlweave.adapters.verl_needs import verl_requirements
    from rlweave.requirements import gathered

    for plugin in ("AGENTIC_ROLLOUT", "PREEMPTIVE_SERVING"):
        monkeypatch.setenv(f"RLWEAVE__{plugin}__ENABLE", "true")
    host = activate(export_env=False)
    requirements = verl_requirements(gathered(host.hook.rlweave_needs()))
    assert {r.plugin for r in requirements} == {"agentic_rollout"}
    settings = {r.key: r.allowed[0] for r in requirements}
    assert settings["actor_rollout_ref.rollout.scheduling_policy"] == "priority"
    assert problems(requirements, settings, "the command line") == []
    # ... and explicit priority still ranks before any level.
    s = adaptive(HEAVY, caps=HEAVY)
    s.arrive(view("urgent-long", cap=400, priority=-5), now=0.0)
    s.arrive(view("short", cap=4), now=0.0)
    assert s.decide([view("short", cap=4), view("urgent-long", cap=400, priority=-5)], [],
                    now=0.0).waiting_order == ("urgent-long",)


def test_a_request_promoted_for_starvation_takes_the_next_slot_instead_of_preempting_a_shorter_one():
    # Near-uniform lengths that end at their caps: the newcomer has starved past starvation_s,
    # so it ranks first, but the running request finishes before it would: no preemption.
    s = adaptive(UNIFORM, caps=UNIFORM, keeps_kv=True)
    running, starved = view("running", out=40, cap=96), view("starved", cap=96)
    s.arrive(running, now=0.0)
    s.arrive(starved, now=0.0)
    decision = s.decide([starved], [running], now=10.0)
    assert s.mlfq.jobs["starved"].promoted and decision.preempt == ()
    assert decision.waiting_order == ("starved",)
    # Not even a running request with far more left: starvation reorders the queue only...
    s = adaptive(UNIFORM, caps=UNIFORM, keeps_kv=True)
    s.arrive(view("long", out=10, cap=400), now=0.0)
    s.arrive(starved, now=0.0)
    s.step(EngineStep("e", 1, 1, 1, 9.899, 9.9, scheduled=("long",), num_free_kv_blocks=900))
    assert s.decide([starved], [view("long", out=10, cap=400)], now=10.0).preempt == ()
    # ...while the same newcomer, unstarved, preempts it (shortest remaining first).
    s = adaptive(UNIFORM, caps=UNIFORM, keeps_kv=True)
    assert newcomer_preempts(s, view("long", out=10, cap=400), view("new", cap=96))


def test_a_newcomer_preempts_only_a_request_with_more_work_than_its_own_plus_the_recompute():
    s = adaptive(HEAVY, caps=HEAVY, keeps_kv=True)
    s.arrive(view("long", out=10, cap=400), now=0.0)
    s.arrive(view("new", cap=96), now=1.0)
    assert not s._keep_running("long", "new") and s._keep_running("new", "long")
