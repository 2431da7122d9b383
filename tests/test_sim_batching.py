"""The shared continuous-batching simulator: its jumps over iterations equal stepping every
iteration, its policies swap (FCFS, the SRPT oracle, recompute), groups are claimed whole, a
pause stops the engines, and its log accounts for every token and busy second."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from rlweave.sim import (
    ArrivalOrder,
    EngineModel,
    KeepRunning,
    PullGroups,
    Request,
    ShortestRemaining,
    ShortestRemainingPreempts,
    Simulator,
)

MODEL = EngineModel(base_s=1.0, per_seq_s=0.25, slots=3, prefill_s_per_token=0.01)


def step_every_iteration(requests: list[Request], model: EngineModel, srpt: bool) -> list[float]:
    """One engine stepped an iteration at a time: arrivals join at the next boundary; SRPT
    re-chooses the running set every iteration (KV kept)."""
    left = {r.id: r.output_tokens for r in requests}
    pending = sorted(requests, key=lambda r: r.arrival_s)
    waiting: list[tuple] = []
    running: list[int] = []
    started: set[int] = set()
    finish, now = {}, 0.0
    while pending or waiting or running:
        if not waiting and not running:
            now = max(now, pending[0].arrival_s)
        while pending and pending[0].arrival_s <= now:
            r = pending.pop(0)
            heapq.heappush(waiting, ((left[r.id], r.id) if srpt else (r.id,), r.id))
        if srpt:
            for i in running:
                heapq.heappush(waiting, ((left[i], i), i))
            running = []
        while waiting and len(running) < model.slots:
            running.append(heapq.heappop(waiting)[1])
        new = [i for i in running if i not in started]
        started.update(new)
        now += model.iteration_s(len(running), sum(requests[i].prompt_tokens for i in new))
        for i in running:
            left[i] -= 1
            if left[i] == 0:
                finish[i] = now
        running = [i for i in running if left[i]]
    return [finish[i] for i in range(len(requests))]


def random_requests(seed: int, n: int = 25) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.5, n)) * (rng.random(n) < 0.8)  # some arrive together at 0
    arrival = np.sort(arrival)
    return [Request(i, float(a), int(o), int(p)) for i, (a, o, p) in
            enumerate(zip(arrival, rng.integers(1, 15, n), rng.integers(0, 40, n)))]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("srpt", [False, True])
def test_jumping_over_iterations_equals_stepping_every_iteration(seed: int, srpt: bool) -> None:
    requests = random_requests(seed)
    order, preemption = (ShortestRemaining(), ShortestRemainingPreempts()) if srpt else (ArrivalOrder(), KeepRunning())
    sim = Simulator([MODEL], order, preemption)
    sim.submit(requests)
    assert sim.run().finish_array() == pytest.approx(step_every_iteration(requests, MODEL, srpt))
    # the log accounts for every output token and every busy second
    assert sum(it.decoding * it.iterations for it in sim.log) == sum(r.output_tokens for r in requests)
    assert sum(it.end_s - it.start_s for it in sim.log) == pytest.approx(sim.busy_s()[0])


def test_the_oracle_preempts_for_the_shortest_and_recompute_pays_the_prefill_again() -> None:
    one = EngineModel(base_s=1.0, slots=1, prefill_s_per_token=0.1)
    requests = [Request(0, 0.0, 10, 5), Request(1, 0.5, 1, 5)]

    def finish(preemption) -> list[float]:
        sim = Simulator([one], ShortestRemaining(), preemption)
        sim.submit(requests)
        return sim.run().finish_array().tolist()

    # at 1.5 s (the boundary after its arrival) the short one preempts: 1.5 + its 1.5 s iteration
    assert finish(ShortestRemainingPreempts()) == pytest.approx([12.0, 3.0])
    # recompute: the long one re-prefills its 5 prompt and 1 generated tokens when it resumes
    assert finish(ShortestRemainingPreempts(recompute=True)) == pytest.approx([12.6, 3.0])
    assert finish(KeepRunning()) == pytest.approx([10.5, 12.0])


def test_engines_claim_whole_groups_from_one_queue_in_turn() -> None:
    model = EngineModel(base_s=1.0, slots=2)
    requests = [Request(g * 2 + j, 0.0, n, group=g) for g, n in enumerate((4, 1, 1)) for j in range(2)]
    sim = Simulator([model, model], placement=PullGroups())
    sim.submit(requests)
    # engine 0 takes group 0 (4 iterations), engine 1 group 1, then group 2 once group 1 ends
    assert sim.run().finish_array().tolist() == [4.0, 4.0, 1.0, 1.0, 2.0, 2.0]
    assert sim.busy_s().tolist() == [4.0, 2.0]


def test_a_pause_stops_every_engine_and_a_request_queued_in_it_waits_for_the_boundary() -> None:
    sim = Simulator([EngineModel(base_s=1.0, slots=4)])
    sim.submit([Request(0, 0.0, 5)])
    sim.run_until(2.5)
    sim.pause(2.5, 4.0)  # the third iteration (2-3 s) resumes after the pause: ends at 4.5
    sim.submit([Request(1, 3.0, 1)])
    sim.run_until(4.5)
    assert sim.busy_s(4.5)[0] == pytest.approx(3.0)
    assert sim.run().finish_array().tolist() == [6.5, 5.5]


def test_a_simulator_without_slot_counts_says_where_to_give_them() -> None:
    with pytest.raises(ValueError, match="slot count >= 1 for each"):
        Simulator([EngineModel(base_s=1.0)])
    sim = Simulator([EngineModel(base_s=1.0)], slots=[2])
    with pytest.raises(ValueError, match="output_tokens > 0"):
        sim.submit([Request(0, 0.0, 0)])


def test_a_request_arriving_at_a_boundary_joins_the_iteration_that_starts_there() -> None:
    sim = Simulator([EngineModel(base_s=1.0, slots=2)])
    sim.submit([Request(0, 0.0, 1), Request(1, 0.0, 3), Request(2, 1.0, 1)])  # 0 ends as 2 arrives
    assert sim.run().finish_array().tolist() == [1.0, 3.0, 2.0]


def test_a_fluid_engine_starts_a_request_at_once_and_keeps_fractions_of_a_token() -> None:
    model = EngineModel(base_s=1.0, per_seq_s=1.0, slots=2)  # 2 s an iteration alone, 3 s for two
    requests = [Request(0, 0.0, 3), Request(1, 0.5, 1)]
    finish = {}
    for fluid in (False, True):
        sim = Simulator([model], fluid=fluid)
        sim.submit(requests)
        finish[fluid] = sim.run().finish_array().tolist()
    # fluid: 1 joins at 0.5 (0 has made a quarter token) and ends 3 s later; 0 ends at 3.5 + 1.75 x 2
    assert finish == {False: [7.0, 5.0], True: [7.0, 3.5]}
    sim = Simulator([EngineModel(base_s=1.0, slots=1)], fluid=True)
    sim.submit([Request(0, 0.0, 2.5)])
    sim.run_until(0.5)
    sim.pause(0.5, 2.0)  # half a token made; the other two wait for the pause to end
    assert sim.run().finish_array().tolist() == [4.0]
    with pytest.raises(ValueError, match="whole tokens unless the simulator is fluid"):
        Simulator([EngineModel(base_s=1.0, slots=1)]).submit([Request(0, 0.0, 2.5)])


def test_recompute_re_prefills_only_the_requests_that_lost_their_slot() -> None:
    """Two requests in two slots: when the short one ends, the long one keeps its slot and its
    KV, so it pays no prefill again (every kept request re-prefilled at each boundary before)."""
    two = EngineModel(base_s=1.0, slots=2, prefill_s_per_token=0.1)
    requests = [Request(0, 0.0, 6, 4), Request(1, 0.0, 2, 4)]
    finishes = {}
    for preemption in (ShortestRemainingPreempts(), ShortestRemainingPreempts(recompute=True)):
        sim = Simulator([two], ShortestRemaining(), preemption)
        sim.submit(requests)
        finishes[preemption.recompute] = sim.run().finish_array().tolist()
        assert sum(it.prefill_tokens for it in sim.log) == 8  # each prompt once
    assert finishes[True] == finishes[False]


def test_an_eager_engine_chooses_at_each_request_it_is_given() -> None:
    """Two requests at one instant on one slot: the engine chooses once after both (the short
    one first) or, eager, at each, so the first given holds the slot (an agent loop's order)."""
    requests = [Request(0, 0.0, 10), Request(1, 0.0, 2)]
    finish = {}
    for eager in (False, True):
        sim = Simulator([EngineModel(base_s=1.0, slots=1)], ShortestRemaining(), fluid=True, eager=eager)
        sim.submit(requests)
        finish[eager] = sim.run().finish_array().tolist()
    assert finish == {False: [12.0, 2.0], True: [10.0, 12.0]}
    with pytest.raises(ValueError, match="pass fluid=True with eager=True"):
        Simulator([EngineModel(base_s=1.0, slots=1)], eager=True)


class _Heard:
    """A prefill rule (100 tokens for a request that displaced another, none otherwise) and a
    listener that writes down what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, int, float]] = []

    def tokens(self, sim: Simulator, request: int, engine: int, displaced: bool) -> float:
        return 100.0 if displaced else 0.0

    def started(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        self.heard.append(("started", request, now))

    def preempted(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        self.heard.append(("preempted", request, now))

    def finished(self, sim: Simulator, request: int, engine: int, now: float) -> None:
        self.heard.append(("finished", request, now))

    def boundary(self, sim: Simulator, engine: int, now: float) -> None:
        """Not written down: one per jump."""


def test_the_prefill_rule_and_the_listener_see_each_start_preemption_and_finish() -> None:
    """A long request runs; a short one arriving at 3 s displaces it and prefills the rule's 100
    tokens (1 s), then the long one takes the freed slot back at no cost and makes its last 7."""
    heard = _Heard()
    sim = Simulator([EngineModel(base_s=1.0, slots=1, prefill_s_per_token=0.01)], ShortestRemaining(),
                    ShortestRemainingPreempts(recompute=True), prefill=heard, listener=heard)
    sim.submit([Request(0, 0.0, 10), Request(1, 3.0, 2)])
    assert sim.run().finish_array().tolist() == pytest.approx([13.0, 6.0])
    assert heard.heard == [("started", 0, 0.0), ("preempted", 0, 3.0), ("started", 1, 3.0),
                           ("finished", 1, 6.0), ("started", 0, 6.0), ("finished", 0, 13.0)]


def test_a_waiting_request_ranked_equal_to_the_running_one_does_not_displace_it() -> None:
    class Level:
        def key(self, request: Request, left: float) -> tuple:
            return (0,)

    sim = Simulator([EngineModel(base_s=1.0, slots=1)], Level(), ShortestRemainingPreempts())
    sim.submit([Request(1, 0.0, 4), Request(0, 1.0, 1)])  # the id does not break the tie either
    assert sim.run().finish_array().tolist() == [5.0, 4.0]


def test_a_rebuild_merges_engines_into_one_faster_that_resumes_after_the_switch() -> None:
    """At 4 s engine 1's request moves onto engine 0, which becomes twice as fast from 5 s: both
    make their last 6 tokens there (no prefill: the model charges none) and engine 1 idles."""
    slow, fast = EngineModel(base_s=1.0, slots=2), EngineModel(base_s=0.5, slots=2)
    sim = Simulator([slow, slow], fluid=True)
    sim.submit([Request(0, 0.0, 10), Request(1, 0.0, 10)])
    sim.run_until(4.0)
    sim.rebuild(0, [1], fast, until=5.0, now=4.0)
    assert sim.run().finish_array().tolist() == [8.0, 8.0]
    assert sim.busy_s().tolist() == [7.0, 4.0]
    with pytest.raises(ValueError, match="pass fluid=True"):
        Simulator([slow]).rebuild(0, [], fast, 1.0, 0.0)
