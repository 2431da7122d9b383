"""vLLM's workers read each engine step from a shared-memory queue, and after a read they keep
spinning on it (``sched_yield``) for one second before they block on its ZMQ notification
(``SpinCondition.busy_loop_s``). On a GPU node that spin costs a spare host core. On verl's CPU
platform the engine's cores are the machine's only cores: an idle engine then spins through the
whole time the trainer trains, which was half of the engine's CPU in `bench stream`'s verl sync
run (3.0 CPU-seconds a step for 1.5 s of decoding), and the host processes that the spin displaces
crowd onto the trainer's core. Here a reader spins for ``IDLE_SPIN_S`` only: longer than the gap
between two decode steps, so generation still never blocks, and short enough that an idle
engine sleeps."""

from __future__ import annotations

from rlweave.patches import Revert

IDLE_SPIN_S = 0.02  # vLLM's default is 1 s


def apply() -> Revert:
    from vllm.distributed.device_communicators import shm_broadcast

    original = shm_broadcast.SpinCondition.__init__

    def __init__(self, is_reader, context, notify_address, busy_loop_s=1.0):  # type: ignore[no-untyped-def]
        original(self, is_reader, context, notify_address, busy_loop_s=min(busy_loop_s, IDLE_SPIN_S))

    shm_broadcast.SpinCondition.__init__ = __init__

    def revert() -> None:
        shm_broadcast.SpinCondition.__init__ = original

    return revert
