"""The resilience monitor's authenticated channel: who may speak to it, and to its senders.

The monitor acts on what it receives (it signals the processes that beats name), so a datagram
counts only if it proves it comes from this job: every one carries an HMAC-SHA256 (the standard
library's :mod:`hmac`) over its whole payload, which holds the job id, the sender's id, the
receiver's id, a sequence number, the sending time and the body. The key is a per-job secret the
monitor draws (:meth:`Channel.new`) and hands to workers the way it hands them its address (Ray's
internal KV, then the environment for child processes), never on a command line or in a log.

What is dropped, and counted by reason (:data:`DROP_REASONS`): a datagram too long, one not in
this format or with a wrong MAC, one sealed for another job or another receiver, one older than
:data:`FRESH_S` (or as far in the future), one whose sequence number its sender already used (a
replay), one over its origin's rate, and one from a new sender once :data:`MAX_SENDERS` senders
are remembered. The checks run cheapest first, so a flood of junk costs a length test, a prefix
test or a rate test per datagram, and memory stays bounded (the rate table is cleared when full).

Wire format: ``MAGIC | MAC (32 bytes) | payload``, MAC = HMAC-SHA256(key, MAGIC | payload), the
payload a fixed header (sequence number, sending time, and the lengths of the job, sender and
receiver ids, :data:`HEADER`), those three ids, and the body as JSON. Only the body is JSON: the
header is read with one ``struct`` call and the ids are compared as bytes, and each end keys its
HMAC once and copies the keyed state per datagram, so that a beat's seal and check cost little
beyond the JSON the beat paid before it was sealed.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

KEY_ENV = "RLWEAVE_MONITOR_KEY"  # the job's secret, hex (exported to child processes, never logged)
JOB_ENV = "RLWEAVE_MONITOR_JOB"
MONITOR = "monitor"  # the monitor's id on the channel (every other end draws a random one)
MAGIC = b"RLW2"  # the payload format's version: RLW1's was a JSON object throughout
HEADER = struct.Struct("!QdBBB")  # seq, sending time, len(job), len(from), len(to)
MAC_BYTES = hashlib.sha256().digest_size
MAX_DATAGRAM = 60_000
FRESH_S = 30.0  # how old (or how far ahead, between two nodes' clocks) a datagram may be
MAX_SENDERS = 4096  # senders whose sequence numbers are remembered (each for FRESH_S after its last)
WINDOW = 64  # how far behind a sender's highest sequence number one may arrive (reordered)
WINDOW_MASK = (1 << WINDOW) - 1
RATE_PER_S, BURST = 200.0, 400.0  # datagrams per origin: a worker beats a few times a second
MAX_ORIGINS = 1024
DROP_REASONS = ("oversize", "unsigned", "bad_mac", "malformed", "foreign_job", "not_for_us", "stale",
                "replayed", "rate", "too_many_senders")


class Rejected(Exception):
    """A datagram that does not count; ``reason`` is one of :data:`DROP_REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Opened:
    """A datagram that proved its origin: who sent it, its sequence number and time, its body."""

    sender: str
    seq: int
    time_s: float
    body: dict[str, Any]


class Channel:
    """One end of a job's channel: the job id, the job's key, this end's id and its sequence."""

    def __init__(self, job: str, key: bytes, name: str | None = None) -> None:
        if len(key) < 16:
            raise ValueError("the resilience channel's key must be at least 16 bytes")
        self.job, self._key = job, key
        self.name = name or secrets.token_hex(8)
        self._job, self._name = _id_bytes(job, "job id"), _id_bytes(self.name, "end's id")
        self._keyed = hmac.new(key, MAGIC, hashlib.sha256)  # copied per datagram: the key is set up once
        self._seq = itertools.count(1)  # next() is atomic under the GIL: threads seal concurrently

    @classmethod
    def new(cls, job: str) -> Channel:
        """The monitor's end, with a fresh secret for the job."""
        return cls(job, secrets.token_bytes(32), MONITOR)

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Channel | None:
        """A new end of the channel a parent process exported (:meth:`export`), if it did."""
        env = os.environ if environ is None else environ
        if KEY_ENV not in env or JOB_ENV not in env:
            return None
        return cls(env[JOB_ENV], bytes.fromhex(env[KEY_ENV]))

    def key_hex(self) -> str:
        return self._key.hex()

    def peer(self) -> Channel:
        """A new end of the same channel (a sender's), with an id of its own."""
        return Channel(self.job, self._key)

    def export(self) -> dict[str, str]:
        """What a child process needs to open its own end (environment variables)."""
        return {KEY_ENV: self._key.hex(), JOB_ENV: self.job}

    def seal(self, body: dict[str, Any], to: str = MONITOR) -> bytes:
        receiver = self._name if to == self.name else _id_bytes(to, "receiver's id")
        payload = b"".join((HEADER.pack(next(self._seq), time.time(), len(self._job), len(self._name), len(receiver)),
                            self._job, self._name, receiver, json.dumps(body, separators=(",", ":")).encode()))
        return MAGIC + self._mac(payload) + payload

    def open(self, data: bytes) -> Opened:
        """The datagram's content if it is sealed with this job's key for this end; else
        :class:`Rejected` (freshness and replays are :class:`ReplayGuard`'s)."""
        if len(data) > MAX_DATAGRAM:
            raise Rejected("oversize")
        if not data.startswith(MAGIC) or len(data) <= len(MAGIC) + MAC_BYTES:
            raise Rejected("unsigned")
        payload = data[len(MAGIC) + MAC_BYTES:]
        if not hmac.compare_digest(data[len(MAGIC):len(MAGIC) + MAC_BYTES], self._mac(payload)):
            raise Rejected("bad_mac")
        try:
            seq, sent, n_job, n_from, n_to = HEADER.unpack_from(payload)
            at = HEADER.size
            job, sender = payload[at:at + n_job], payload[at + n_job:at + n_job + n_from]
            to = payload[at + n_job + n_from:at + n_job + n_from + n_to]
            body = json.loads(payload[at + n_job + n_from + n_to:])
            sender_id = sender.decode()
        except (struct.error, ValueError):  # a short header, bad UTF-8, bad JSON
            raise Rejected("malformed") from None
        if job != self._job:
            raise Rejected("foreign_job")
        if to != self._name:
            raise Rejected("not_for_us")
        if not isinstance(body, dict) or sent != sent:  # NaN: no age can be told
            raise Rejected("malformed")
        return Opened(sender_id, seq, sent, body)

    def _mac(self, payload: bytes) -> bytes:
        keyed = self._keyed.copy()
        keyed.update(payload)
        return keyed.digest()


def _id_bytes(text: str, what: str) -> bytes:
    """An id as the header carries it: UTF-8, at most 255 bytes (its length is one byte)."""
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"the resilience channel's {what} is {len(raw)} bytes long; at most 255 fit its header")
    return raw


class ReplayGuard:
    """Accepts each sender's sequence numbers once, within :data:`FRESH_S`.

    A sender's threads seal and send concurrently, and a network may reorder, so a number below
    the highest seen is accepted once if it is among the :data:`WINDOW` before it (a bit mask,
    as IPsec's anti-replay window). A sender is remembered for :data:`FRESH_S` after its newest
    datagram, so a copy of any of its datagrams is either older than that (stale) or finds its
    number used or out of the window (replayed)."""

    def __init__(self, max_senders: int = MAX_SENDERS) -> None:
        self.max_senders = max_senders
        self.newest: dict[str, tuple[int, int, float]] = {}  # sender -> (highest seq, seen mask, its time)

    def check(self, opened: Opened, now_s: float) -> None:
        if abs(now_s - opened.time_s) > FRESH_S:
            raise Rejected("stale")
        seen = self.newest.get(opened.sender)
        if seen is None:
            if len(self.newest) >= self.max_senders:
                self.newest = {s: v for s, v in self.newest.items() if now_s - v[2] <= FRESH_S}
                if len(self.newest) >= self.max_senders:
                    raise Rejected("too_many_senders")
            self.newest[opened.sender] = (opened.seq, 1, opened.time_s)
            return
        highest, mask, when = seen
        behind = highest - opened.seq
        if behind < 0:  # the newest: bit 0 is always the highest number
            self.newest[opened.sender] = (opened.seq, ((mask << -behind) | 1) & WINDOW_MASK, opened.time_s)
        elif behind >= WINDOW or mask >> behind & 1:
            raise Rejected("replayed")
        else:
            self.newest[opened.sender] = (highest, mask | 1 << behind, when)


class RateLimit:
    """A token bucket per origin address; the table is cleared when it holds
    :data:`MAX_ORIGINS` (a flood from many addresses then costs a new bucket each, no memory)."""

    def __init__(self, rate_per_s: float = RATE_PER_S, burst: float = BURST) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.buckets: dict[Any, tuple[float, float]] = {}  # origin -> (tokens, when counted)

    def allow(self, origin: Any, now: float) -> bool:
        tokens, then = self.buckets.get(origin, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate_per_s)
        if origin not in self.buckets and len(self.buckets) >= MAX_ORIGINS:
            self.buckets.clear()
        self.buckets[origin] = (tokens - 1.0, now) if tokens >= 1.0 else (tokens, now)
        return tokens >= 1.0
