"""verl's own synchronous replay buffer, polling TransferQueue every 50 ms instead of 2 s.

An ablation for ``rlweave bench stream``: rlweave's stream mode polls every 50 ms too, so this
run separates what faster polling alone gives verl's synchronous loop from what streaming adds.
Plugged in through verl's ``trainer.v1.sampler.custom_sampler.{path,name}``.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from rlweave.benchmarks.stream import FAST_POLL_S as POLL_S


class FastPollReplayBuffer(ReplayBuffer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, poll_interval=POLL_S, **kwargs)
