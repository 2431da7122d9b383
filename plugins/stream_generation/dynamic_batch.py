"""The size of a streaming trainer's dynamic batch (StreamRL's dynamic-batch pipelining).

Whenever the trainer is free it takes every complete GRPO group that is ready, in whole PPO
mini-batches. Async, one rule on top: a group whose staleness bound this step is the last to
meet (*due*) is dropped and generated again if the step fills up without it, and the tail
groups, which finish last, are the ones that would be. So the step keeps room for them.
"""

from __future__ import annotations

from rlweave.types import DynamicBatchRequest


def groups_to_take(request: DynamicBatchRequest) -> int:
    """How many ready groups a dynamic batch takes now (a whole number of mini-batches; 0: wait).

    The step keeps enough of its ``most`` remaining groups, in whole mini-batches, for every
    due group (ready or still generating), and gives newer ready groups only what is left; the
    due ones go first.
    """
    r = request
    if min(r.ready_due, r.ready_other, r.pending_due, r.most) < 0 or r.minibatch < 1:
        raise ValueError(f"bad dynamic batch request {r}: counts must be >= 0 and minibatch >= 1")
    due = r.ready_due + r.pending_due
    reserved = -(-due // r.minibatch) * r.minibatch
    takeable = min(r.ready_due, r.most) + min(r.ready_other, max(r.most - reserved, 0))
    return takeable // r.minibatch * r.minibatch
