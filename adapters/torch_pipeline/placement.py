"""Which rank holds which stage, and the dependency check an order must pass before it runs.

An order is, per rank, a list of ``(model, micro_batch, stage, phase)`` entries: the ``schedule``
field of ``rlweave fusion schedule --json``. Actor stage ``s`` is on rank ``s``; critic replica
``i`` (micro-batches ``i*critic_mb .. (i+1)*critic_mb - 1``) has its stage ``s`` on rank
``(i+1)*critic_pp - 1 - s``. The check replays the orders without timing: a rank may run an
entry once the entry its micro-batch needs first has run (the previous stage's forward, the
next stage's backward, or its own forward at the last stage). If every rank ends up blocked,
the order would deadlock the point-to-point exchange, so it is refused with the entry and the
one it waits for (or, plainer, the entry ordered before one it needs on its own rank).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

Entry = tuple[str, int, int, str]  # (model, micro_batch, stage, "F" | "B")


class ScheduleRefused(ValueError):
    """An order the executor will not start; the message names the entry and why."""


@dataclass(frozen=True)
class Placement:
    actor_pp: int
    critic_pp: int
    actor_mb: int
    critic_mb: int  # per critic replica

    @property
    def world(self) -> int:
        return self.actor_pp

    def stages(self, model: str) -> int:
        return self.actor_pp if model == "actor" else self.critic_pp

    def rank(self, model: str, micro_batch: int, stage: int) -> int:
        if model == "actor":
            return stage
        return (micro_batch // self.critic_mb + 1) * self.critic_pp - 1 - stage

    def entries(self, rank: int) -> Counter[Entry]:
        """Every entry ``rank`` must run exactly once."""
        replica = rank // self.critic_pp
        critic_stage = self.critic_pp - 1 - rank % self.critic_pp
        want: Counter[Entry] = Counter()
        for phase in ("F", "B"):
            want.update(("actor", b, rank, phase) for b in range(self.actor_mb))
            want.update(("critic", b, critic_stage, phase)
                        for b in range(replica * self.critic_mb, (replica + 1) * self.critic_mb))
        return want

    def needs(self, entry: Entry) -> Entry | None:
        model, b, s, phase = entry
        if phase == "F":
            return (model, b, s - 1, "F") if s > 0 else None
        return (model, b, s, "F") if s == self.stages(model) - 1 else (model, b, s + 1, "B")


def check_orders(placement: Placement, orders: Sequence[Sequence[Sequence[object]]]) -> list[list[Entry]]:
    """The orders as entry tuples if every rank can run its own to the end; otherwise
    :class:`ScheduleRefused` before anything runs."""
    if len(orders) != placement.world:
        raise ScheduleRefused(f"the schedule has {len(orders)} rank orders; this pipeline has "
                              f"{placement.world} ranks.")
    parsed = []
    for rank, order in enumerate(orders):
        try:
            entries = [(str(m), int(b), int(s), str(p)) for m, b, s, p in order]
        except (TypeError, ValueError):
            raise ScheduleRefused(f"rank {rank}'s order is not a list of [model, micro_batch, "
                                  "stage, 'F'|'B'] entries.") from None
        if Counter(entries) != placement.entries(rank):
            raise ScheduleRefused(f"rank {rank}'s order does not hold exactly the stage tasks that "
                                  "rank runs (each once); build it for this pipeline's sizes.")
        parsed.append(entries)
        _refuse_inversion(placement, rank, entries)
    done: set[Entry] = set()
    position = [0] * placement.world
    moved = True
    while moved:
        moved = False
        for rank, entries in enumerate(parsed):
            while position[rank] < len(entries):
                need = placement.needs(entries[position[rank]])
                if need is not None and need not in done:
                    break
                done.add(entries[position[rank]])
                position[rank] += 1
                moved = True
    for rank, entries in enumerate(parsed):
        if position[rank] < len(entries):
            entry = entries[position[rank]]
            need = placement.needs(entry)
            raise ScheduleRefused(
                f"refusing the schedule: rank {rank} would run {entry} (position {position[rank]}) "
                f"before {need} on rank {placement.rank(need[0], need[1], need[2])} can ever run; "
                "the order violates a dependency and would deadlock.")  # type: ignore[index]
    return parsed


def _refuse_inversion(placement: Placement, rank: int, entries: list[Entry]) -> None:
    """The plainest violation: an entry ordered before the entry it needs on the same rank."""
    position = {entry: i for i, entry in enumerate(entries)}
    for i, entry in enumerate(entries):
        need = placement.needs(entry)
        if need is not None and position.get(need, -1) > i:
            raise ScheduleRefused(f"refusing the schedule: rank {rank} orders {entry} (position {i}) "
                                  f"before {need} (position {position[need]}), which it needs.")
