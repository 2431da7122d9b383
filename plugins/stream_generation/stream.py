"""StreamRL's sample stream: finished samples flow from generation producers to the trainer.

One :class:`SampleStream` sits between the Stream Generation Service (engine instances, the
*producers*) and the trainer (the *consumer*). It is the work queue of the producers and the
output queue of the trainer at once, because its guarantees span both sides:

- **Groups.** A GRPO group (``group_size`` samples of one prompt) is submitted, generated and
  delivered as a unit: the trainer only ever takes complete groups, so group advantages are
  computed over the whole group. Sample ids are ``"<group_id>/<index>"``.
- **Bounded.** At most ``max_groups`` groups are open (submitted, not yet delivered);
  :meth:`SampleStream.submit` blocks beyond that. The bound is on whole groups, reserved at
  submission, not on buffered samples: a sample bound could fill up with incomplete groups that
  the consumer may not take, and the stream would deadlock.
- **Weight versions.** The stream's ``version`` counts weight publications to the engines
  (:meth:`SampleStream.advance_version`), not optimizer steps: within a version the rollout
  weights do not change. A sample's staleness is ``version - sample.weight_version`` when it is
  delivered. *On-policy* mode allows staleness 0, *async* mode at most ``max_staleness`` (k).
- **Stale samples are dropped and regenerated, never held.** A sample too old for the bound
  (on arrival, or after a version advance while it waited) is discarded and its sample id is
  queued again, ahead of new work, for generation with the current weights. Holding it cannot help: versions only
  grow, so an on-policy sample that is stale now is stale forever, and training on it would
  break on-policy semantics. Regenerating keeps the prompt in its step (no prompt is skipped,
  so the data order stays that of the dataloader), at the cost of generation work.
- **Exactly once.** A sample id is accepted once: a second sample with the same id (a producer
  declared dead that still reports, or a re-issued request racing the original) is dropped.
  When a producer dies (:meth:`SampleStream.producer_lost`), the sample ids it held and had not
  finished are queued again, ahead of new work; the finished samples of its groups are kept.
- **Deterministic.** The stream has no randomness and no timing-dependent policy of its own:
  the same sequence of calls gives the same deliveries, and the groups of a mini-batch are
  listed in submission order. Sample content is reproducible when engines seed each request
  with :func:`sample_seed`, which depends on the sample id only, not on the producer or attempt.

Thread-safe: one lock and one condition variable guard all state; producers and the trainer
call from their own threads.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlweave.types import SampleRecord


class StreamMode(str, Enum):
    ON_POLICY = "on_policy"
    ASYNC = "async"


class StreamClosed(RuntimeError):
    """The stream was closed while a caller waited on it."""


def sample_id(group_id: str, index: int) -> str:
    return f"{group_id}/{index}"


def sample_seed(seed: int, sid: str) -> int:
    """Per-request sampling seed that depends only on the run's seed and the sample id (CRC32,
    not Python's salted ``hash``), so a regenerated sample draws the same random numbers."""
    return zlib.crc32(f"{seed}:{sid}".encode())


@dataclass(frozen=True)
class GenerationTicket:
    """Work handed to one producer: the sample ids of one group it must generate now.
    ``weight_version`` is the stream's version at claim time (what the engine should hold)."""

    group_id: str
    sample_ids: tuple[str, ...]
    weight_version: int


@dataclass(frozen=True)
class StreamedSample:
    record: SampleRecord
    payload: Any = None  # what the adapter carries along (e.g. a TransferQueue key)


@dataclass(frozen=True)
class MiniBatch:
    """Complete groups for one dynamic mini-batch. ``groups[i]`` holds ``group_size`` samples in
    index order; ``staleness[i]`` is the largest staleness among group ``i``'s samples."""

    version: int
    groups: tuple[tuple[StreamedSample, ...], ...]
    staleness: tuple[int, ...]

    @property
    def samples(self) -> list[StreamedSample]:
        return [s for g in self.groups for s in g]


@dataclass
class StreamStats:
    """Counters for the benchmark and the tests. ``staleness`` counts delivered samples per
    staleness value (the histogram the benchmark plots)."""

    delivered: int = 0
    duplicates: int = 0  # samples dropped because their id was already accepted
    stale_dropped: int = 0  # samples dropped (on arrival or later) for exceeding the bound
    requeued_lost: int = 0  # sample ids re-queued because their producer died
    staleness: Counter[int] = field(default_factory=Counter)


@dataclass
class _Group:
    seq: int  # submission order
    size: int
    received: dict[int, StreamedSample] = field(default_factory=dict)
    queued: set[int] = field(default_factory=set)  # waiting for a producer to claim them
    claimed: dict[int, str] = field(default_factory=dict)  # index -> producer

    @property
    def complete(self) -> bool:
        return len(self.received) == self.size


class SampleStream:
    """``group_size``: samples per GRPO group. ``max_groups``: open groups at most.
    ``max_staleness``: k, used in async mode (on-policy mode is k = 0)."""

    def __init__(self, group_size: int, max_groups: int, mode: StreamMode = StreamMode.ON_POLICY,
                 max_staleness: int = 1, version: int = 0) -> None:
        if group_size < 1 or max_groups < 1:
            raise ValueError(f"group_size ({group_size}) and max_groups ({max_groups}) must be >= 1")
        if mode is StreamMode.ASYNC and max_staleness < 1:
            raise ValueError(f"async mode needs max_staleness >= 1 (got {max_staleness}); "
                             f"staleness 0 is on-policy mode")
        self.group_size = group_size
        self.max_groups = max_groups
        self.mode = mode
        self.max_staleness = 0 if mode is StreamMode.ON_POLICY else max_staleness
        self.stats = StreamStats()
        self._version = version
        self._groups: dict[str, _Group] = {}
        self._work: deque[str] = deque()  # group ids with queued samples, claim order
        self._delivered: set[str] = set()  # group ids handed to the trainer
        self._seq = 0
        self._closed = False
        self._cond = threading.Condition()

    # -- both sides ------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    @property
    def open_groups(self) -> int:
        with self._cond:
            return len(self._groups)

    def close(self) -> None:
        """Wake every waiter with :class:`StreamClosed` (shutdown, or a failed run)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- generation side -------------------------------------------------------------------------

    def submit(self, group_id: str, timeout: float | None = None) -> None:
        """Open a group and queue its samples for generation; blocks while ``max_groups`` are
        open. Raises ``TimeoutError`` after ``timeout`` seconds, ``ValueError`` for a group id
        that is open or was delivered."""
        with self._cond:
            self._check_new(group_id)
            self._wait(lambda: len(self._groups) < self.max_groups, timeout, "submit")
            self._check_new(group_id)  # again: another thread may have submitted it meanwhile
            self._groups[group_id] = _Group(self._seq, self.group_size, queued=set(range(self.group_size)))
            self._seq += 1
            self._work.append(group_id)
            self._cond.notify_all()

    def claim(self, producer: str, timeout: float | None = None) -> GenerationTicket:
        """Hand ``producer`` the queued samples of the first group in the work queue. Blocks
        until there is work; raises ``TimeoutError`` after ``timeout`` seconds."""
        with self._cond:
            self._wait(lambda: bool(self._work), timeout, "claim")
            group_id = self._work.popleft()
            group = self._groups[group_id]
            indices = sorted(group.queued)
            group.queued.clear()
            group.claimed.update(dict.fromkeys(indices, producer))
            return GenerationTicket(group_id, tuple(sample_id(group_id, i) for i in indices), self._version)

    def put(self, producer: str, record: SampleRecord, payload: Any = None) -> bool:
        """A producer finished one sample. Returns whether it was accepted; a duplicate id or a
        sample older than the staleness bound is dropped (the latter is regenerated)."""
        group_id, _, index_text = record.sample_id.rpartition("/")
        with self._cond:
            if group_id in self._delivered:
                self.stats.duplicates += 1
                return False
            group = self._groups.get(group_id)
            index = int(index_text) if index_text.isdigit() else -1
            if group is None or group_id != record.group_id or not 0 <= index < group.size:
                raise ValueError(f"sample {record.sample_id!r} (group {record.group_id!r}) belongs to no "
                                 f"open group; sample ids are '<group_id>/<index>' from a ticket")
            if record.weight_version > self._version:
                raise ValueError(f"sample {record.sample_id!r} has weight version {record.weight_version}, "
                                 f"newer than the stream's {self._version}: call advance_version() when "
                                 f"weights are published, before the engines generate with them")
            if index in group.received:
                self.stats.duplicates += 1
                return False
            holder = group.claimed.get(index)
            if self._version - record.weight_version > self.max_staleness:
                self.stats.stale_dropped += 1
                if holder == producer:  # nobody else is generating it: queue it again
                    del group.claimed[index]
                    self._requeue(group_id, group, [index])
                return False
            # Accepted; a re-issued copy of this id, queued or claimed elsewhere, is now moot.
            group.claimed.pop(index, None)
            group.queued.discard(index)
            if not group.queued and group_id in self._work:
                self._work.remove(group_id)
            group.received[index] = StreamedSample(record, payload)
            self._cond.notify_all()
            return True

    def producer_lost(self, producer: str) -> list[str]:
        """``producer`` died: queue the sample ids it held again, ahead of new work (they are
        the oldest). Its finished samples stay. Returns the sample ids re-queued."""
        requeued = []
        with self._cond:
            for group_id, group in sorted(self._groups.items(), key=lambda kv: -kv[1].seq):
                lost = sorted(i for i, p in group.claimed.items() if p == producer)
                if lost:
                    for i in lost:
                        del group.claimed[i]
                    self._requeue(group_id, group, lost)
                    requeued = [sample_id(group_id, i) for i in lost] + requeued
            self.stats.requeued_lost += len(requeued)
            self._cond.notify_all()
        return requeued

    # -- trainer side ----------------------------------------------------------------------------

    def take(self, max_groups: int, min_groups: int = 1, timeout: float | None = None) -> MiniBatch:
        """A dynamic mini-batch: as soon as ``min_groups`` complete groups are ready (or every
        open group is, when fewer are open), up to ``max_groups`` of them, oldest-submitted
        first. Raises ``TimeoutError`` after ``timeout`` seconds with nothing to take."""
        if not 1 <= min_groups <= max_groups:
            raise ValueError(f"need 1 <= min_groups ({min_groups}) <= max_groups ({max_groups})")
        with self._cond:
            def ready() -> bool:
                n = sum(g.complete for g in self._groups.values())
                return n > 0 and n >= min(min_groups, len(self._groups))

            self._wait(ready, timeout, "take")
            done = sorted((g.seq, gid) for gid, g in self._groups.items() if g.complete)[:max_groups]
            groups, staleness = [], []
            for _, group_id in done:
                group = self._groups.pop(group_id)
                samples = tuple(group.received[i] for i in range(group.size))
                ages = [self._version - s.record.weight_version for s in samples]
                groups.append(samples)
                staleness.append(max(ages))
                self._delivered.add(group_id)
                self.stats.delivered += len(samples)
                self.stats.staleness.update(ages)
            self._cond.notify_all()
            return MiniBatch(self._version, tuple(groups), tuple(staleness))

    def advance_version(self) -> int:
        """New weights were published to the engines. Samples that now exceed the staleness
        bound are dropped and queued for regeneration. Returns the new version."""
        with self._cond:
            self._version += 1
            for group_id, group in sorted(self._groups.items(), key=lambda kv: -kv[1].seq):
                stale = [i for i, s in sorted(group.received.items())
                         if self._version - s.record.weight_version > self.max_staleness]
                for i in stale:
                    del group.received[i]
                self.stats.stale_dropped += len(stale)
                self._requeue(group_id, group, stale)
            self._cond.notify_all()
            return self._version

    # -- internals -------------------------------------------------------------------------------

    def _check_new(self, group_id: str) -> None:
        if group_id in self._groups or group_id in self._delivered:
            raise ValueError(f"group {group_id!r} was already submitted; group ids must be unique per "
                             f"run (verl's prompt uid is)")

    def _requeue(self, group_id: str, group: _Group, indices: Sequence[int]) -> None:
        """Queue ``indices`` of ``group`` for generation again, ahead of new work: the group is
        older than anything not yet claimed, and starting it first keeps its wait (and, in
        async mode, its staleness) short. Invariant: a group id is in the work queue exactly
        when it has queued samples."""
        if not indices:
            return
        if not group.queued:
            self._work.appendleft(group_id)
        group.queued.update(indices)
        self._cond.notify_all()

    def _wait(self, predicate: Any, timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            if self._closed:
                raise StreamClosed(f"the sample stream was closed during {what}")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"sample stream: {what} timed out after {timeout} s")
            self._cond.wait(remaining)


def groups_to_take(ready_due: int, ready_other: int, pending_due: int, minibatch: int, most: int) -> int:
    """How many ready groups a dynamic batch takes now (a whole number of mini-batches; 0: wait).

    A group is *due* when this step is the last whose staleness bound it meets: if the step
    fills up without it, it is dropped and generated again, and the tail groups, which finish
    last, are the ones that would be. So the step keeps enough of its ``most`` remaining
    groups, in whole mini-batches, for every due group (ready or still generating), and gives
    newer ready groups only what is left; the due ones go first.
    """
    if min(ready_due, ready_other, pending_due, most) < 0 or minibatch < 1:
        raise ValueError(f"bad counts: ready_due={ready_due}, ready_other={ready_other}, "
                         f"pending_due={pending_due}, minibatch={minibatch}, most={most}")
    due = ready_due + pending_due
    reserved = -(-due // minibatch) * minibatch
    takeable = min(ready_due, most) + min(ready_other, max(most - reserved, 0))
    return takeable // minibatch * minibatch
