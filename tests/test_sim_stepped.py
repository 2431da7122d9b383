"""The simulator iteration by iteration (:mod:`rlweave.sim.stepped`): the listener's wall time
prices each iteration, it hears every finish, and a move hands one engine's requests to another
with the re-prefill stall there."""

from __future__ import annotations

import pytest

from rlweave.sim import EngineModel, Request
from rlweave.sim.stepped import SteppedSimulator

SECOND = EngineModel(base_s=1.0, prefill_s_per_token=1.0)  # one token a second, a prefilled token a second


class Recorder:
    """Moves engine 0's requests onto engine 1 at engine 0's boundary at ``move_at``; engine 1's
    iterations take ``slow`` times as long."""

    def __init__(self, move_at: float | None = None, slow: float = 1.0) -> None:
        self.move_at, self.slow, self.finished_at = move_at, slow, {}

    def iteration_ended(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        pass

    def finished(self, sim: SteppedSimulator, request: int, now: float) -> None:
        self.finished_at[request] = now

    def boundary(self, sim: SteppedSimulator, engine: int, now: float) -> None:
        if engine == 0 and now == self.move_at:
            sim.move([0], [1], now)

    def wall_s(self, sim: SteppedSimulator, engine: int, iteration_s: float) -> float:
        return iteration_s * (self.slow if engine == 1 else 1.0)


def run(listener: Recorder) -> SteppedSimulator:
    sim = SteppedSimulator([SECOND, SECOND], listener, slots=[2, 2], prompts_prefilled=True)
    sim.submit([Request(0, 0.0, 3, prompt_tokens=2), Request(1, 0.0, 5, prompt_tokens=2)])  # one on each engine
    return sim.run()


def test_each_iteration_costs_what_the_listener_says_and_every_finish_is_heard() -> None:
    listener = Recorder(slow=2.0)
    sim = run(listener)
    assert listener.finished_at == sim.finish_s == {0: 3.0, 1: 10.0}  # no prefill: the prompts are in
    assert list(sim.busy_s()) == pytest.approx([3.0, 10.0])


def test_a_move_joins_the_destinations_batch_after_its_re_prefill() -> None:
    # At 1 s request 0 has made 1 of 3 tokens: engine 1 re-prefills its 2 prompt and 1 generated
    # tokens (3 s), so its iteration in flight ends at 4 s, request 0 in it; request 0 ends at 5 s.
    sim = run(Recorder(move_at=1.0))
    assert sim.finish_s == {0: 5.0, 1: 8.0}
    assert sim.running(0) == 0 and list(sim.busy_s()) == pytest.approx([1.0, 8.0])
