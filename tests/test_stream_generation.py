"""StreamRL's sample stream: group completeness, staleness bound, exactly-once delivery across
producer deaths, determinism; and the stream_generation config section."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import pytest

from rlweave.config import ConfigError, Setting, build_config
from rlweave.host import PLUGIN_MODULES_ENV, build_plugin_manager
from rlweave.plugins.stream_generation.stream import (
    MiniBatch,
    SampleStream,
    StreamClosed,
    StreamMode,
    groups_to_take,
    sample_id,
    sample_seed,
)
from rlweave.types import SampleRecord

pytestmark = pytest.mark.timeout(60)  # a stream bug shows up as a wait that never ends


def record(sid: str, version: int, response_len: int = 10) -> SampleRecord:
    return SampleRecord(sid, sid.rpartition("/")[0], 5, response_len, version)


def opened(group_size: int, groups: str, **kwargs: object) -> SampleStream:
    """A stream with one group submitted per character of ``groups``."""
    s = SampleStream(group_size, **kwargs)  # type: ignore[arg-type]
    for g in groups:
        s.submit(g)
    return s


def finish(stream: SampleStream, producer: str, version: int | None = None) -> list[bool]:
    """Claim the next ticket and put all its samples (at the ticket's version by default)."""
    ticket = stream.claim(producer, timeout=0)
    v = ticket.weight_version if version is None else version
    return [stream.put(producer, record(sid, v)) for sid in ticket.sample_ids]


def test_take_yields_only_complete_groups_in_submission_order() -> None:
    s = opened(3, "abc", max_groups=4)
    ta, tb, tc = (s.claim(p, timeout=0) for p in ("p0", "p1", "p2"))
    assert ta.sample_ids == ("a/0", "a/1", "a/2")
    for sid in tc.sample_ids + tb.sample_ids[:2] + ta.sample_ids:
        assert s.put("px", record(sid, 0))
    batch = s.take(max_groups=8)  # b is missing one sample: not taken, not split
    assert [g[0].record.group_id for g in batch.groups] == ["a", "c"]
    assert all([x.record.sample_id for x in g] == [sample_id(g[0].record.group_id, i) for i in range(3)]
               for g in batch.groups)
    with pytest.raises(TimeoutError):
        s.take(max_groups=8, timeout=0.01)
    assert s.put("p1", record("b/2", 0))
    assert [g[0].record.group_id for g in s.take(max_groups=8).groups] == ["b"]


def test_submit_blocks_at_the_group_bound_until_the_trainer_takes() -> None:
    s = opened(2, "ab", max_groups=2)
    with pytest.raises(TimeoutError, match="submit"):
        s.submit("c", timeout=0.01)
    finish(s, "p")
    s.take(max_groups=1)
    s.submit("c", timeout=0)
    assert s.open_groups == 2
    with pytest.raises(ValueError, match="already submitted"):
        s.submit("a")


def test_dynamic_minibatch_waits_for_min_groups_or_for_every_open_group() -> None:
    s = opened(1, "abc", max_groups=8)
    finish(s, "p")
    with pytest.raises(TimeoutError):
        s.take(max_groups=4, min_groups=2, timeout=0.01)
    finish(s, "p")
    assert len(s.take(max_groups=4, min_groups=2).groups) == 2
    finish(s, "p")  # c is the only open group: min_groups=2 cannot be met, so it comes alone
    assert len(s.take(max_groups=4, min_groups=2).groups) == 1


def test_on_policy_drops_and_regenerates_stale_samples_and_never_delivers_them() -> None:
    s = opened(2, "ab", max_groups=4)
    ticket = s.claim("p0", timeout=0)
    assert s.put("p0", record("a/0", 0))
    s.advance_version()  # new weights: a/0 is now stale, and the in-flight a/1 will be
    assert s.stats.stale_dropped == 1
    assert not s.put("p0", record(ticket.sample_ids[1], 0))
    regen = s.claim("p0", timeout=0)  # the stale ids of a, ahead of b (never claimed yet)
    assert regen.sample_ids == ("a/0", "a/1") and regen.weight_version == 1
    assert s.claim("p1", timeout=0).group_id == "b"
    for sid in regen.sample_ids + ("b/0", "b/1"):
        assert s.put("p", record(sid, 1))
    batch = s.take(max_groups=4)
    assert batch.staleness == (0, 0)
    assert {x.record.weight_version for x in batch.samples} == {1}
    assert s.stats.stale_dropped == 2 and s.stats.staleness == {0: 4}


def test_async_accepts_staleness_up_to_k_and_evicts_beyond() -> None:
    s = opened(1, "ab", max_groups=4, mode=StreamMode.ASYNC, max_staleness=1)
    assert finish(s, "p", version=0) == [True]
    s.advance_version()
    assert finish(s, "p", version=0) == [True]  # one version old: within k = 1
    s.advance_version()  # both are now two versions old: dropped and queued again
    assert s.stats.stale_dropped == 2
    with pytest.raises(TimeoutError):
        s.take(max_groups=2, timeout=0.01)
    finish(s, "p")
    s.advance_version()
    finish(s, "p")
    assert s.take(max_groups=2).staleness == (1, 0)
    with pytest.raises(ValueError, match="staleness 0 is on-policy"):
        SampleStream(1, 1, mode=StreamMode.ASYNC, max_staleness=0)


def test_dead_producer_ids_are_requeued_first_and_a_late_zombie_sample_counts_once() -> None:
    s = opened(3, "ab", max_groups=4)
    lost = s.claim("dead", timeout=0)
    assert s.put("dead", record("a/0", 0))
    assert s.producer_lost("dead") == ["a/1", "a/2"]
    assert s.claim("p1", timeout=0).sample_ids == ("a/1", "a/2")  # ahead of b
    assert s.put("dead", record(lost.sample_ids[1], 0))  # the zombie finishes a/1 after all
    assert not s.put("p1", record("a/1", 0))  # ... so p1's copy is the duplicate
    assert s.put("p1", record("a/2", 0))
    assert not s.put("dead", record("a/0", 0))
    assert [x.record.sample_id for x in s.take(max_groups=1).samples] == ["a/0", "a/1", "a/2"]
    assert not s.put("dead", record("a/2", 0))  # after delivery: still a duplicate
    assert s.stats.duplicates == 3 and s.stats.requeued_lost == 2


def test_bad_puts_fail_clearly_and_close_wakes_waiters() -> None:
    s = SampleStream(group_size=2, max_groups=2)
    with pytest.raises(ValueError, match="belongs to no open group"):
        s.put("p", record("nope/0", 0))
    s.submit("a")
    with pytest.raises(ValueError, match="call advance_version"):
        s.put("p", record("a/0", 3))
    errors = []
    waiter = threading.Thread(target=lambda: errors.append(pytest.raises(StreamClosed, s.take, 1)))
    waiter.start()
    s.close()
    waiter.join(5)
    assert not waiter.is_alive() and len(errors) == 1


def test_sample_seed_depends_on_the_sample_id_only() -> None:
    assert sample_seed(0, "a/1") == sample_seed(0, "a/1") == 4064464414
    assert len({sample_seed(0, "a/1"), sample_seed(1, "a/1"), sample_seed(0, "a/2")}) == 3


# -- property-style: random interleavings of every event, checked against the guarantees ---------


@dataclass
class Producer:
    name: str
    work: list[tuple[str, int]] = field(default_factory=list)  # (sample id, engine weight version)


def run_random_schedule(seed: int, mode: StreamMode, k: int = 1, groups: int = 30,
                        group_size: int = 4) -> tuple[SampleStream, list[MiniBatch]]:
    """Drive one stream through a seeded random interleaving of submits, claims, puts (some
    lagging behind the weights), duplicate puts, producer deaths with zombie puts, version
    advances and takes, until every group is delivered."""
    rng = random.Random(seed)
    s = SampleStream(group_size, max_groups=6, mode=mode, max_staleness=k)
    alive = [Producer(f"p{i}") for i in range(3)]
    zombies: list[Producer] = []
    accepted: list[SampleRecord] = []
    batches: list[MiniBatch] = []
    submitted = 0
    for _ in range(200_000):
        if sum(len(b.samples) for b in batches) == groups * group_size:
            return s, batches
        action = rng.choice(["submit", "claim", "put", "put", "put", "dup", "kill", "zombie",
                             "advance", "take"])
        if action == "submit" and submitted < groups and s.open_groups < s.max_groups:
            s.submit(f"g{submitted}")
            submitted += 1
        elif action == "claim":
            p = rng.choice(alive)
            try:
                ticket = s.claim(p.name, timeout=0)
            except TimeoutError:
                continue
            lag = rng.choice([0, 0, 0, 1, k + 1]) if mode is StreamMode.ASYNC else 0
            p.work += [(sid, max(ticket.weight_version - lag, 0)) for sid in ticket.sample_ids]
        elif action in ("put", "zombie"):
            pool = [p for p in (alive if action == "put" else zombies) if p.work]
            if pool:
                p = rng.choice(pool)
                sid, version = p.work.pop(rng.randrange(len(p.work)))
                rec = SampleRecord(sid, sid.rpartition("/")[0], 5, rng.randint(1, 99), version)
                if s.put(p.name, rec):
                    accepted.append(rec)
        elif action == "dup" and accepted:
            assert not s.put("dup", rng.choice(accepted))
        elif action == "kill" and rng.random() < 0.2:
            victim = alive.pop(rng.randrange(len(alive)))
            s.producer_lost(victim.name)
            zombies.append(victim)
            alive.append(Producer(f"{victim.name}'"))
        elif action == "advance" and rng.random() < 0.3:
            s.advance_version()
        elif action == "take":
            try:
                batches.append(s.take(max_groups=rng.randint(1, 3), timeout=0))
            except TimeoutError:
                pass
    raise AssertionError(f"seed {seed}: the stream did not drain (livelock)")


@pytest.mark.parametrize("mode", [StreamMode.ON_POLICY, StreamMode.ASYNC])
@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_lose_nothing_duplicate_nothing_split_nothing_and_respect_staleness(
        seed: int, mode: StreamMode) -> None:
    groups, group_size, k = 30, 4, 1
    s, batches = run_random_schedule(seed, mode, k, groups, group_size)
    delivered = [x.record.sample_id for b in batches for x in b.samples]
    expected = {sample_id(f"g{g}", i) for g in range(groups) for i in range(group_size)}
    assert len(delivered) == len(set(delivered)) and set(delivered) == expected  # no loss, no dup
    bound = 0 if mode is StreamMode.ON_POLICY else k
    for b in batches:
        for g in b.groups:
            assert [x.record.sample_id for x in g] == [sample_id(g[0].record.group_id, i)
                                                      for i in range(group_size)]  # never split
            assert all(0 <= b.version - x.record.weight_version <= bound for x in g)
    assert s.stats.delivered == len(delivered) and sum(s.stats.staleness.values()) == len(delivered)
    assert max(s.stats.staleness) <= bound


def test_the_same_seed_gives_the_same_deliveries() -> None:
    def log(seed: int) -> list[tuple[int, tuple[tuple[str, int, int], ...]]]:
        _, batches = run_random_schedule(seed, StreamMode.ASYNC)
        return [(b.version, tuple((x.record.sample_id, x.record.weight_version, x.record.response_len)
                                  for x in b.samples)) for b in batches]

    assert log(7) == log(7)
    assert log(7) != log(8)


def test_threaded_producers_with_a_crash_deliver_every_sample_once() -> None:
    """Real threads: four producers (one crashes mid-group and is replaced), one trainer."""
    groups, group_size = 40, 4
    s = SampleStream(group_size, max_groups=5)
    crashed, first_claim = threading.Event(), threading.Event()

    def produce(name: str, crash_after: int | None) -> None:
        done = 0
        while True:
            try:
                ticket = s.claim(name, timeout=10)
            except StreamClosed:
                return
            first_claim.set()
            for sid in ticket.sample_ids:
                if crash_after is not None and done == crash_after:
                    crashed.set()
                    return  # dies holding the rest of its ticket
                s.put(name, record(sid, ticket.weight_version))
                done += 1

    # The crashing producer claims first, so that it crashes mid-group however threads are
    # scheduled on a busy machine; the others start once it holds work.
    threads = [threading.Thread(target=produce, args=("p0", 2))]
    threads[0].start()
    received: list[str] = []

    def train() -> None:
        while len(received) < groups * group_size:
            received.extend(x.record.sample_id for x in s.take(max_groups=3, timeout=10).samples)

    workers = [threading.Thread(target=train),
               threading.Thread(target=lambda: [s.submit(f"g{g}", timeout=10) for g in range(groups)])]
    for t in workers:
        t.start()
    assert first_claim.wait(10)
    threads += [threading.Thread(target=produce, args=(f"p{i}", None)) for i in range(1, 4)]
    for t in threads[1:]:
        t.start()
    assert crashed.wait(10)
    s.producer_lost("p0")  # what the adapter does when Ray reports the actor dead
    threads.append(threading.Thread(target=produce, args=("p0'", None)))
    threads[-1].start()
    for t in workers:
        t.join(30)
    s.close()
    for t in threads:
        t.join(10)
    trainer = workers[0]
    assert crashed.is_set() and not trainer.is_alive()
    assert sorted(received) == sorted(sample_id(f"g{g}", i) for g in range(groups) for i in range(group_size))


# -- config -------------------------------------------------------------------------------------


def test_config_validates_options() -> None:
    c = build_config([Setting("stream_generation.mode", "async", "test"),
                      Setting("stream_generation.max_staleness", 2, "test")]).stream_generation
    assert (c.mode, c.max_staleness, c.skewness_dispatch) == ("async", 2, True)
    with pytest.raises(ConfigError, match="unknown rlweave.stream_generation.mode 'offline'; allowed: on_policy, async"):
        build_config([Setting("stream_generation.mode", "offline", "test")])
    with pytest.raises(ConfigError, match="max_staleness'; allowed: >= 1"):
        build_config([Setting("stream_generation.max_staleness", 0, "test")])
    with pytest.raises(ConfigError, match="ranker_decay'; allowed: in \\(0, 1\\]"):
        build_config([Setting("stream_generation.ranker_decay", 1.5, "test")])
    with pytest.raises(ConfigError, match="long_tail_fraction'; allowed: in \\(0, 1\\]"):
        build_config([Setting("stream_generation.long_tail_fraction", 0, "test")])
    with pytest.raises(ConfigError, match="poll_s'; allowed: in \\(0, 10\\] seconds"):
        build_config([Setting("stream_generation.poll_s", 0, "test")])
    assert build_config([Setting("stream_generation.enable", True, "test")]).stream_generation.enable


@pytest.mark.parametrize(("ready_due", "ready_other", "pending_due", "most", "expected"), [
    (0, 6, 0, 8, 6),  # nothing due: every ready group, in whole mini-batches
    (0, 7, 0, 8, 6),
    (2, 6, 0, 8, 8),  # due groups first, then the rest up to the step's remaining groups
    (0, 6, 3, 8, 4),  # 3 due still generating: 4 slots (two mini-batches) kept for them
    (1, 6, 1, 2, 0),  # the step's last mini-batch is the two due groups: wait for the second
    (1, 6, 1, 8, 6),  # ... or take 6 newer ones now, leaving that mini-batch
    (0, 8, 8, 8, 0),  # the whole rest of the step is due: newer groups must wait
    (3, 0, 9, 2, 2),  # more due than the step holds: the ready due ones, up to the step
])
def test_a_dynamic_batch_keeps_room_for_the_groups_due_this_step(ready_due, ready_other, pending_due, most,
                                                                 expected):
    assert groups_to_take(ready_due, ready_other, pending_due, minibatch=2, most=most) == expected


def test_the_plugin_sizes_dynamic_batches_through_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGIN_MODULES_ENV, "rlweave.plugins.stream_generation.plugin")
    monkeypatch.setenv("RLWEAVE_LOAD_PLUGINS", "")
    hook = build_plugin_manager(build_config([Setting("stream_generation.mode", "async", "test")])).hook
    assert hook.rlweave_dynamic_batch(ready_due=0, ready_other=6, pending_due=3, minibatch=2, most=8) == 4
